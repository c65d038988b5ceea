"""LAS that counts the capacity a placement strands as host time, beside the host time it extends.

LAS's temporal cost (LAVA paper, section 4.2) is the bucket of
dT = max(vm_exit - host_exit, 0): the host time a placement adds by keeping
its host busy after the host would have emptied. It knows nothing of the
shape a placement leaves, so a host that outlives the VM wins even when the
VM leaves it a fragment no request of the pool's mix can use; on Azure
shapes where hosts can strand, learned LAS strands two to three times Best
Fit's CPU that way and gives back its gain in empty hosts. In Borg, LAS sits
above a waste-minimising packing score; our Best Fit has no notion of waste.

This score adds the other host time a placement costs, under the same
buckets. While the VM shares its host, it leaves the host a fraction ``a``
of its capacity stranded (``waste.py``: the added waste of the pool's
request mix, as a fraction of the host averaged over the resources Best Fit
weighs); once the host would have emptied, it keeps the whole host. For a
VM of remaining life q on a host of remaining life r:

    host time = max(q - r, 0)  +  w * a * min(q, r)

and the cost is the LAS bucket of that host time, in expectation over the
same quantiles LAS takes (the VM's and, with ``host_quantiles``, the
host's), as counts of (quantile, bucket bound) pairs exactly as LAS counts
them. A host the placement strands nothing on (a <= 0, repairs included)
costs exactly its LAS cost; a host it strands on costs the larger of its LAS
cost and the count above.

At w = 1 a fraction of a host held for an hour is that fraction of a
host-hour. That undercounts: a fragment also blocks the requests that would
have used the rest of the host, and the mix's fill is an estimate. The
default w = 8 was chosen on the placement matrix by its worst cell
(``benchmarks/placement_matrix.py``; docs/results.md): below it learned LAS
strands up to twice Best Fit's CPU on hosts that can strand, above it the
gain in empty hosts falls.

Departure from the paper: LAS stays a lexicographic level above Best Fit, but
the level's cost is no longer dT alone. The lifetime scan keeps LAS's
decision whenever every host it tied on strands nothing more by this count
(``ties_keep_cost``); otherwise ``stranding_scan`` decides in one compiled
pass. Both give the pipeline's decision with this score
(``lifetime_policy.LifetimePolicy.place``; a test holds them equal).
"""

from __future__ import annotations

import numba
import numpy as np

from lavad.daemon.cluster import FIT_TOLERANCE, N_RESOURCES, ClusterState, FloatArray
from lavad.daemon.placement.framework import PlacementRequest
from lavad.daemon.placement.kernels import _bestfit_score, _fits, _las_cost
from lavad.daemon.placement.lifetime import (
    LAS_BUCKETS_S,
    LasTemporalCost,
    LifetimeTracker,
    Prediction,
)
from lavad.daemon.placement.waste import RequestMix, _added_waste, _present_weights, waste_costs
from lavad.models.lifetime.grouped import MAX_CACHED_KEYS


@numba.njit(cache=True, nogil=True)
def _host_time_count(
    quantiles: FloatArray,
    exits: FloatArray,
    host: int,
    now: float,
    stranded: float,
    buckets: FloatArray,
) -> float:
    """Sum over (VM quantile q, host remaining life r) of the LAS bucket of
    max(q - r, 0) + stranded * min(q, r): LAS's count with the stranded host time added.

    ``exits[host]`` are the host's exit times (its quantiles, or its point
    exit); r = max(exit, now) - now, as LAS takes it.
    """
    n_buckets = len(buckets)
    count = 0
    for j in range(exits.shape[1]):
        r = max(exits[host, j], now) - now
        for k in range(len(quantiles)):
            q = quantiles[k]
            held = max(q - r, 0.0) + stranded * min(q, r)
            b = 1
            while b < n_buckets and buckets[b] <= held:
                b += 1
            count += b - 1
    return float(count)


