"""A host runs at most ``max_vms`` VMs, whatever they ask.

VMs may ask for nothing (the schema allows 0 of every resource), so without a
count any number of them fit one host, and every event that walks a host's VMs
(an exit of the VM holding the host's latest exit) grows with the flood. At
its limit a host stays up for migrations and metrics but takes no VM: every
policy's filters and compiled scans read that from ``unschedulable``, and
another scheduler's vm.placed on it is refused (dead-lettered live).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lavad.core.cluster import MAX_VMS_PER_HOST, ClusterState, HostState
from lavad.core.engine import Engine, EngineConfig, HostShape, PoolSetup
from lavad.core.placement.registry import REGISTRY, validate_policy_args
from lavad.daemon.live.state_codec import dumps, loads
from lavad.streams.adapters import open_trace
from lavad.streams.schema import HostUp, Placement, VmExit, VmPlaced, VmRequest

ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"
NOTHING = (0.0, 0.0, 0.0, 0.0)


def _cluster(max_vms: int) -> ClusterState:
    cluster = ClusterState(max_vms=max_vms)
    cluster.add_host("h0", (8.0, 32.0, 0.0, 0.0))
    return cluster


def test_a_host_at_its_limit_takes_no_vm_until_one_leaves() -> None:
    """Worked by hand, max_vms = 2: (up, VMs) -> (schedulable, unschedulable).

    (up, 0) -> (T, F); (up, 1) -> (T, F); (up, 2) -> (T, T): full, still up;
    one leaves: (up, 1) -> (T, F).
    """
    cluster = _cluster(2)
    seen = [(bool(cluster.schedulable[0]), bool(cluster.unschedulable[0]))]
    for vm in ("a", "b"):
        cluster.book(vm, 0, NOTHING, "", 0.0)
        seen.append((bool(cluster.schedulable[0]), bool(cluster.unschedulable[0])))
    cluster.release("a")
    seen.append((bool(cluster.schedulable[0]), bool(cluster.unschedulable[0])))
    assert seen == [(True, False), (True, False), (True, True), (True, False)]


def test_draining_and_the_limit_each_keep_the_host_closed() -> None:
    """A full host that drains stays closed when a VM leaves (it drains); one that
    comes back from draining at its limit stays closed (it is full)."""
    cluster = _cluster(2)
    cluster.book("a", 0, NOTHING, "", 0.0)
    cluster.book("b", 0, NOTHING, "", 0.0)
    cluster.drain_host("h0")
    cluster.release("a")
    assert cluster.state[0] == HostState.DRAINING and cluster.unschedulable[0]
    cluster.book("c", 0, NOTHING, "", 0.0)  # another scheduler's VM, as shadow mode books it
    cluster.undrain_host("h0")
    assert cluster.schedulable[0] and cluster.unschedulable[0]
    cluster.release("b")
    assert not cluster.unschedulable[0]


@pytest.mark.parametrize("max_vms", [0, -1, 2.5, True])
def test_a_limit_below_one_or_not_an_int_is_refused(max_vms: object) -> None:
    with pytest.raises(ValueError, match="max_vms"):
        ClusterState(max_vms=max_vms)  # type: ignore[arg-type]


def test_a_restored_limit_is_checked() -> None:
    cluster = _cluster(2)
    cluster.max_vms = 0
    with pytest.raises(ValueError, match="max_vms"):
        cluster.check_restored()


def _request(i: int, t: float) -> VmRequest:
    return VmRequest(time=t, pool="p", vm_id=f"v{i}", cores=0.0, memory_gib=0.0)


def _engine(policy: str, pools: PoolSetup) -> Engine:
    return Engine(
        EngineConfig(policy=policy, policy_args=validate_policy_args(policy, {}), pools=pools)
    )


# Every policy but the oracles, which need true lifetimes in the requests.
@pytest.mark.parametrize("policy", [n for n in REGISTRY.names if not n.endswith("-oracle")])
def test_a_fixed_pool_refuses_vms_of_no_demand_past_its_limit_and_may_retry(policy: str) -> None:
    """Two hosts of three VMs each: the seventh VM of no demand is refused, may
    retry, and the reason names the key; an exit makes room again."""
    engine = _engine(policy, PoolSetup(shape=HostShape(48.0, 192.0), initial_hosts=2, max_vms=3))
    placed: list[Placement] = []
    for i in range(7):
        placed += [
            d
            for d in engine.handle(_request(i, float(i)), float(i)).decisions
            if isinstance(d, Placement)
        ]
    assert [p.host_id is not None for p in placed] == [True] * 6 + [False]
    refused = placed[-1]
    assert refused.retryable and "2 at hosts.max_vms = 3 VMs" in refused.reason
    hosts = [p.host_id for p in placed[:6]]
    assert sorted(hosts.count(h) for h in set(hosts)) == [3, 3]
    engine.handle(VmExit(time=7.0, pool="p", vm_id="v0"), 7.0)
    again = engine.handle(_request(7, 8.0), 8.0).decisions
    assert [d.host_id for d in again if isinstance(d, Placement)] == [placed[0].host_id]


@pytest.mark.parametrize("policy", ["bestfit", "las"])
def test_a_flood_of_vms_of_no_demand_opens_hosts_of_the_default_limit(policy: str) -> None:
    """Grown on demand, 2,500 VMs that ask nothing: without a limit all would sit
    on the first host; with the default each host takes 1,000."""
    engine = _engine(policy, PoolSetup(shape=HostShape(48.0, 192.0), grow_on_demand=True))
    for i in range(2_500):
        engine.handle(_request(i, float(i)), float(i))
    cluster = engine.pools["p"].cluster
    counts = sorted(int(c) for c in cluster.vm_count[: cluster.n_hosts])
    assert counts == [500, MAX_VMS_PER_HOST, MAX_VMS_PER_HOST]


@pytest.mark.parametrize("policy", ["bestfit", "las", "lava"])
def test_on_the_azure_slice_no_host_passes_a_small_limit(policy: str) -> None:
    """The slice grown on demand with at most 4 VMs a host (its hosts run up to
    48): after every event no host runs more than 4, and the limit binds."""
    engine = _engine(
        policy, PoolSetup(shape=HostShape(48.0, 192.0), grow_on_demand=True, max_vms=4)
    )
    most = 0
    for event in open_trace(AZURE_SLICE, seed=0).events():
        handled = engine.handle(event, event.time)
        assert handled.rejection is None, handled.rejection
        cluster = engine.pools[event.pool].cluster
        most = max(most, int(np.max(cluster.vm_count[: cluster.n_hosts], initial=0)))
        assert most <= 4
    assert most == 4


def test_a_vm_another_scheduler_places_past_the_limit_is_refused_naming_the_key() -> None:
    """Past capacity a vm.placed is booked (the books follow reality); past the VM
    limit it is refused, to be dead-lettered, and the host's count stays at it."""
    engine = _engine("bestfit", PoolSetup(max_vms=2))
    engine.handle(HostUp(time=0.0, pool="p", host_id="h", cores=8.0, memory_gib=32.0), 0.0)
    reasons = []
    for i in range(3):
        placed = VmPlaced(time=1.0, pool="p", vm_id=f"v{i}", host_id="h", cores=0.0, memory_gib=0.0)
        rejection = engine.handle(placed, 1.0).rejection
        reasons.append(None if rejection is None else rejection.reason)
    assert reasons[:2] == [None, None]
    assert reasons[2] is not None and "hosts.max_vms = 2" in reasons[2]
    assert int(engine.pools["p"].cluster.vm_count[0]) == 2
    # Once a VM leaves, the host takes one again.
    engine.handle(VmExit(time=2.0, pool="p", vm_id="v0"), 2.0)
    again = VmPlaced(time=3.0, pool="p", vm_id="v3", host_id="h", cores=0.0, memory_gib=0.0)
    assert engine.handle(again, 3.0).rejection is None


@pytest.mark.parametrize("max_vms", [2**63 - 1, 10**23])
def test_an_absurd_limit_binds_nothing_and_survives_a_snapshot(max_vms: int) -> None:
    """Limits past any int the arrays hold compare as Python ints: nothing binds, the
    VMs that ask nothing share the one host a grown pool opens, and the limit comes
    back from a snapshot as it was."""
    engine = _engine(
        "bestfit", PoolSetup(shape=HostShape(8.0, 32.0), grow_on_demand=True, max_vms=max_vms)
    )
    for i in range(50):
        engine.handle(_request(i, float(i)), float(i))
    cluster = engine.pools["p"].cluster
    assert cluster.n_hosts == 1 and int(cluster.vm_count[0]) == 50
    assert not cluster.unschedulable[0]
    restored = loads(dumps(engine.pools))["p"].cluster
    assert restored.max_vms == max_vms
    restored.check_restored()
