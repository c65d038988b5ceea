"""A throwaway policy taken through one VM's life before the first real event.

Building a policy compiles (or loads from numba's cache) the kernels of its
placement. A VM's life reaches more of them: the lifetime tracker's first
refit (host exits rebuilt, the running VMs repredicted), the model's refit
with a VM running (its censoring added), LA-Binary's compiled booking and
release, which no placement warm-up calls. Left to the stream, each compiles
where a replay or the live daemon first reaches it: on a fresh install the
first refit with a VM running, an hour of event time in, held the event
loop for about 0.6 s, and a replay counted it in the policy's time.

The rehearsal goes through the policy's own interfaces (``place``, then its
hooks' booking, timers and release), so whatever a policy's life calls is
compiled, whichever policy it is. Beyond that compiled code, it touches
nothing but the throwaway policy it is given and a pool of one host of its
own.
"""

from __future__ import annotations

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest, Policy
from lavad.streams.oracle import ORACLE_FEATURE
from lavad.streams.schema import VmRequest

# Two hours: past the tracker's hourly refit with the VM still running (the
# refit counts it as censored and repredicts it from its uptime), then it exits.
_LIFE_S = 2 * 3600.0
# A host with room for the request in every resource a policy may weigh.
_CAPACITY = (64.0, 256.0, 1024.0, 8.0)
_DEMAND = (1.0, 4.0, 0.0, 0.0)


def rehearse(policy: Policy) -> bool:
    """Take ``policy`` (a throwaway: its state changes) through one VM's life; whether
    the VM was placed, so that its booking, refits and release were rehearsed.

    Its true lifetime rides in the request's features as the replay attaches
    it, so oracle policies rehearse too. A policy configured to refuse the
    request still had its placement's kernels compiled: a warm-up that fell
    short costs a compile mid-stream, not a daemon that will not start.
    """
    cluster = ClusterState()
    cluster.add_host("rehearsal/h0", _CAPACITY)
    hooks = policy.hooks
    event = VmRequest(
        time=0.0,
        pool="rehearsal",
        vm_id="rehearsal-vm",
        cores=_DEMAND[0],
        memory_gib=_DEMAND[1],
        tenant="rehearsal",
        features={ORACLE_FEATURE: _LIFE_S, "hour_of_day": 0, "batch_size": 1},
    )
    # As the engine does: the timers due by an event's time, then the event.
    if hooks.next_deadline <= 0.0:
        hooks.advance(cluster, 0.0)
    request = PlacementRequest(event.vm_id, _DEMAND, "", None, 0.0, event)
    result = policy.place(cluster, request)
    if not isinstance(result, Placed):
        return False
    record = cluster.book(event.vm_id, result.host, _DEMAND, "", 0.0)
    hooks.on_booked(cluster, record, 0.0, event)
    if hooks.next_deadline <= _LIFE_S:
        hooks.advance(cluster, _LIFE_S)
    hooks.on_released(cluster, cluster.release(event.vm_id), _LIFE_S, exited=True)
    hooks.take_notices()
    return True
