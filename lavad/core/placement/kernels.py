"""Compiled inner loop for the common placement pipelines (numba).

The numpy pipeline in ``framework.py`` costs about a dozen array operations
per request, and with pools of a few hundred to a few thousand hosts the
per-call overhead of numpy, not the arithmetic, dominates: ~30 us at 1,000
hosts, far too slow for a replay of 10^5 events per second. When a policy's
filters are the default ones (schedulable, fit, anti-affinity: the hosts at a
request's limit come marked unschedulable, ``framework.unschedulable_for``) and
it has a single scorer this module knows (Best Fit, First Fit), one compiled
pass over the hosts filters, scores and collects the tie set.

It computes exactly what the numpy pipeline does, in the same floating-point
order (sum over resources in index order, starting from 0.0; no fastmath), so
both give bit-identical scores and the same seeded tie-break; a test holds
them equal on random states.

It also holds what the LAS and LAVA scan (``lifetime_scan``) inlines (the
fit test, Best Fit's score, LAS's cost of a host and its floors) and the
lifetime tracker's compiled upkeep (booking, release, the refresh of the
hosts' exit quantiles), over the tracker's packed arrays laid out below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, cast

import numba
import numpy as np

from lavad.core.cluster import BoolArray, FloatArray, IntArray
from lavad.core.placement.strand_kernels import (
    Stranding,
    present_weights,
)
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.survival import bin_of, remaining_quantiles_into, warm_up_survival

BESTFIT: Final = 0
FIRSTFIT: Final = 1

# The lifetime tracker's per-slot and per-host columns, packed into a few 2-D
# arrays (one row per column, one column per slot or host) so that a compiled
# call takes a few arrays instead of one per column: taking in an array costs
# a call about 50 ns. A row is a contiguous view (``slot_times[START]``).
# Rows of ``slot_times`` (float64): when the VM was placed, its exit predicted
# at creation, its latest predicted exit, and when that was predicted.
START: Final = 0
INITIAL_EXIT: Final = 1
PREDICTED_EXIT: Final = 2
PREDICTED_AT: Final = 3
SLOT_TIMES: Final = 4
# Rows of ``slot_ints`` (int64): the VM's host, its distribution row, the
# slot's generation, and the next and previous slots on its host's list.
HOST: Final = 0
ROW: Final = 1
GENERATION: Final = 2
NEXT_ON_HOST: Final = 3
PREV_ON_HOST: Final = 4
SLOT_INTS: Final = 5
# Rows of ``slot_flags`` (bool): whether the slot holds a running VM, and
# whether the model learns from it.
ALIVE: Final = 0
LEARNS: Final = 1
SLOT_FLAGS: Final = 2
# Rows of ``host_times`` (float64): the host's latest predicted exit, its
# latest exit as predicted at creation, and the exit its quantiles were
# computed for (NaN: stale).
HOST_EXIT: Final = 0
HOST_INITIAL_EXIT: Final = 1
QUANTILES_EXIT: Final = 2
HOST_TIMES: Final = 3
# Rows of ``host_ints`` (int64): the slot holding the host's latest exit
# (-1: none or unknown), the first slot of its list (-1: empty), and how
# many times its quantiles were rewritten.
HOLDER: Final = 0
HEAD: Final = 1
QUANTILES_STAMP: Final = 2
HOST_INTS: Final = 3

# The lifetime scan's arguments in groups (``lifetime_scan``; a tuple is one
# argument to numba, typed once): the pool's arrays and Best Fit's weights
# (free, inverse capacity, unschedulable, resources present, weights); how
# LAS costs a host (the hosts' exits, the VM's thresholds and whether they
# apply, the point buckets, the host quantiles and whether they apply); the
# floors (lower bounds of LAS costs, their epochs and stamps, the hosts'
# quantile stamps, the current epoch, whether they apply, and until when
# each floor is its host's exact cost); the tracker's packed arrays (slot
# times, slot ints, host times, host ints, host quantiles) and the model's
# (creation quantiles and whether each row's are known, the mass tables,
# the bin edges, the open bin's lifetime, the levels, and whether a host's
# life is the latest of all its VMs' rather than its latest VM's).
ScanPool = tuple[FloatArray, FloatArray, BoolArray, BoolArray, FloatArray]
# Best Fit's and First Fit's request: hosts to scan, the demand, the fit tolerance.
FitRequest = tuple[int, float, float, float, float, float]
LasInput = tuple[FloatArray, FloatArray, bool, FloatArray, FloatArray, bool]
Floors = tuple[FloatArray, IntArray, IntArray, IntArray, int, bool, FloatArray]
# Whether the scan counts stranded host time, and the count's inputs (the
# demand, zeros, the resource weights and their sum, ``Stranding``).
StrandCount = tuple[bool, FloatArray, FloatArray, FloatArray, float, Stranding]
TrackerArrays = tuple[FloatArray, IntArray, FloatArray, IntArray, FloatArray]
ModelArrays = tuple[
    FloatArray, BoolArray, FloatArray, FloatArray, FloatArray, float, FloatArray, bool
]
# What booking and releasing a slot write: the slots' times, ints, flags and
# group levels, the hosts' times and ints.
PackedColumns = tuple[FloatArray, IntArray, BoolArray, IntArray, FloatArray, IntArray]


@numba.njit(cache=True, nogil=True, inline="always")
def _tie_in(score: float, best: float, count: int) -> tuple[float, int, int]:
    """Best Fit's tie set after a host (visited in ascending order) scores ``score``:
    a lower score starts it anew, an equal one joins it; (best score, tie count,
    the index the host takes in the ties or -1).

    The caller writes the host into its ties itself: an array handed to an
    inlined function inside a loop costs its reference count, taken and
    dropped with atomic operations, at every host (docs/results/speed.md).
    """
    if score < best:
        return score, 1, 0
    if score == best:
        return best, count + 1, count
    return best, count, -1


@numba.njit(cache=True, nogil=True)
def _scan_cores_memory(
    free: FloatArray,
    inv_capacity: FloatArray,
    unschedulable: BoolArray,
    n: int,
    d0: float,
    d1: float,
    w0: float,
    w1: float,
    tolerance: float,
    kind: int,
    ties: IntArray,
) -> tuple[int, float]:
    """The common case: only cores and memory are asked for and present."""
    best = np.inf
    count = 0
    need0 = d0 - tolerance
    need1 = d1 - tolerance
    for h in range(n):
        if unschedulable[h]:
            continue
        f0 = free[0, h]
        f1 = free[1, h]
        if f0 < need0 or f1 < need1:
            continue
        if kind == FIRSTFIT:
            ties[0] = h
            return 1, float(h)
        # x * 1.0 == x exactly, so weights need no branch; x * 0.0 adds +-0.0.
        score = 0.0
        score += (f0 - d0) * inv_capacity[0, h] * w0
        score += (f1 - d1) * inv_capacity[1, h] * w1
        best, count, at = _tie_in(score, best, count)
        if at >= 0:
            ties[at] = h
    return count, best


@numba.njit(cache=True, nogil=True, inline="always")
def _fits(
    free: FloatArray, h: int, d0: float, d1: float, d2: float, d3: float, tolerance: float
) -> bool:
    """Host ``h`` has room for the demand in every resource (within rounding)."""
    if free[0, h] < d0 - tolerance or free[1, h] < d1 - tolerance:
        return False
    if d2 != 0.0 and free[2, h] < d2 - tolerance:
        return False
    return not (d3 != 0.0 and free[3, h] < d3 - tolerance)


# A host's four resources (one column of the pool's free or inverse-capacity
# array), read by the caller for ``_bestfit_score``.
Column = tuple[float, float, float, float]


@numba.njit(cache=True, nogil=True, inline="always")
def _column(values: FloatArray, h: int) -> Column:
    """Host ``h``'s four resources in ``values`` (4, hosts)."""
    return values[0, h], values[1, h], values[2, h], values[3, h]