@numba.njit(cache=True, nogil=True, inline="always")
def _strands_count(
    added: float,
    total: float,
    weight: float,
    quantiles: FloatArray,
    exits: FloatArray,
    host: int,
    now: float,
) -> float:
    """``_host_time_count`` for a placement adding ``added`` waste (of ``total``
    weighed resources), or -1 when it strands nothing more (or the host is unfit)."""
    if added == np.inf or not added > 0.0:
        return -1.0
    stranded = weight * min(added / total, 1.0)
    return _host_time_count(quantiles, exits, host, now, stranded, LAS_BUCKETS_S)


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
    exits: FloatArray,
    now: float,
    weight: float,
    las: FloatArray,
    scratch: FloatArray,
) -> None:
    """Raise ``las[h]`` (each fitting host's LAS count) to its count with stranded host time
    (the stranded fraction times ``weight``)."""
    used = _present_weights(weights, present)
    total = used.sum()
    if total <= 0.0:
        return
    waste_costs(
        free, inv_capacity, unschedulable, n_hosts, demand, used, mean, minimal, FIT_TOLERANCE,
        scratch,
    )  # fmt: skip
    for h in range(n_hosts):
        # Unfit hosts (inf) are the filters' business.
        las[h] = max(las[h], _strands_count(scratch[h], total, weight, quantiles, exits, h, now))


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
    exits: FloatArray,
    now: float,
    weight: float,
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
        if _strands_count(added, total, weight, quantiles, exits, h, now) > cost:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def stranding_scan(
    free: FloatArray,
    inv_capacity: FloatArray,
    unschedulable: np.ndarray,
    present: np.ndarray,
    n: int,
    demand: FloatArray,
    bestfit_weights: FloatArray,
    waste_weights: FloatArray,
    preference: FloatArray,
    use_preference: bool,
    host_exit: FloatArray,
    now: float,
    lifetime: float,
    thresholds: FloatArray,
    use_thresholds: bool,
    host_q: FloatArray,
    use_host_q: bool,
    mean: FloatArray,
    minimal: FloatArray,
    quantiles: FloatArray,
    exits: FloatArray,
    weight: float,
    ties: np.ndarray,
    probe: int,
) -> tuple[int, float, float, float]:
    """The pipeline's decision with this score, in one pass: lexicographic in
    (preference, LAS cost raised by stranded host time, Best Fit), each host
    costed as ``kernels._floored_lifetime_scan`` costs it. ``probe`` (a host
    that fits, or -1) is costed first: the best costs no more, so a host
    whose preference or LAS cost alone is already above it, or above the
    best so far, is skipped (its count can only raise its cost). Which host
    is probed changes only the speed. Returns (count, best preference, best
    cost, best Best Fit score) and the tied hosts, ascending, in ``ties``.
    """
    d0 = demand[0]
    d1 = demand[1]
    d2 = demand[2]
    d3 = demand[3]
    w0 = bestfit_weights[0] if present[0] else 0.0
    w1 = bestfit_weights[1] if present[1] else 0.0
    w2 = bestfit_weights[2] if present[2] else 0.0
    w3 = bestfit_weights[3] if present[3] else 0.0
    used = _present_weights(waste_weights, present)
    total = used.sum()
    zero = np.zeros(free.shape[0])
    start = now + lifetime
    best_p = np.inf
    best_c = np.inf
    best_s = np.inf
    count = 0
    # The probe's (preference, cost): an upper bound on the best's.
    bound_p = np.inf
    bound_c = np.inf
    if (
        0 <= probe < n
        and not unschedulable[probe]
        and _fits(free, probe, d0, d1, d2, d3, FIT_TOLERANCE)
    ):
        bound_p = preference[probe] if use_preference else 0.0
        bound_c = _las_cost(
            probe, host_exit, now, start, thresholds, use_thresholds, LAS_BUCKETS_S, host_q,
            use_host_q, np.inf,
        )  # fmt: skip
        if total > 0.0:
            added = _added_waste(
                free, probe, demand, zero, inv_capacity, used, mean, minimal, FIT_TOLERANCE
            )
            bound_c = max(
                bound_c, _strands_count(added, total, weight, quantiles, exits, probe, now)
            )
    for h in range(n):
        if unschedulable[h] or not _fits(free, h, d0, d1, d2, d3, FIT_TOLERANCE):
            continue
        p = preference[h] if use_preference else 0.0
        if p > best_p or p > bound_p:
            continue
        cap = best_c if p == best_p else np.inf
        if p == bound_p and bound_c < cap:
            cap = bound_c
        c = _las_cost(
            h, host_exit, now, start, thresholds, use_thresholds, LAS_BUCKETS_S, host_q,
            use_host_q, cap,
        )  # fmt: skip
        if c > cap:
            continue
        if total > 0.0:
            added = _added_waste(
                free, h, demand, zero, inv_capacity, used, mean, minimal, FIT_TOLERANCE
            )
            c = max(c, _strands_count(added, total, weight, quantiles, exits, h, now))
            if c > cap:
                continue
        score = _bestfit_score(free, inv_capacity, h, d0, d1, d2, d3, w0, w1, w2, w3)
        if p < best_p or c < best_c or score < best_s:
            best_p = p
            best_c = c
            best_s = score
            ties[0] = h
            count = 1
        elif score == best_s:
            ties[count] = h
            count += 1
    return count, best_p, best_c, best_s


def warm_up_stranding() -> None:
    """Compile (or load from numba's cache) before the first placement is timed."""
    free = np.ones((N_RESOURCES, 1))
    present = np.ones(N_RESOURCES, dtype=np.bool_)
    args = (np.zeros(N_RESOURCES), np.ones(N_RESOURCES), np.ones(N_RESOURCES))
    minimal = np.zeros((1, N_RESOURCES))
    quantiles = np.ones(1)
    exits = np.ones((1, 1))
    hosts = np.zeros(1, dtype=np.int64)
    stranding_costs(
        free, free, np.zeros(1, dtype=np.bool_), present, 1, *args, minimal, quantiles,
        exits, 0.0, 1.0, np.zeros(1), np.zeros(1),
    )  # fmt: skip
    stranding_scan(
        free, free, np.zeros(1, dtype=np.bool_), present, 1, args[0], args[1], args[1],
        np.zeros(1),
        False, np.zeros(1), 0.0, 1.0, np.zeros(0), False, np.zeros((0, 0)), False, args[2],
        minimal, quantiles, exits, 1.0, hosts, -1,
    )  # fmt: skip
    ties_keep_cost(
        free, free, present, hosts, 1, *args, minimal, quantiles, exits, 0.0, 1.0, 0.0,
    )  # fmt: skip


