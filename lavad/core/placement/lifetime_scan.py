"""LAS and LAVA in one compiled pass over the hosts: filters, (a preference,) LAS
within a cost tolerance of the least, Best Fit.

The numpy pipeline (``framework.Policy.place`` with the scorers
preference -> LAS -> Best Fit) costs a dozen array passes per request; this
scan decides as it does, in the same floating-point order, in one call: the
hosts with the least preference; among them those whose LAS cost is at most
the least such cost plus ``cost_tolerance`` (the LAS scorer's
``tie_tolerance``); among those the least Best Fit score; its ties
ascending. With a tolerance of 0 that is the paper's lexicographic order
(preference, LAS cost, Best Fit). A test holds the scan equal to the
pipeline on replayed states, bit for bit.

Why a tolerance: with learned lifetimes a host's cost is a sum of bucket
indices over the VM's quantiles spread over days, and a difference of a few
buckets in that sum is below what the prediction can tell; ranking on it
packs by noise (docs/results/placement-matrix.md, "The cost tolerance").

How LAS costs a host (``kernels._las_cost``): by its point exit (the bucket
of the VM's exit past the host's), by the VM's cost thresholds against the
host's point exit, or summed over the host's exit quantiles. What makes a
pass over a few hundred hosts cheap:

* ``probe``, a host (or -1), is costed first (the policy's previous
  choice): the least cost is at most its cost, so a host costing more than
  it plus the tolerance is skipped without a search. The probe changes only
  the speed, never the decision.
* Floors (host quantiles): ``floor[h]`` is a lower bound of host ``h``'s
  cost kept from earlier scans, valid while its epoch is the scan's and its
  stamp is the host's quantiles' (``floor_sets`` starts a new epoch unless
  the thresholds are the same array as before and time has not gone back:
  then a host's cost can only have grown). A host whose floor is above the
  cap is skipped; a floor still its host's exact cost at ``now``
  (``exact_until``) is taken without a search.
* ``refresh`` (host quantiles): each stale host's quantiles are brought up
  to date (``kernels._refresh_host``) as the pass reaches it, before it can
  be skipped, instead of in a pass of its own; a host's refresh touches
  only its own entries, so the quantiles and stamps are that pass's.
* ``strand`` (weight > 0, the stranding cost, ``stranding_cost.py``): each
  host whose LAS cost leaves it within the cap has its cost raised to the
  count with the host time the placement strands, in the same pass.

Under a waste guard (``waste.WasteGuard``) the scan runs unguarded and
tests in the same call whether its choice is the guarded one: every tie,
and a host of the least cost, within the guard's step of waste
(``waste.all_within``), measured against a bar of 0. Only when that fails
does the policy score every host's level against the real bar, and only
when the ties or that host fail there too does it scan again with the
levels (``lifetime_policy.LifetimePolicy.place``). The test runs in the
scan's call, not one of its own, since on most placements it is all the
guard costs.

One scan serves every tolerance, 0 included. A scan of its own for a
tolerance of 0, in two passes (LAS's best level, then the stranded count
only where it could change the choice), decides the same on every
configuration of the Azure dev split and is no faster, except for LAS with
the stranding cost and no tolerance (not a default), where this single
pass takes about 1.25x its time; one scan to keep correct is worth that
(docs/results/placement-matrix.md, "One scan for every tolerance").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from lavad.core.cluster import FloatArray, IntArray
from lavad.core.placement.kernels import (
    QUANTILES_EXIT,
    Floors,
    LasInput,
    ModelArrays,
    ScanPool,
    StrandCount,
    TrackerArrays,
    _bestfit_score,
    _column,
    _costed,
    _fits,
    _keep_floor,
    _kept_floor,
    _las_cost,
    _present_weights,
    _refresh_host,
    _scan_inputs,
    _tie_in,
    by_host_quantiles,
    install_entry_point,
    no_floors_nor_refresh,
    warm_up_tracker_arrays,
)
from lavad.core.placement.strand_kernels import Stranding, host_strand_count, no_stranding
from lavad.core.placement.waste import NO_GUARD_TEST, GuardTest, all_within

# The scan's arguments come in groups (a tuple is one argument to numba,
# typed once; ``kernels`` describes the pool, LAS's input, the floors and the
# tracker's and model's arrays). The request: hosts to scan, the demand's
# four resources, the fit tolerance, now, the VM's predicted lifetime, and
# the cost tolerance.
ScanRequest = tuple[int, float, float, float, float, float, float, float, float]
# The preference per host (the deployment affinity, LAVA's classes, or both in
# one key; or nothing, with False), and the guard's test.
Preference = tuple[FloatArray, bool, GuardTest]
# (count, best preference, least LAS cost, best Best Fit score, a host of that
# least cost at that preference or -1 when none fits, and whether the ties and
# that host are all within the guard's step): the waste guard keeps the
# choice without scoring every host only if that host passes it too.
ScanResult = tuple[int, float, float, float, int, bool]


@numba.njit(cache=True, nogil=True, inline="always")
def _probe_bound(
    pool: ScanPool,
    request: ScanRequest,
    preferred: Preference,
    las: LasInput,
    probe: int,
    floors: Floors,
    refresh: bool,
    tracker: TrackerArrays,
    model: ModelArrays,
    counted: StrandCount,
) -> tuple[float, float]:
    """The probe's (preference, LAS cost), refreshed first if stale; (inf, inf) when
    there is no probe or the VM does not fit it. Only a stale host is refreshed (its
    exit moved, or is NaN, for which != is true): most are not, and a call per host
    (its arrays' reference counts) would cost more than the comparison. Where
    ``counted`` says strands count, the cost is raised to the probe's count with
    the host time the placement strands, as every host's is."""
    free, inv_capacity, unschedulable, _, _ = pool
    n, d0, d1, d2, d3, tolerance, now, lifetime, _ = request
    # Indexed: the guard's test (arrays) is not the probe's business.
    preference, use_preference = preferred[0], preferred[1]
    host_exit = las[0]
    if refresh and 0 <= probe < n and host_exit[probe] != tracker[2][QUANTILES_EXIT][probe]:
        _refresh_host(probe, tracker, model)
    if not (
        0 <= probe < n
        and not unschedulable[probe]
        and _fits(free, probe, d0, d1, d2, d3, tolerance)
    ):
        return np.inf, np.inf
    bound_p = preference[probe] if use_preference else 0.0
    _, floor_epoch, floor_stamp, stamp, epoch, use_floor, _ = floors
    kept = _kept_floor(probe, floor_epoch, floor_stamp, stamp, epoch, use_floor)
    cost = _costed(probe, las, now, now + lifetime, floors, np.inf, kept)
    counts, demand, zero, used, total, strand = counted
    if counts and cost < np.inf:
        raised = host_strand_count(
            free, inv_capacity, probe, demand, zero, used, total, strand, now, np.inf
        )
        cost = max(cost, raised)
    return bound_p, cost


@numba.njit(cache=True, nogil=True)
def _lifetime_scan(
    pool: ScanPool,
    request: ScanRequest,
    preferred: Preference,
    las: LasInput,
    ties: IntArray,
    probe: int,
    floors: Floors,
    refresh: bool,
    tracker: TrackerArrays,
    model: ModelArrays,
    strand: Stranding,
) -> ScanResult:
    """(preference, LAS cost within the tolerance of the least, Best Fit) in one pass.

    ``las`` says how LAS costs a host (``kernels.LasInput``); ``floors``,
    ``refresh`` with ``tracker`` and ``model``, and ``strand`` as the module
    says. Returns ``ScanResult`` and the tied hosts, ascending, in
    ``ties[:count]``.
    """
    free, inv_capacity, unschedulable, present, weights = pool
    n, d0, d1, d2, d3, fit_tolerance, now, lifetime, cost_tolerance = request
    preference, use_preference, guard = preferred
    # Unpacked once: an array taken from a tuple inside the pass costs its
    # reference count each time, read for every host that fits
    # (docs/results/speed.md).
    host_exit, thresholds, use_thresholds, buckets, host_q, use_host_q = las
    floor, floor_epoch, floor_stamp, stamp, epoch, use_floor, exact_until = floors
    quantiles_exit, counted = _scan_inputs(request, present, las, refresh, tracker, strand)
    counts_strands, demand, zero, used, total, _ = counted
    start = now + lifetime
    # The hosts within the tolerance of the least cost when they were
    # reached, and their costs; the least only falls, so the final filter
    # drops those it has left behind.
    candidates = np.empty(n, dtype=np.int64)
    costs = np.empty(n)
    n_candidates = 0
    best_p = np.inf
    least = np.inf
    least_host = -1
    # The probe's (preference, cost): its cost bounds the least, so nothing
    # costing more than it plus the tolerance can tie.
    bound_p, bound_c = _probe_bound(
        pool, request, preferred, las, probe, floors, refresh, tracker, model, counted
    )
    for h in range(n):
        if refresh and h != probe and host_exit[h] != quantiles_exit[h]:
            _refresh_host(h, tracker, model)
        if unschedulable[h]:
            continue
        if not _fits(free, h, d0, d1, d2, d3, fit_tolerance):
            continue
        p = preference[h] if use_preference else 0.0
        if p > best_p or p > bound_p:
            continue
        if p < best_p:
            best_p = p
            least = np.inf
            least_host = -1
            n_candidates = 0
        cap = least + cost_tolerance
        if p == bound_p and bound_c + cost_tolerance < cap:
            cap = bound_c + cost_tolerance
        # ``_kept_floor`` written out: a call given the floors' arrays costs
        # each array's reference count, taken and dropped with atomic
        # operations, at every host that fits (docs/results/speed.md).
        kept = use_floor and floor_epoch[h] == epoch and floor_stamp[h] == stamp[h]
        if kept and floor[h] > cap:
            continue
        if kept and now <= exact_until[h]:
            c = float(floor[h])  # ``_costed``'s reuse, without its unpacking
        else:
            # A host kept from an earlier scan of the epoch is costed in
            # full, so its floor becomes its exact cost.
            # ``_costed`` written out, on the arrays unpacked above.
            c, until = _las_cost(
                h, host_exit, now, start, thresholds, use_thresholds, buckets, host_q,
                use_host_q, np.inf if kept else cap,
            )  # fmt: skip
            if use_floor:
                _keep_floor(h, c, until, floor, floor_epoch, floor_stamp, stamp, epoch, exact_until)
        if c > cap:
            continue
        if counts_strands:
            raised = host_strand_count(
                free, inv_capacity, h, demand, zero, used, total, strand, now, cap
            )
            c = max(c, raised)
            if c > cap:
                continue
        if c < least:
            least = c
            least_host = h
        candidates[n_candidates] = h
        costs[n_candidates] = c
        n_candidates += 1
    w0, w1, w2, w3 = _present_weights(weights, present)
    limit = least + cost_tolerance
    best_s = np.inf
    count = 0
    for i in range(n_candidates):
        if costs[i] > limit:
            continue
        h = candidates[i]
        score = _bestfit_score(
            _column(free, h), _column(inv_capacity, h), d0, d1, d2, d3, w0, w1, w2, w3
        )
        best_s, count, at = _tie_in(score, best_s, count)
        if at >= 0:
            ties[at] = h
    measure, step, test = guard
    within = True
    if test and count > 0 and least_host >= 0:
        within = all_within(
            free, inv_capacity, present, ties, count, least_host, demand, measure, step
        )
    return count, best_p, least, best_s, least_host, within


@numba.njit(cache=True, nogil=True)
def _probed_lifetime_scan(
    pool: ScanPool,
    request: ScanRequest,
    preferred: Preference,
    las: LasInput,
    ties: IntArray,
    probe: int,
    strand: Stranding,
) -> ScanResult:
    """``_lifetime_scan`` without floors or a refresh (by a host's point exit, or a point
    lifetime)."""
    no_floors, no_tracker, no_model = no_floors_nor_refresh()
    return _lifetime_scan(
        pool, request, preferred, las, ties, probe, no_floors, False, no_tracker, no_model, strand
    )


@numba.njit(cache=True, nogil=True)
def _refreshed_lifetime_scan(
    pool: ScanPool,
    request: ScanRequest,
    preferred: Preference,
    thresholds: FloatArray,
    ties: IntArray,
    probe: int,
    floor: FloatArray,
    floor_marks: IntArray,
    epoch: int,
    tracker: TrackerArrays,
    model: ModelArrays,
    strand: Stranding,
) -> ScanResult:
    """``_lifetime_scan`` by the host quantiles, with floors, refreshing the hosts'
    quantiles as it reaches them: on the tracker's packed arrays and quantiles
    (``tracker``, its whole arrays: the scan reads the first ``n`` hosts), the
    floors laid out as ``kernels.by_host_quantiles`` says."""
    las, floors = by_host_quantiles(thresholds, floor, floor_marks, epoch, tracker)
    return _lifetime_scan(
        pool, request, preferred, las, ties, probe, floors, True, tracker, model, strand
    )


class ScanDirect:
    """The scans' entry points (``kernels.entry_point``), set by
    ``warm_up_lifetime_scan``; until then, the dispatchers."""

    probed: Callable[..., ScanResult] = _probed_lifetime_scan
    refreshed: Callable[..., ScanResult] = _refreshed_lifetime_scan


def warm_up_arguments() -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """Small arguments of the types the policies pass: the refreshed scan's, and the
    probed scan's for each way LAS costs a host (a point, thresholds on the point
    exit, thresholds on host quantiles)."""
    free = np.zeros((4, 1))
    ties = np.zeros(1, dtype=np.int64)
    one = np.zeros(1)
    host_q = np.zeros((1, 1))
    tracker, model = warm_up_tracker_arrays()
    pool = (free, free, np.zeros(1, dtype=np.bool_), np.ones(4, dtype=np.bool_), np.ones(4))
    request = (1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    preferred = (one, True, NO_GUARD_TEST)
    probed = [
        (pool, request, preferred, (one, one, use_thresholds, one, host_q, use_host_q), ties, 0,
         no_stranding())
        for use_thresholds, use_host_q in ((False, False), (True, False), (True, True))
    ]  # fmt: skip
    refreshed = (
        pool, request, preferred, one, ties, 0, np.zeros((2, 1)), np.full((2, 1), -1), 0, tracker,
        model, no_stranding(),
    )  # fmt: skip
    return refreshed, probed


def warm_up_lifetime_scan() -> None:
    """Compile (or load) both scans before anything is timed; resolve ``ScanDirect``."""
    refreshed, probed = warm_up_arguments()
    for args in probed:
        _probed_lifetime_scan(*args)
    install_entry_point(ScanDirect, "probed", _probed_lifetime_scan, probed[-1])
    _refreshed_lifetime_scan(*refreshed)
    install_entry_point(ScanDirect, "refreshed", _refreshed_lifetime_scan, refreshed)