@numba.njit(cache=True, nogil=True, inline="always")
def _bestfit_score(
    free: Column,
    inv_capacity: Column,
    d0: float,
    d1: float,
    d2: float,
    d3: float,
    w0: float,
    w1: float,
    w2: float,
    w3: float,
) -> float:
    """Best Fit's weighted free fraction left on a host, summed as the numpy scorer sums,
    from the host's columns (``_column``): scalars, not the arrays, since an array
    handed to an inlined function with branches costs its reference count at every
    host (``_tie_in``)."""
    f0, f1, f2, f3 = free
    c0, c1, c2, c3 = inv_capacity
    score: float = 0.0
    score += (f0 - d0) * c0 * w0
    score += (f1 - d1) * c1 * w1
    if w2 != 0.0:
        score += (f2 - d2) * c2 * w2
    if w3 != 0.0:
        score += (f3 - d3) * c3 * w3
    return score


@numba.njit(cache=True, nogil=True)
def _filter_and_score(
    pool: ScanPool, request: FitRequest, kind: int, ties: IntArray
) -> tuple[int, float]:
    """Best Fit (or First Fit, by ``kind``) over hosts ``[0, n)`` of ``pool`` for the
    demand in ``request`` (n, d0..d3, the fit tolerance).

    Fills ``ties[:count]`` with the best hosts (ascending) and returns (count,
    best score); count 0 means no host passed the filters. Called through
    ``Direct.filter_and_score``.
    """
    free, inv_capacity, unschedulable, present, weights = pool
    n, d0, d1, d2, d3, tolerance = request
    # Unrolled over the four resources (cores, memory, disk, GPUs): a loop
    # over resources with an early break ran 4x slower per host. A resource
    # no host has is skipped, as the numpy scorer does.
    w0, w1, w2, w3 = _present_weights(weights, present)
    if d2 == 0.0 and d3 == 0.0 and w2 == 0.0 and w3 == 0.0:
        return _scan_cores_memory(
            free, inv_capacity, unschedulable, n, d0, d1, w0, w1, tolerance, kind, ties
        )
    best = np.inf
    count = 0
    for h in range(n):
        if unschedulable[h]:
            continue
        if not _fits(free, h, d0, d1, d2, d3, tolerance):
            continue
        if kind == FIRSTFIT:
            ties[0] = h
            return 1, float(h)
        score = _bestfit_score(
            _column(free, h), _column(inv_capacity, h), d0, d1, d2, d3, w0, w1, w2, w3
        )
        best, count, at = _tie_in(score, best, count)
        if at >= 0:
            ties[at] = h
    return count, best


def warm_up() -> None:
    """Compile (or load from numba's cache) the scan before anything is timed.

    The first call otherwise pays for compilation inside the first placement,
    which would land in a replay's throughput and a live decision's latency.
    """
    free = np.zeros((4, 1))
    ties = np.zeros(1, dtype=np.int64)
    weights = np.ones(4)
    present = np.ones(4, dtype=np.bool_)
    unschedulable = np.zeros(1, dtype=np.bool_)
    pool = (free, free, unschedulable, present, weights)
    for d2 in (0.0, 1.0):  # both the cores+memory scan and the general one
        _filter_and_score(pool, (1, 1.0, 1.0, d2, 0.0, 0.0), BESTFIT, ties)
    install_entry_point(
        Direct,
        "filter_and_score",
        _filter_and_score,
        (pool, (1, 1.0, 1.0, 0.0, 0.0, 0.0), BESTFIT, ties),
    )


