"""LAS that counts the capacity a placement strands as host time, beside the host time it extends.

LAS's temporal cost (LAVA paper, section 4.2) is the bucket of
dT = max(vm_exit - host_exit, 0): the host time a placement adds by keeping
its host busy after the host would have emptied. It knows nothing of the
shape a placement leaves, so a host that outlives the VM wins even when the
VM leaves it a fragment no request of the pool's mix can use; on Azure
shapes where hosts can strand, learned LAS strands two to three times Best
Fit's CPU that way and gives back its gain in empty hosts. In Borg, LAS sits
above a waste-minimising packing score; our Best Fit has no notion of waste.

This score adds the other host time a placement costs, in the same unit and
under the same buckets. While the VM shares its host, it leaves the host a
fraction ``a`` of its capacity stranded (``waste.py``: the added waste
of the pool's request mix, as a fraction of the host averaged over the
resources Best Fit weighs); once the host would have emptied, it keeps the
whole host. For a VM of remaining life q on a host of remaining life r:

    host time = max(q - r, 0)  +  a * min(q, r)

and the cost is the LAS bucket of that host time, in expectation over the
same quantiles LAS takes (the VM's and, with ``host_quantiles``, the
host's), as counts of (quantile, bucket bound) pairs exactly as LAS counts
them. A host the placement strands nothing on (a <= 0, repairs included)
costs exactly its LAS cost; a host it strands on costs the larger of its LAS
cost and the count above. No constant trades lifetime against packing: a
fraction of a host held for an hour is that fraction of a host-hour.

Departure from the paper: LAS stays a lexicographic level above Best Fit, but
the level's cost is no longer dT alone. The fast path of the lifetime scan
keeps LAS's decision whenever every host it tied on strands nothing more by
this count, and otherwise the pipeline decides with this score; both give
the same decision (``lifetime_policy.LifetimePolicy.place``).
"""

from __future__ import annotations

import numba
import numpy as np

from lavad.daemon.cluster import FIT_TOLERANCE, N_RESOURCES, ClusterState, FloatArray
from lavad.daemon.placement.framework import PlacementRequest
from lavad.daemon.placement.lifetime import LAS_BUCKETS_S, LasTemporalCost, LifetimeTracker
from lavad.daemon.placement.waste import RequestMix, _added_waste, _present_weights, waste_costs


@numba.njit(cache=True, nogil=True)
def _host_time_count(
    quantiles: FloatArray, remaining: FloatArray, host: int, stranded: float, buckets: FloatArray
) -> float:
    """Sum over (VM quantile q, host quantile r) of the LAS bucket of
    max(q - r, 0) + stranded * min(q, r): LAS's count with the stranded host time added."""
    n_buckets = len(buckets)
    count = 0
    for j in range(remaining.shape[1]):
        r = remaining[host, j]
        for k in range(len(quantiles)):
            q = quantiles[k]
            held = max(q - r, 0.0) + stranded * min(q, r)
            b = 1
            while b < n_buckets and buckets[b] <= held:
                b += 1
            count += b - 1
    return float(count)


@numba.njit(cache=True, nogil=True)
def stranding_costs(
    free: FloatArray,
    inv_capacity: FloatArray,
    unschedulable: np.ndarray,
    present: np.ndarray,
    n_hosts: int,
    demand: FloatArray,
    weights: FloatArray,
    mean: FloatArray,
    minimal: FloatArray,
    quantiles: FloatArray,
    remaining: FloatArray,
    buckets: FloatArray,
    las: FloatArray,
    scratch: FloatArray,
) -> None:
    """Raise ``las[h]`` (each fitting host's LAS count) to its count with stranded host time."""
    used = _present_weights(weights, present)
    total = used.sum()
    if total <= 0.0:
        return
    waste_costs(
        free, inv_capacity, unschedulable, n_hosts, demand, used, mean, minimal, FIT_TOLERANCE,
        scratch,
    )  # fmt: skip
    for h in range(n_hosts):
        added = scratch[h]
        if added == np.inf or not added > 0.0:
            continue  # unfit (the filters' business), or strands nothing more
        stranded = min(added / total, 1.0)
        las[h] = max(las[h], _host_time_count(quantiles, remaining, h, stranded, buckets))