_NOTHING: FloatArray = np.zeros(0)
_NO_QUANTILES: FloatArray = np.zeros((0, 0))


class LasStrandingCost(LasTemporalCost):
    """LAS's bucketed host time, counting the host time a placement strands as well.

    Keeps the pool's request mix (``RequestMix``, as the stranding metric
    keeps it) from every request it scores, each once. With no mix yet (the
    pool's first request) nothing is known to strand and it is LAS.
    """

    name = "las"

    def __init__(
        self, tracker: LifetimeTracker, mix: RequestMix, weights: FloatArray, weight: float = 1.0
    ) -> None:
        if not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight}")
        super().__init__(tracker)
        self.weight = weight
        self.mix = mix
        self.weights = np.ascontiguousarray(weights, dtype=np.float64)
        self._demand = np.zeros(N_RESOURCES)
        self._scratch: FloatArray = np.zeros(0)
        self._last_seen: tuple[str, float] | None = None
        # The tracker's settings are fixed: whether LAS costs hosts by their quantiles.
        self._by_host_quantiles = tracker.uses_host_quantiles
        # Per distribution row: the thresholds its quantiles were taken with, and them.
        self._by_row: dict[int, tuple[FloatArray, FloatArray]] = {}
        warm_up_stranding()

    def _quantiles(self, request: PlacementRequest, prediction: Prediction) -> FloatArray:
        """``tracker.vm_quantiles`` for ``request`` (whose prediction is ``prediction``),
        kept per distribution row while its thresholds are the tracker's (a new VM's
        quantiles change only when its row's table does)."""
        tracker = self.tracker
        if prediction.thresholds is None or tracker.is_running(request.vm_id):
            # A point lifetime (its own per VM with the oracle), or a VM being
            # moved (its quantiles depend on its uptime).
            return tracker.vm_quantiles(request)
        kept = self._by_row.get(prediction.row)
        if kept is not None and kept[0] is prediction.thresholds:
            return kept[1]
        quantiles = tracker.vm_quantiles(request)
        if len(self._by_row) >= MAX_CACHED_KEYS:
            self._by_row.clear()
        self._by_row[prediction.row] = (prediction.thresholds, quantiles)
        return quantiles

    def observe(self, request: PlacementRequest) -> None:
        """Count ``request`` in the mix once, whichever path (scan, pipeline) scores it."""
        seen = (request.vm_id, request.now)
        if seen != self._last_seen:
            self._last_seen = seen
            self.mix.add(request.demand)

    def _exits(self, cluster: ClusterState) -> FloatArray:
        """Per host, its exit times as LAS costs it: (hosts, H) quantiles, or (hosts, 1)
        the point exit (a host without VMs: -inf; the kernels clip at now).

        Called right after LAS costed every host (the scan, or LAS's own
        score), which brought each host's quantiles up to date.
        """
        tracker = self.tracker
        n = cluster.n_hosts
        if self._by_host_quantiles:
            return tracker.current_exit_quantiles(n)
        exits: FloatArray = tracker.latest_exits(n).reshape(-1, 1)
        return exits

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
            self._quantiles(request, self.tracker.prediction_for(request)),
            self._exits(cluster),
            now,
            self.weight,
            out,
            self._scratch,
        )

    def ties_stand(
        self,
        cluster: ClusterState,
        request: PlacementRequest,
        prediction: Prediction,
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
                self._quantiles(request, prediction),
                self._exits(cluster),
                request.now,
                self.weight,
                cost,
            )
        )

    def rescan(
        self,
        cluster: ClusterState,
        request: PlacementRequest,
        bestfit_weights: FloatArray,
        preference: FloatArray | None,
        host_exit: FloatArray,
        prediction: Prediction,
        ties: np.ndarray,
    ) -> tuple[int, float, float, float]:
        """``stranding_scan`` for ``request`` after LAS's scan costed every host
        (its quantiles are current): the decision the pipeline would make."""
        tracker = self.tracker
        thresholds = prediction.thresholds
        use_host_q = thresholds is not None and self._by_host_quantiles
        n = cluster.n_hosts
        return stranding_scan(
            cluster.free,
            cluster.inv_capacity,
            cluster.unschedulable,
            cluster.resource_present,
            n,
            self._demand,
            bestfit_weights,
            self.weights,
            _NOTHING if preference is None else preference,
            preference is not None,
            host_exit,
            request.now,
            prediction.lifetime_s,
            _NOTHING if thresholds is None else thresholds,
            thresholds is not None,
            tracker.current_exit_quantiles(n) if use_host_q else _NO_QUANTILES,
            use_host_q,
            self.mix.mean,
            self.mix.minimal,
            self._quantiles(request, prediction),
            self._exits(cluster),
            self.weight,
            ties,
            int(ties[0]),
        )