@numba.njit(cache=True, nogil=True)
def _count_below(thresholds: FloatArray, remaining: float) -> int:
    """searchsorted(thresholds, remaining, side="left")."""
    lo = 0
    hi = len(thresholds)
    while lo < hi:
        mid = (lo + hi) // 2
        if thresholds[mid] < remaining:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True, inline="always")
def _count_exceeds(thresholds: FloatArray, remaining: float, budget: float) -> bool:
    """Whether len(thresholds) - searchsorted(thresholds, remaining) > budget, in one comparison.

    ``budget`` is a whole number >= 0. The count of thresholds at or above
    ``remaining`` exceeds it exactly when the (n - budget)-th smallest
    threshold is at or above ``remaining`` (NaN compares false both ways,
    as the search's does).
    """
    k = len(thresholds) - int(budget)
    return k >= 1 and thresholds[k - 1] >= remaining


@numba.njit(cache=True, nogil=True, inline="always")
def _las_cost(
    h: int,
    host_exit: FloatArray,
    now: float,
    start: float,
    thresholds: FloatArray,
    use_thresholds: bool,
    buckets: FloatArray,
    host_q: FloatArray,
    use_host_q: bool,
    cap: float,
) -> tuple[float, float]:
    """Host ``h``'s LAS cost, or as soon as it is known to exceed ``cap`` (a whole number),
    a number above ``cap``: with host quantiles a lower bound of the cost, else inf.
    Beside it, with host quantiles, the latest ``now`` up to which the cost stays
    exactly this for the same thresholds and quantiles (``_exact_until``); -inf
    for a bound or without host quantiles.

    The quantile costs are counts, whole numbers, so their sum is the same
    float in any order and a term can be bounded by one comparison
    (``_count_exceeds``) before it is searched.
    """
    n_thresholds = len(thresholds)
    exit_h = max(host_exit[h], now)
    if use_thresholds and use_host_q:
        c = 0.0
        until = np.inf
        for j in range(host_q.shape[1]):
            exit_j = max(host_q[h, j], now)
            remaining = exit_j - now
            if cap < np.inf and _count_exceeds(thresholds, remaining, cap - c):
                # this term alone is over the budget left, by 1 or more
                return cap + 1.0, -np.inf
            below = _count_below(thresholds, remaining)
            c += float(n_thresholds - below)
            if c > cap:
                return c, -np.inf  # the terms are >= 0: this host already costs more
            until = min(until, _exact_until(thresholds, below, exit_j))
        return c, until
    if use_thresholds:
        remaining = exit_h - now
        if cap < np.inf and _count_exceeds(thresholds, remaining, cap):
            return np.inf, -np.inf
        return float(n_thresholds - _count_below(thresholds, remaining)), -np.inf
    n_buckets = len(buckets)
    delta = start - exit_h
    if np.isnan(delta):
        # NaN (an infinite lifetime on a host whose exit is infinite):
        # numpy's maximum keeps it and searchsorted puts it last.
        index = n_buckets
    else:
        # searchsorted(buckets, max(delta, 0), side="right")
        delta = max(delta, 0.0)
        index = 0
        while index < n_buckets and buckets[index] <= delta:
            index += 1
    return float(index - 1), -np.inf


@numba.njit(cache=True, nogil=True, inline="always")
def _exact_until(thresholds: FloatArray, below: int, exit_j: float) -> float:
    """The latest time up to which one host quantile's count of thresholds stays ``n - below``.

    ``exit_j`` is the quantile's exit, clipped at the ``now`` it was counted
    at, and ``below`` the thresholds under its remaining life then. As time
    goes on the remaining life ``exit_j - now`` only shrinks, and the count
    grows when it reaches the greatest threshold under it, ``t``, at
    ``now = exit_j - t``; a threshold below 0 is never reached (a remaining
    life is at least 0). The margin, about 10^7 times the rounding of the
    subtraction, keeps the floating-point remaining life above ``t`` up to
    the time returned, so a cost reused until then is the one a search
    would give.
    """
    if below == 0 or exit_j == np.inf:
        return np.inf
    t = float(thresholds[below - 1])
    if t < 0.0:
        return np.inf
    return exit_j - t - 1e-9 * (abs(exit_j) + abs(t))


@numba.njit(cache=True, nogil=True, inline="always")
def _present_weights(weights: FloatArray, present: np.ndarray) -> tuple[float, float, float, float]:
    """Best Fit's four weights, 0 for a resource no host of the pool has: as four
    scalars for the loops unrolled over the resources (``strand_kernels.present_weights``
    gives the same as an array, for loops over them)."""
    return (
        weights[0] if present[0] else 0.0, weights[1] if present[1] else 0.0,
        weights[2] if present[2] else 0.0, weights[3] if present[3] else 0.0,
    )  # fmt: skip


@numba.njit(cache=True, nogil=True, inline="always")
def _scan_inputs(
    request: Any,
    present: np.ndarray,
    las: LasInput,
    refresh: bool,
    tracker: TrackerArrays,
    strand: Stranding,
) -> tuple[FloatArray, StrandCount]:
    """What a lifetime scan reads before its pass: the exits its refresh compares with
    the hosts' own (the hosts' when not refreshing: ``tracker`` may then be empty),
    and the stranded count's inputs, counted when its weight and the pool's
    resources leave anything to count."""
    quantiles_exit = las[0]
    if refresh:
        quantiles_exit = tracker[2][QUANTILES_EXIT]
    used = present_weights(strand[0], present)
    total = used.sum()
    demand = np.empty(4)
    demand[0] = request[1]
    demand[1] = request[2]
    demand[2] = request[3]
    demand[3] = request[4]
    counted = (strand[6] > 0.0 and total > 0.0, demand, np.zeros(4), used, total, strand)
    return quantiles_exit, counted


