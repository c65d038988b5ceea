"""Stranded capacity, compiled: the waste a free vector leaves for a request mix
(``waste.py`` explains the measure), and the host time a placement strands,
counted in LAS's buckets (``stranding_cost.py`` explains the score).

Both the numpy pipeline's scorers and the lifetime scan
(``lifetime_scan``, which costs a host's stranded time only once its LAS
cost alone leaves it in the running) run these. The
module imports no policy module, so the scan's kernels can call it.

The scan takes the score's inputs as one ``Stranding`` tuple: numba types
a tuple once, and one argument keeps the scan's long signature from
growing by seven.
"""

from __future__ import annotations

import numba
import numpy as np

from lavad.core.cluster import FIT_TOLERANCE, N_RESOURCES, FloatArray

# The pool's arrays the waste kernels read, passed together: the free
# capacity, its inverse capacity, which hosts are unschedulable, and which
# resources some host has (``ClusterState``'s arrays).
WastePool = tuple[FloatArray, FloatArray, np.ndarray, np.ndarray]

# How the waste of a free vector is measured, the four always passed together:
# the resources' weights, the request mix's fill directions (``waste.RequestMix``:
# row k the mean shape of the mix's shapes that ask nothing of the resources in
# bit set k) and minimal shapes, and the fit tolerance.
WasteMeasure = tuple[FloatArray, FloatArray, FloatArray, float]


@numba.njit(cache=True, nogil=True, inline="always")
def _fill_to(fill: float, left: float, mean: float) -> float:
    """The fill along a leg, bounded by one resource the leg's direction asks for."""
    return min(fill, left / mean) if mean > 0.0 else fill


@numba.njit(cache=True, nogil=True, inline="always")
def _drain(left: float, mean: float, fill: float, bit: int, ran_out: int) -> tuple[float, int]:
    """One resource after a leg of ``fill`` along ``mean``: what is left, and the set of
    resources run out with this one's ``bit`` added if it ran out. A resource that ran
    out keeps what rounding leaves of it (an ulp), so a pool whose every shape asks
    for every resource scores exactly as a single leg would."""
    if mean > 0.0:
        if left / mean <= fill:
            ran_out |= bit
        left = max(left - fill * mean, 0.0)
    return left, ran_out


@numba.njit(cache=True, nogil=True, inline="always")
def _weighed(total: float, weight: float, left: float, inv_capacity: float) -> float:
    """``total`` with one resource's stranded share added where the resource weighs."""
    return total + weight * left * inv_capacity if weight > 0.0 else total


@numba.njit(cache=True, nogil=True)
def leftover_waste(
    free: FloatArray, host: int, demand: FloatArray, inv_capacity: FloatArray, measure: WasteMeasure
) -> float:
    """Stranded capacity (Best Fit's units) of host ``host``'s free vector minus ``demand``.

    The fill follows the whole mix's mean direction until a resource runs out;
    then only the shapes that ask nothing of it still fit, and the fill goes on
    in their mean direction; and so on, at most once per resource. With every
    shape asking for every resource the mix uses (a pool of CPU and memory)
    that is the first leg alone.

    Written out over the four resources (``N_RESOURCES``) in scalars: the
    guard calls this twice for every host that fits, and an array of what is
    left, allocated and freed at each call, cost more than the measure.
    """
    weights, directions, minimal, tolerance = measure
    x0 = free[0, host] - demand[0]
    x1 = free[1, host] - demand[1]
    x2 = free[2, host] - demand[2]
    x3 = free[3, host] - demand[3]
    fits_any = False
    for m in range(minimal.shape[0]):
        if not (
            x0 < minimal[m, 0] - tolerance
            or x1 < minimal[m, 1] - tolerance
            or x2 < minimal[m, 2] - tolerance
            or x3 < minimal[m, 3] - tolerance
        ):
            fits_any = True
            break
    left0, left1, left2, left3 = max(x0, 0.0), max(x1, 0.0), max(x2, 0.0), max(x3, 0.0)
    if fits_any:
        exhausted = 0
        for _ in range(N_RESOURCES):
            m0, m1 = directions[exhausted, 0], directions[exhausted, 1]
            m2, m3 = directions[exhausted, 2], directions[exhausted, 3]
            fill = _fill_to(
                _fill_to(_fill_to(_fill_to(np.inf, left0, m0), left1, m1), left2, m2), left3, m3
            )
            if fill == np.inf:
                break  # no shape of the mix asks only for what is left
            ran_out = exhausted
            left0, ran_out = _drain(left0, m0, fill, 1, ran_out)
            left1, ran_out = _drain(left1, m1, fill, 2, ran_out)
            left2, ran_out = _drain(left2, m2, fill, 4, ran_out)
            left3, ran_out = _drain(left3, m3, fill, 8, ran_out)
            exhausted = ran_out
    total = _weighed(0.0, weights[0], left0, inv_capacity[0, host])
    total = _weighed(total, weights[1], left1, inv_capacity[1, host])
    total = _weighed(total, weights[2], left2, inv_capacity[2, host])
    total = _weighed(total, weights[3], left3, inv_capacity[3, host])
    return total


