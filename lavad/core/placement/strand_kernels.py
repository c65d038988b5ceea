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
    """
    weights, directions, minimal, tolerance = measure
    n_resources = free.shape[0]
    fits_any = False
    for m in range(minimal.shape[0]):
        fits = True
        for r in range(n_resources):
            if free[r, host] - demand[r] < minimal[m, r] - tolerance:
                fits = False
                break
        if fits:
            fits_any = True
            break
    total = 0.0
    if not fits_any:
        for r in range(n_resources):
            if weights[r] > 0.0:
                total += weights[r] * max(free[r, host] - demand[r], 0.0) * inv_capacity[r, host]
        return total
    left = np.empty(n_resources)
    for r in range(n_resources):
        left[r] = max(free[r, host] - demand[r], 0.0)
    exhausted = 0
    for _ in range(n_resources):
        fill = np.inf
        for r in range(n_resources):
            mean = directions[exhausted, r]
            if mean > 0.0:
                fill = min(fill, left[r] / mean)
        if fill == np.inf:
            break  # no shape of the mix asks only for what is left
        ran_out = exhausted
        for r in range(n_resources):
            mean = directions[exhausted, r]
            if mean > 0.0:
                if left[r] / mean <= fill:
                    ran_out |= 1 << r
                # A resource that ran out keeps what rounding leaves of it (an
                # ulp), so a pool whose every shape asks for every resource
                # scores exactly as a single leg would.
                left[r] = max(left[r] - fill * mean, 0.0)
        exhausted = ran_out
    for r in range(n_resources):
        if weights[r] > 0.0:
            total += weights[r] * left[r] * inv_capacity[r, host]
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