@numba.njit(cache=True, nogil=True)
def _kept_floor(
    h: int, floor_epoch: IntArray, floor_stamp: IntArray, stamp: IntArray, epoch: int, use: bool
) -> bool:
    """Whether host ``h``'s floor was costed in this epoch on its current quantiles
    (``Floors``' members: the scans unpack them once, before their pass)."""
    return use and floor_epoch[h] == epoch and floor_stamp[h] == stamp[h]


@numba.njit(cache=True, nogil=True)
def _costed(
    h: int, las: LasInput, now: float, start: float, floors: Floors, cap: float, kept: bool
) -> float:
    """``_las_cost`` of host ``h`` under ``cap``, kept as its floor where floors apply.

    A kept floor (``_kept_floor``) that is still its host's exact cost at
    ``now`` is that cost, without a search: within an epoch time only moves
    on, and between two placements it seldom moves a remaining life across
    a threshold.
    """
    floor, floor_epoch, floor_stamp, stamp, epoch, use_floor, exact_until = floors
    if kept and now <= exact_until[h]:
        return float(floor[h])
    host_exit, thresholds, use_thresholds, buckets, host_q, use_host_q = las
    c, until = _las_cost(
        h, host_exit, now, start, thresholds, use_thresholds, buckets, host_q, use_host_q, cap
    )
    if use_floor:
        _keep_floor(h, c, until, floor, floor_epoch, floor_stamp, stamp, epoch, exact_until)
    return c


@numba.njit(cache=True, nogil=True, inline="always")
def _keep_floor(
    h: int,
    cost: float,
    until: float,
    floor: FloatArray,
    floor_epoch: IntArray,
    floor_stamp: IntArray,
    stamp: IntArray,
    epoch: int,
    exact_until: FloatArray,
) -> None:
    """Host ``h``'s floor set to ``cost`` in this epoch on its current quantiles, exact
    until ``until`` (``Floors``' members). Straight-line code: inlined into the pass
    over the hosts, its arrays take no reference count (``_tie_in``)."""
    floor[h] = cost
    floor_epoch[h] = epoch
    floor_stamp[h] = stamp[h]
    exact_until[h] = until


@numba.njit(cache=True, nogil=True, inline="always")
def no_floors_nor_refresh() -> tuple[Floors, TrackerArrays, ModelArrays]:
    """Empty floors, tracker and model arrays, typed as the real ones, for a scan by a
    host's point exit or a point lifetime (``use_floor`` and ``refresh`` false: the
    arrays are never read)."""
    no_floats = np.empty(0)
    no_ints = np.empty(0, dtype=np.int64)
    no_floors = (no_floats, no_ints, no_ints, no_ints, -1, False, no_floats)
    no_tracker = (
        np.empty((0, 0)), np.empty((0, 0), dtype=np.int64), np.empty((0, 0)),
        np.empty((0, 0), dtype=np.int64), np.empty((0, 0)),
    )  # fmt: skip
    no_model = (
        np.empty((0, 0)), np.empty(0, dtype=np.bool_), np.empty((0, 0)), np.empty((0, 0)),
        no_floats, 0.0, no_floats, False,
    )  # fmt: skip
    return no_floors, no_tracker, no_model


@numba.njit(cache=True, nogil=True, inline="always")
def by_host_quantiles(
    thresholds: FloatArray,
    floor: FloatArray,
    floor_marks: IntArray,
    epoch: int,
    tracker: TrackerArrays,
) -> tuple[LasInput, Floors]:
    """How a refreshed scan costs hosts (by the host quantiles in the tracker's packed
    arrays) and its floors: ``floor`` is the floors (row 0) and until when each is its
    host's exact cost (row 1, -inf: a bound); ``floor_marks`` is the floors' epochs
    (row 0) and the stamps they were costed at (row 1)."""
    host_times = tracker[2]
    # The buckets (``las[3]``) are not read when costing by thresholds.
    las = (host_times[HOST_EXIT], thresholds, True, thresholds, tracker[4], True)
    floors = (
        floor[0], floor_marks[0], floor_marks[1], tracker[3][QUANTILES_STAMP], epoch, True,
        floor[1],
    )  # fmt: skip
    return las, floors


def warm_up_tracker_arrays() -> tuple[TrackerArrays, ModelArrays]:
    """Small tracker and model arrays of the types the tracker packs, host 0's
    quantiles stale (so a refresh runs over it): what the lifetime kernels warm up on."""
    host_q = np.zeros((1, 1))
    slot_times = np.zeros((SLOT_TIMES, 1))
    slot_ints = np.zeros((SLOT_INTS, 1), dtype=np.int64)
    host_times = np.zeros((HOST_TIMES, 1))
    host_times[QUANTILES_EXIT] = np.nan
    host_ints = np.zeros((HOST_INTS, 1), dtype=np.int64)
    host_ints[HEAD] = -1
    # The tracker's packed arrays and quantiles, then the creation quantiles'
    # and the model's.
    tracker = (slot_times, slot_ints, host_times, host_ints, host_q.copy())
    model = (
        host_q.copy(), np.zeros(1, dtype=np.bool_), np.ones((1, 2)), np.ones((1, 3)),
        np.array([0.0, 1.0]), 2.0, np.zeros(1), False,
    )  # fmt: skip
    return tracker, model