@numba.njit(cache=True, nogil=True)
def added_waste(
    free: FloatArray,
    host: int,
    demand: FloatArray,
    zero: FloatArray,
    inv_capacity: FloatArray,
    measure: WasteMeasure,
) -> float:
    """``waste(free - demand) - waste(free)`` of one host."""
    after = leftover_waste(free, host, demand, inv_capacity, measure)
    before = leftover_waste(free, host, zero, inv_capacity, measure)
    return after - before


@numba.njit(cache=True, nogil=True)
def present_weights(weights: FloatArray, present: np.ndarray) -> FloatArray:
    """The weights of the resources some host of the pool has (the others count 0)."""
    used = np.zeros(weights.shape[0])
    for r in range(weights.shape[0]):
        if present[r]:
            used[r] = weights[r]
    return used


# (the waste's resource weights, the mix's fill directions, the mix's minimal
# shapes, the VM's remaining-life quantiles, per host its exit times as LAS
# costs them (hosts, H), the LAS bucket bounds, the weight w). w = 0: nothing
# is counted.
Stranding = tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, float]


def no_stranding() -> Stranding:
    """A ``Stranding`` that counts nothing, typed as a real one is (the scan's signature)."""
    return (
        np.zeros(N_RESOURCES),
        np.zeros((1 << N_RESOURCES, N_RESOURCES)),
        np.zeros((0, N_RESOURCES)),
        np.zeros(1),
        np.zeros((0, 1)),
        np.zeros(1),
        0.0,
    )


@numba.njit(cache=True, nogil=True)
def host_time_count(
    quantiles: FloatArray,
    exits: FloatArray,
    host: int,
    now: float,
    stranded: float,
    buckets: FloatArray,
    cap: float,
) -> float:
    """Sum over (VM quantile q, host remaining life r) of the LAS bucket of
    max(q - r, 0) + stranded * min(q, r): LAS's count with the stranded host time added;
    or, as soon as the sum exceeds ``cap``, a number above ``cap``.

    ``exits[host]`` are the host's exit times (its quantiles, or its point
    exit); r = max(exit, now) - now, as LAS takes it. The host time grows
    with q (both terms do), so over ascending quantiles each bucket search
    resumes where the last stopped: one walk over the quantiles and the
    buckets per r, not a search per pair. A quantile not at or above its
    predecessor (or NaN) restarts the search, so any order gives the same
    sum; a NaN host time counts 0, as no bound is at or below it.
    """
    n_buckets = len(buckets)
    count = 0
    for j in range(exits.shape[1]):
        r = max(exits[host, j], now) - now
        b = 1
        previous = -np.inf
        for k in range(len(quantiles)):
            q = quantiles[k]
            if not q >= previous:
                b = 1
            previous = q
            held = max(q - r, 0.0) + stranded * min(q, r)
            if np.isnan(held):
                continue
            while b < n_buckets and buckets[b] <= held:
                b += 1
            count += b - 1
            if count > cap:
                return float(count)  # every term is >= 0: the host already costs more
    return float(count)


@numba.njit(cache=True, nogil=True, inline="always")
def strands_count(
    added: float,
    total: float,
    strand: Stranding,
    host: int,
    now: float,
    cap: float,
) -> float:
    """``host_time_count`` for a placement adding ``added`` waste (of ``total``
    weighed resources), or -1 when it strands nothing more (or the host is unfit)."""
    if added == np.inf or not added > 0.0:
        return -1.0
    stranded = strand[6] * min(added / total, 1.0)
    return host_time_count(strand[3], strand[4], host, now, stranded, strand[5], cap)


@numba.njit(cache=True, nogil=True, inline="always")
def host_strand_count(
    free: FloatArray,
    inv_capacity: FloatArray,
    host: int,
    demand: FloatArray,
    zero: FloatArray,
    used: FloatArray,
    total: float,
    strand: Stranding,
    now: float,
    cap: float,
) -> float:
    """Host ``host``'s count with stranded host time (``strands_count``) for ``demand``,
    weighing resources by ``used`` (summing to ``total``); -1 if it strands nothing more."""
    measure = (used, strand[1], strand[2], FIT_TOLERANCE)
    added = added_waste(free, host, demand, zero, inv_capacity, measure)
    return strands_count(added, total, strand, host, now, cap)