@numba.njit(cache=True, nogil=True)
def ties_keep_cost(
    free: FloatArray,
    inv_capacity: FloatArray,
    present: np.ndarray,
    hosts: np.ndarray,
    count: int,
    demand: FloatArray,
    weights: FloatArray,
    mean: FloatArray,
    minimal: FloatArray,
    quantiles: FloatArray,
    remaining: FloatArray,
    buckets: FloatArray,
    cost: float,
) -> bool:
    """Whether each of ``hosts[:count]``, all at LAS count ``cost``, stays at ``cost``."""
    used = _present_weights(weights, present)
    total = used.sum()
    if total <= 0.0:
        return True
    zero = np.zeros(free.shape[0])
    for i in range(count):
        h = hosts[i]
        added = _added_waste(
            free, h, demand, zero, inv_capacity, used, mean, minimal, FIT_TOLERANCE
        )
        if not added > 0.0:
            continue
        stranded = min(added / total, 1.0)
        if _host_time_count(quantiles, remaining, h, stranded, buckets) > cost:
            return False
    return True


def warm_up_stranding() -> None:
    """Compile (or load from numba's cache) before the first placement is timed."""
    free = np.ones((N_RESOURCES, 1))
    present = np.ones(N_RESOURCES, dtype=np.bool_)
    args = (np.zeros(N_RESOURCES), np.ones(N_RESOURCES), np.ones(N_RESOURCES))
    minimal = np.zeros((1, N_RESOURCES))
    quantiles = np.ones(1)
    remaining = np.ones((1, 1))
    stranding_costs(
        free, free, np.zeros(1, dtype=np.bool_), present, 1, *args, minimal, quantiles,
        remaining, LAS_BUCKETS_S, np.zeros(1), np.zeros(1),
    )  # fmt: skip
    ties_keep_cost(
        free, free, present, np.zeros(1, dtype=np.int64), 1, *args, minimal, quantiles,
        remaining, LAS_BUCKETS_S, 0.0,
    )  # fmt: skip


class LasStrandingCost(LasTemporalCost):
    """LAS's bucketed host time, counting the host time a placement strands as well.

    Keeps the pool's request mix (``RequestMix``, as the stranding metric
    keeps it) from every request it scores, each once. With no mix yet (the
    pool's first request) nothing is known to strand and it is LAS.
    """

    name = "las"

    def __init__(self, tracker: LifetimeTracker, mix: RequestMix, weights: FloatArray) -> None:
        super().__init__(tracker)
        self.mix = mix
        self.weights = np.ascontiguousarray(weights, dtype=np.float64)
        self._demand = np.zeros(N_RESOURCES)
        self._scratch: FloatArray = np.zeros(0)
        self._last_seen: tuple[str, float] | None = None
        warm_up_stranding()

    def observe(self, request: PlacementRequest) -> None:
        """Count ``request`` in the mix once, whichever path (scan, pipeline) scores it."""
        seen = (request.vm_id, request.now)
        if seen != self._last_seen:
            self._last_seen = seen
            self.mix.add(request.demand)

    def _remaining(self, cluster: ClusterState, now: float) -> FloatArray:
        """Per host, its remaining life as LAS costs it: (hosts, H) quantiles or (hosts, 1)."""
        tracker = self.tracker
        n = cluster.n_hosts
        if tracker.uses_host_quantiles:
            remaining: FloatArray = np.maximum(tracker.host_exit_quantiles(n), now) - now
            return remaining
        exits = tracker.host_exits(n, now, repredict=True)
        return (exits - now)[:, None]

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        self.observe(request)
        super().score(cluster, request, out, scratch)
        mix = self.mix
        if not mix.known:
            return
        n = cluster.n_hosts
        if len(self._scratch) < n:
            self._scratch = np.zeros(max(n, 2 * len(self._scratch), 64))
        demand = self._demand
        demand[:] = request.demand
        now = request.now
        stranding_costs(
            cluster.free,
            cluster.inv_capacity,
            cluster.unschedulable,
            cluster.resource_present,
            n,
            demand,
            self.weights,
            mix.mean,
            mix.minimal,
            self.tracker.vm_quantiles(request),
            np.ascontiguousarray(self._remaining(cluster, now)),
            LAS_BUCKETS_S,
            out,
            self._scratch,
        )

    def ties_stand(
        self,
        cluster: ClusterState,
        request: PlacementRequest,
        hosts: np.ndarray,
        count: int,
        cost: float,
    ) -> bool:
        """Whether LAS's tied choice ``hosts[:count]`` (LAS cost ``cost``) costs the same here."""
        mix = self.mix
        if not mix.known:
            return True
        demand = self._demand
        demand[:] = request.demand
        return bool(
            ties_keep_cost(
                cluster.free,
                cluster.inv_capacity,
                cluster.resource_present,
                hosts,
                count,
                demand,
                self.weights,
                mix.mean,
                mix.minimal,
                self.tracker.vm_quantiles(request),
                np.ascontiguousarray(self._remaining(cluster, request.now)),
                LAS_BUCKETS_S,
                cost,
            )
        )