def warm_up_lifetime() -> None:
    """Compile (or load) the tracker's and LAVA's kernels before anything is timed;
    resolve their ``Direct`` entry points (the scan has its own, ``lifetime_scan``)."""
    tracker, model = warm_up_tracker_arrays()
    warm_up_survival()
    one = np.zeros(1)
    preference = (
        np.zeros(1, dtype=np.int8), np.zeros(1, dtype=np.int8), np.zeros(1, dtype=np.int32),
        1, 0, one, False, one,
    )  # fmt: skip
    _lava_preference(*preference)
    refresh = (1, tracker, model)
    _refresh_host_quantiles(*refresh)
    _warm_up_hooks()
    install_entry_point(Direct, "lava_preference", _lava_preference, preference)
    free = np.zeros((4, 1))
    threshold = (free, free, 0, 0.9)
    _over_threshold(*threshold)
    install_entry_point(Direct, "over_threshold", _over_threshold, threshold)
    install_entry_point(Direct, "refresh_host_quantiles", _refresh_host_quantiles, refresh)


@numba.njit(cache=True, nogil=True)
def _lava_preference(
    phase: np.ndarray,
    host_class: np.ndarray,
    vm_count: np.ndarray,
    n: int,
    vm_class: int,
    base: FloatArray,
    on_base: bool,
    out: FloatArray,
) -> None:
    """``lava.preference_cost`` in one pass (phases: 1 open, 2 recycling; counts as held;
    a ``vm_class`` of -1, no class: every non-empty host alike), each added to
    ``base`` when ``on_base``.

    ``base`` is a level a scorer above packs onto the cost (the deployment
    affinity's, ``affinity``), added here rather than in a numpy pass of its
    own over the pool at every placement; ``out`` may be ``base`` itself.
    """
    for h in range(n):
        klass = host_class[h]
        if vm_count[h] == 0:
            cost = 6.0
        elif vm_class < 0:
            cost = 5.0
        elif phase[h] == 1 and klass == vm_class:
            cost = 4.0
        elif phase[h] == 2 and klass > vm_class:
            cost = float(klass - vm_class - 1)
        else:
            cost = 5.0
        out[h] = cost + base[h] if on_base else cost


@numba.njit(cache=True, nogil=True)
def _over_threshold(capacity: FloatArray, free: FloatArray, host: int, above: float) -> bool:
    """``LavaHosts._over_threshold``: CPU or memory booked above ``above`` of the capacity."""
    for r in range(2):
        total = capacity[r, host]
        if total > 0 and total - free[r, host] > above * total:
            return True
    return False


compiled_lava_preference: Callable[
    [np.ndarray, np.ndarray, np.ndarray, int, int, FloatArray, bool, FloatArray], None
] = _lava_preference
"""(phase, host_class, vm_count, n, vm_class, base, on_base, out): the LAVA preference
cost per host, on ``base`` if ``on_base``."""


@numba.njit(cache=True, nogil=True)
def _latest_of_all(
    host_q: FloatArray,
    h: int,
    first: int,
    slot_columns: tuple[FloatArray, FloatArray, IntArray, IntArray],
    mass: FloatArray,
    m0: FloatArray,
    edges: FloatArray,
    open_lifetime: float,
    levels: FloatArray,
) -> None:
    """Host ``h``'s quantiles (``host_q[h]``, as times) of the latest exit of all its VMs,
    the list starting at slot ``first`` (``slot_columns``: the slots' starts, prediction
    times, rows and next slots on their hosts, as ``_refresh_host`` reads them).

    Each VM's remaining life is taken as its H quantiles at the host levels
    (``levels``, the midpoints (j + 1/2) / H), each with probability 1/H, and
    the VMs as independent: P(host empty by t) is the product over its VMs of
    the share of each one's quantile times at or before t, and the host's
    quantile at level p is the first of all those times where the product
    reaches p. With one VM that is the VM's own quantiles, as the latest VM's
    rule gives. Bounded by work: one walk over the host's list (at most one
    step per slot), then a sort of its VMs' H points each.
    """
    start, predicted_at, row, next_on_host = slot_columns
    width = host_q.shape[1]
    points = len(levels)
    members = 0
    member = first
    steps = len(next_on_host)
    while member >= 0 and steps > 0:
        members += 1
        member = next_on_host[member]
        steps -= 1
    if members == 0 or points == 0:
        return
    times = np.empty((members, points))
    member = first
    for i in range(members):
        at = predicted_at[member]
        remaining_quantiles_into(
            mass, m0, row[member], at - start[member], edges, open_lifetime, levels, times, i
        )
        for j in range(points):
            times[i, j] = at + times[i, j]
        member = next_on_host[member]
    flat = times.ravel()
    order = np.argsort(flat, kind="mergesort")
    seen = np.zeros(members, dtype=np.int64)
    # VMs none of whose points is passed yet, and the log of the product of
    # the others' shares (the product of shares is 0 while any VM has none).
    unseen = members
    log_product = 0.0
    q = 0
    for c in range(members * points):
        at_point = order[c]
        vm = at_point // points
        before = seen[vm]
        seen[vm] = before + 1
        if before == 0:
            unseen -= 1
        else:
            log_product -= np.log(before / points)
        log_product += np.log((before + 1) / points)
        if unseen == 0:
            share = np.exp(log_product)
            # The tolerance absorbs the rounding of the logs' sum: a product
            # of shares k/H meets a level (j + 1/2)/H it equals in exact terms.
            while q < width and share >= levels[q] - 1e-9:
                host_q[h, q] = flat[at_point]
                q += 1
    # Every VM's last point passed, the product is 1 up to rounding: any level
    # left is the latest point.
    while q < width:
        host_q[h, q] = flat[order[members * points - 1]]
        q += 1


@numba.njit(cache=True, nogil=True)
def _refresh_host(h: int, tracker: TrackerArrays, model: ModelArrays) -> int:
    """Host ``h``'s part of ``_refresh_host_quantiles``: 1 if its holder was found again.

    It reads and writes only host ``h``'s entries (and the row cache
    ``creation_quantiles``, whose rows are the same whichever host fills
    them), so the hosts can be refreshed in any order.
    """
    slot_times, slot_ints, host_times, host_ints, host_q = tracker
    creation_quantiles, creation_known, mass, m0, edges, open_lifetime, levels, all_vms = model
    host_exit = host_times[HOST_EXIT]
    quantiles_exit = host_times[QUANTILES_EXIT]
    holder = host_ints[HOLDER]
    head = host_ints[HEAD]
    stamp = host_ints[QUANTILES_STAMP]
    start = slot_times[START]
    predicted_exit = slot_times[PREDICTED_EXIT]
    predicted_at = slot_times[PREDICTED_AT]
    row = slot_ints[ROW]
    next_on_host = slot_ints[NEXT_ON_HOST]
    exit_h = host_exit[h]
    if exit_h == quantiles_exit[h]:
        return 0
    stamp[h] += 1
    width = host_q.shape[1]
    if exit_h == -np.inf:
        for j in range(width):
            host_q[h, j] = -np.inf
        quantiles_exit[h] = exit_h
        return 0
    if all_vms:
        # No holder to find: every VM on the host is read.
        _latest_of_all(
            host_q, h, head[h], (start, predicted_at, row, next_on_host),
            mass, m0, edges, open_lifetime, levels,
        )  # fmt: skip
        quantiles_exit[h] = exit_h
        return 0
    found = 0
    slot = holder[h]
    if slot < 0:
        member = head[h]
        latest = -np.inf
        # At most one step per slot: a list is never longer (bounded by
        # work even if a damaged snapshot made one circular).
        steps = len(next_on_host)
        while member >= 0 and steps > 0:
            exit_m = predicted_exit[member]
            if exit_m > latest or (exit_m == latest and member < slot):
                latest = exit_m
                slot = member
            member = next_on_host[member]
            steps -= 1
        holder[h] = slot
        found = 1
    at = predicted_at[slot]
    r = row[slot]
    uptime = at - start[slot]
    if uptime == 0.0 and r < len(creation_known):
        if not creation_known[r]:
            remaining_quantiles_into(
                mass, m0, r, uptime, edges, open_lifetime, levels, creation_quantiles, r
            )
            creation_known[r] = True
        for j in range(width):
            host_q[h, j] = at + creation_quantiles[r, j]
    else:
        # Written in place, then made times: the same sums as through a copy.
        remaining_quantiles_into(mass, m0, r, uptime, edges, open_lifetime, levels, host_q, h)
        for j in range(width):
            host_q[h, j] = at + host_q[h, j]
    quantiles_exit[h] = exit_h
    return found


@numba.njit(cache=True, nogil=True)
def _refresh_host_quantiles(n: int, tracker: TrackerArrays, model: ModelArrays) -> int:
    """``LifetimeTracker.host_exit_quantiles`` in one pass over the hosts ``[0, n)``.

    A host whose exit (``host_times[HOST_EXIT]``) differs from the one its
    quantiles were computed for (``host_times[QUANTILES_EXIT]``; NaN is
    stale) gets -inf when it has no VM, else its holder's remaining-life
    quantiles at the uptime its exit was predicted at, as times: from
    ``creation_quantiles`` when the holder was never repredicted and its
    row's are known, else computed (and kept for the row when at uptime 0).
    A host whose holder is unknown (-1) gets it found again from its list
    of VMs: the lowest slot among those with the latest predicted exit.
    With ``all_vms`` (the model arrays' last) a host's quantiles are instead
    those of the latest exit of all its VMs (``_latest_of_all``), and no
    holder is looked for.
    Each host whose quantiles are rewritten has its stamp moved on (so the
    LAS floors of ``lifetime_scan`` kept for it lapse). Returns
    how many holders were found again.
    """
    count = 0
    for h in range(n):
        count += _refresh_host(h, tracker, model)
    return count


compiled_refresh_host_quantiles: Callable[[int, TrackerArrays, ModelArrays], int] = (
    _refresh_host_quantiles
)
"""(n, the tracker's arrays, the model's) -> how many holders were found again."""


@numba.njit(cache=True, nogil=True)
def _join_host(
    slot: int,
    host: int,
    exit_time: float,
    initial_exit_time: float,
    slot_ints: IntArray,
    host_times: FloatArray,
    host_ints: IntArray,
) -> None:
    """``slot`` joins ``host``'s list with these exits: the host's latest exits and holder.

    The holder is the lowest slot among the VMs with the latest exit.
    """
    next_on_host = slot_ints[NEXT_ON_HOST]
    prev_on_host = slot_ints[PREV_ON_HOST]
    head = host_ints[HEAD]
    holder = host_ints[HOLDER]
    first = head[host]
    next_on_host[slot] = first
    prev_on_host[slot] = -1
    if first >= 0:
        prev_on_host[first] = slot
    head[host] = slot
    slot_ints[HOST, slot] = host
    latest = host_times[HOST_EXIT, host]
    if exit_time > latest:
        host_times[HOST_EXIT, host] = exit_time
        holder[host] = slot
    elif exit_time == latest and 0 <= slot < holder[host]:
        holder[host] = slot
    host_times[HOST_INITIAL_EXIT, host] = max(
        host_times[HOST_INITIAL_EXIT, host], initial_exit_time
    )


@numba.njit(cache=True, nogil=True)
def _leave_host(
    slot: int,
    host: int,
    slot_times: FloatArray,
    slot_ints: IntArray,
    host_times: FloatArray,
    host_ints: IntArray,
) -> None:
    """Take ``slot`` off ``host``'s list; the host's latest exits from the VMs left.

    Unless another VM holds both maxima (``slot``'s exits are below them),
    they are the maxima over the VMs left (-inf with none), and the holder
    is unknown (-1: found again when next needed).
    """
    predicted_exit = slot_times[PREDICTED_EXIT]
    initial_exit = slot_times[INITIAL_EXIT]
    next_on_host = slot_ints[NEXT_ON_HOST]
    prev_on_host = slot_ints[PREV_ON_HOST]
    head = host_ints[HEAD]
    before = prev_on_host[slot]
    after = next_on_host[slot]
    if before >= 0:
        next_on_host[before] = after
    else:
        head[host] = after
    if after >= 0:
        prev_on_host[after] = before
    next_on_host[slot] = -1
    prev_on_host[slot] = -1
    member = head[host]
    if (
        member >= 0
        and predicted_exit[slot] < host_times[HOST_EXIT, host]
        and initial_exit[slot] < host_times[HOST_INITIAL_EXIT, host]
    ):
        return
    host_ints[HOLDER, host] = -1
    if member < 0:
        host_times[HOST_EXIT, host] = -np.inf
        host_times[HOST_INITIAL_EXIT, host] = -np.inf
        return
    latest = predicted_exit[member]
    latest_initial = initial_exit[member]
    member = next_on_host[member]
    steps = len(next_on_host)  # at most one step per slot, as in the refresh
    while member >= 0 and steps > 0:
        # np.maximum's order (no NaN among exits): the larger, the first on a tie.
        latest = max(latest, predicted_exit[member])
        latest_initial = max(latest_initial, initial_exit[member])
        member = next_on_host[member]
        steps -= 1
    host_times[HOST_EXIT, host] = latest
    host_times[HOST_INITIAL_EXIT, host] = latest_initial


@numba.njit(cache=True, nogil=True)
def _book_slot(
    slot: int,
    host: int,
    placed_at: float,
    chosen_row: int,
    rows: Any,
    exit_time: float,
    learns: bool,
    packed: PackedColumns,
) -> int:
    """``LifetimeTracker.on_booked``'s writes to the slot and host arrays, in one call;
    the slot's generation (its heap entry's)."""
    slot_times, slot_ints, slot_flags, levels, host_times, host_ints = packed
    slot_times[START, slot] = placed_at
    slot_times[INITIAL_EXIT, slot] = exit_time
    slot_times[PREDICTED_EXIT, slot] = exit_time
    slot_times[PREDICTED_AT, slot] = placed_at
    slot_ints[ROW, slot] = chosen_row
    for k in range(len(rows)):
        levels[slot, k] = rows[k]
    slot_flags[ALIVE, slot] = True
    slot_flags[LEARNS, slot] = learns
    _join_host(slot, host, exit_time, exit_time, slot_ints, host_times, host_ints)
    generation: int = slot_ints[GENERATION, slot]
    return generation


@numba.njit(cache=True, nogil=True)
def _release_slot(
    slot: int,
    now: float,
    exited: bool,
    count: bool,
    weight: float,
    deaths: FloatArray,
    censored: FloatArray,
    edges: FloatArray,
    packed: PackedColumns,
) -> tuple[int, bool]:
    """``LifetimeTracker.on_released``'s writes, in one call: (the VM's host, whether it learns).

    With ``count`` (the model ``counts_plainly``), a VM the model learns
    from adds ``weight`` (the model's ``count_weight``) to its rows' deaths
    (``exited``) or censorings at the column of its lifetime,
    max(now - start, 0), as ``observe_exit`` adds.
    """
    slot_times, slot_ints, slot_flags, levels, host_times, host_ints = packed
    learned = slot_flags[LEARNS, slot]
    if learned and count:
        lived = now - slot_times[START, slot]
        lived = max(lived, 0.0)
        # As ``GroupedLifeTables._column``: bisect.bisect_right(edges, lived) - 1.
        column = bin_of(edges, lived)
        counts = deaths if exited else censored
        for k in range(levels.shape[1]):
            counts[levels[slot, k], column] += weight
    host = slot_ints[HOST, slot]
    slot_flags[ALIVE, slot] = False
    slot_ints[HOST, slot] = -1
    slot_ints[GENERATION, slot] += 1
    _leave_host(slot, host, slot_times, slot_ints, host_times, host_ints)
    return host, learned


@numba.njit(cache=True, nogil=True)
def rebuild_host_exits(
    alive: IntArray,
    slot_times: FloatArray,
    slot_ints: IntArray,
    host_times: FloatArray,
    host_ints: IntArray,
) -> None:
    """Every host's latest predicted exit and holder, from its running VMs only.

    ``alive`` is the running VMs' slots, ascending. What a refit's
    ``np.maximum.at`` over the hosts and its ``lexsort`` by (host, latest
    exit, slot) gave: the maximum (NaN once any exit is NaN, as
    np.maximum keeps it; -inf for a host without VMs) and the lowest slot
    among those with the latest exit (a NaN exit last, as the sort puts it;
    -1 without VMs).
    """
    host_exit = host_times[HOST_EXIT]
    holder = host_ints[HOLDER]
    host_exit[:] = -np.inf
    holder[:] = -1
    predicted_exit = slot_times[PREDICTED_EXIT]
    host_of = slot_ints[HOST]
    for slot in alive:
        h = host_of[slot]
        exit_time = predicted_exit[slot]
        latest = host_exit[h]
        if np.isnan(exit_time) or np.isnan(latest):
            host_exit[h] = np.nan
        elif exit_time > latest:
            host_exit[h] = exit_time
        held = holder[h]
        if held < 0:
            holder[h] = slot
        else:
            exit_held = predicted_exit[held]
            # A later slot takes over only with a strictly later exit (or a
            # number where the holder's exit is NaN): ties keep the lower slot.
            if not np.isnan(exit_time) and (np.isnan(exit_held) or exit_time > exit_held):
                holder[h] = slot


def entry_point(
    kernel: Any,
    args: tuple[Any, ...],
    install: Callable[[Callable[..., Any]], None] | None = None,
) -> Callable[..., Any]:
    """The compiled code ``kernel`` runs for arguments of these types, callable without
    numba's dispatch, its arguments' types checked on its first call.

    numba's dispatcher works out every argument's type on each call, about
    80 ns an argument, as much as a scan over a few hundred hosts. The entry
    point skips that: it converts scalars as the signature says but unboxes
    arrays without checking their dtype, dimensions or layout, so an array
    of another type would be read as the wrong memory. Its callers pass the
    arrays they always pass; the first call (after each warm-up) checks every
    argument's type against the signature and raises TypeError naming the
    first that differs, so a caller that passes anything else fails loudly
    there, in the tests, not later. Raises TypeError at once if there is no
    compiled code for the warm-up's own arguments. Once that first call has
    passed, ``install`` (if given) gets the compiled code itself, to put in
    the checking wrapper's place (``install_entry_point``).
    """
    typeof: Callable[[Any], Any] = numba.typeof  # untyped in numba
    signature = tuple(typeof(arg) for arg in args)
    overload = kernel.overloads.get(signature)
    if overload is None:
        raise TypeError(f"{kernel.__name__}: no compiled code for {signature}")
    compiled = cast("Callable[..., Any]", overload.entry_point)
    checked = False

    def first_checked(*given: Any) -> Any:
        nonlocal checked
        if not checked:
            if len(given) != len(signature):
                raise TypeError(
                    f"{kernel.__name__}: {len(given)} arguments, compiled for {len(signature)}"
                )
            for index, (arg, expected) in enumerate(zip(given, signature, strict=True)):
                found = typeof(arg)
                if found != expected and not _converts(found, expected):
                    raise TypeError(
                        f"{kernel.__name__}: argument {index} is {found}, compiled for {expected}"
                    )
            checked = True
            if install is not None:
                install(compiled)
        return compiled(*given)

    return first_checked


def install_entry_point(holder: type, name: str, kernel: Any, args: tuple[Any, ...]) -> None:
    """``holder.<name>`` = ``entry_point(kernel, args)``, replaced by the compiled code
    itself once its first call has checked the types: the checking wrapper alone costs
    about 0.2 us a call, more than numba's dispatch of a few arguments."""

    def install(compiled: Callable[..., Any]) -> None:
        setattr(holder, name, compiled)

    setattr(holder, name, entry_point(kernel, args, install))


def _converts(found: Any, expected: Any) -> bool:
    """Whether the entry point converts a value of type ``found`` to ``expected`` exactly:
    an int where a float64 is taken (as Python's own arithmetic would), in a tuple too."""
    types: Any = numba.types  # untyped in numba
    if isinstance(found, types.BaseTuple) and isinstance(expected, types.BaseTuple):
        given: tuple[Any, ...] = tuple(found)
        wanted: tuple[Any, ...] = tuple(expected)
        return len(given) == len(wanted) and all(
            f == e or _converts(f, e) for f, e in zip(given, wanted, strict=True)
        )
    return isinstance(found, types.Integer) and bool(expected == types.float64)


def _warm_up_hooks() -> None:
    """Compile (or load) the tracker's booking and release kernels; install their entry points."""
    slot_times = np.zeros((SLOT_TIMES, 2))
    slot_ints = np.full((SLOT_INTS, 2), -1, dtype=np.int64)
    slot_flags = np.zeros((SLOT_FLAGS, 2), dtype=np.bool_)
    levels = np.zeros((2, LEVELS), dtype=np.int64)
    host_times = np.full((HOST_TIMES, 1), -np.inf)
    host_ints = np.full((HOST_INTS, 1), -1, dtype=np.int64)
    packed = (slot_times, slot_ints, slot_flags, levels, host_times, host_ints)
    book = (0, 0, 0.0, 0, (0,) * LEVELS, 1.0, True, packed)
    _book_slot(*book)
    table = np.zeros((2, 2))
    release = (0, 1.0, True, True, 1.0, table, table.copy(), np.array([0.0, 1.0]), packed)
    _release_slot(*release)
    install_entry_point(Direct, "book_slot", _book_slot, book)
    install_entry_point(Direct, "release_slot", _release_slot, release)


class Direct:
    """The kernels' entry points (``entry_point``): Best Fit's and First Fit's set by
    ``warm_up``, the lifetime kernels' by ``warm_up_lifetime``.

    Until then, the dispatchers. Each signature is the warm-up's: the
    arguments' types the policies use, scalars as float64, int64 or bool.
    """

    # ``_filter_and_score``: without the dispatcher's typing of the pool's
    # and the request's tuples, which costs more than their members passed
    # one by one (0.3 us a call).
    filter_and_score: Callable[[ScanPool, FitRequest, int, IntArray], tuple[int, float]] = (
        _filter_and_score
    )

    lava_preference: Callable[..., None] = _lava_preference
    over_threshold: Callable[..., bool] = _over_threshold
    refresh_host_quantiles: Callable[..., int] = _refresh_host_quantiles
    book_slot: Callable[..., int] = _book_slot
    release_slot: Callable[..., tuple[int, bool]] = _release_slot
