"""The lifetime scan with a cost tolerance, compiled: hosts whose LAS cost is within
``cost_tolerance`` of the least tie, and Best Fit decides among them.

``kernels._floored_lifetime_scan`` ranks hosts lexicographically by (LAVA's
preference, LAS cost, Best Fit score), so the least LAS cost decides alone
whenever one host has it. With learned lifetimes a host's cost is a sum of
bucket indices over 32 VM quantiles spread over days, and a difference of a
few buckets in that sum is below what the prediction can tell; ranking on it
packs by noise. Here every host within the tolerance of the least cost ties,
as the numpy pipeline ties them (``framework.Policy.place`` with the LAS
scorer's ``tie_tolerance``), and the result is the pipeline's: the hosts
with the least preference; among them those whose cost, the stranded host
time counted in, is at most the least such cost plus the tolerance; among
those the least Best Fit score; its ties ascending.

The tolerance breaks the exact comparisons the two-pass scan is built on
(LAS's best level, then the stranded count only where it could change the
choice), so this scan counts stranded host time in its single pass, for
each host whose LAS cost alone leaves it within the tolerance of the best
so far. Floors, the probe and the refresh work as in the exact scan: a
floor or the probe's cost plus the tolerance bounds what can still tie.

Under a waste guard (``waste.WasteGuard``) the scan runs unguarded, and
tests in the same call whether its choice is the guarded one: every tie,
and a host of the least cost, within the guard's step of waste
(``waste.all_within``), measured against a bar of 0. Only when that fails
does the policy score every host's level against the real bar, and only
when the ties or that host fail there too does it scan again with the
levels (``lifetime_policy.LifetimePolicy.place``). The test runs in the
scan's call, not one of its own, since on most placements it is all the
guard costs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from lavad.core.cluster import FloatArray, IntArray
from lavad.core.placement.kernels import (
    Floors,
    LasInput,
    ModelArrays,
    ScanPool,
    TrackerArrays,
    _bestfit_score,
    _costed,
    _fits,
    _kept_floor,
    _present_weights,
    _probe_bound,
    _refresh_host,
    _scan_inputs,
    _tie_in,
    by_host_quantiles,
    install_entry_point,
    lifetime_warm_up_arguments,
    no_floors_nor_refresh,
)
from lavad.core.placement.strand_kernels import Stranding, host_strand_count
from lavad.core.placement.waste import NO_GUARD_TEST, GuardTest, all_within

# The scan's request: hosts to scan, the demand's four resources, the fit
# tolerance, now, the VM's predicted lifetime, and the cost tolerance.
TolerantRequest = tuple[int, float, float, float, float, float, float, float, float]
# LAVA's preference (or nothing, with False), and the guard's test.
GuardedPreference = tuple[FloatArray, bool, GuardTest]
# (count, best preference, least LAS cost, best Best Fit score, a host of that
# least cost at that preference or -1 when none fits, and whether the ties and
# that host are all within the guard's step): the waste guard keeps the
# choice without scoring every host only if that host passes it too.
ScanResult = tuple[int, float, float, float, int, bool]


@numba.njit(cache=True, nogil=True)
def _tolerant_scan(
    pool: ScanPool,
    request: TolerantRequest,
    preferred: GuardedPreference,
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

    The arguments are ``kernels._floored_lifetime_scan``'s, the request
    with the cost tolerance last and the preference with the guard's test.
    Returns ``ScanResult`` and the tied hosts, ascending, in ``ties[:count]``.
    """
    free, inv_capacity, unschedulable, present, weights = pool
    n, d0, d1, d2, d3, fit_tolerance, now, lifetime, cost_tolerance = request
    preference, use_preference, guard = preferred
    host_exit = las[0]
    # Unpacked once, as in the exact scan (its reference counts).
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
        kept = _kept_floor(h, floor_epoch, floor_stamp, stamp, epoch, use_floor)
        if kept and floor[h] > cap:
            continue
        if kept and now <= exact_until[h]:
            c = float(floor[h])  # ``_costed``'s reuse, without its unpacking
        else:
            # As in the exact scan: a host kept from an earlier scan of the
            # epoch is costed in full, so its floor becomes its exact cost.
            c = _costed(h, las, now, start, floors, np.inf if kept else cap, kept)
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
        score = _bestfit_score(free, inv_capacity, h, d0, d1, d2, d3, w0, w1, w2, w3)
        best_s, count = _tie_in(score, best_s, h, ties, count)
    measure, step, test = guard
    within = True
    if test and count > 0 and least_host >= 0:
        within = all_within(
            free, inv_capacity, present, ties, count, least_host, demand, measure, step
        )
    return count, best_p, least, best_s, least_host, within


@numba.njit(cache=True, nogil=True)
def _probed_tolerant_scan(
    pool: ScanPool,
    request: TolerantRequest,
    preferred: GuardedPreference,
    las: LasInput,
    ties: IntArray,
    probe: int,
    strand: Stranding,
) -> ScanResult:
    """``_tolerant_scan`` without floors or a refresh (a host's point exit, or a point
    lifetime)."""
    no_floors, no_tracker, no_model = no_floors_nor_refresh()
    return _tolerant_scan(
        pool, request, preferred, las, ties, probe, no_floors, False, no_tracker, no_model, strand
    )


@numba.njit(cache=True, nogil=True)
def _refreshed_tolerant_scan(
    pool: ScanPool,
    request: TolerantRequest,
    preferred: GuardedPreference,
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
    """``_tolerant_scan`` by the host quantiles, with floors, refreshing the hosts'
    quantiles as it reaches them (``kernels._refreshed_lifetime_scan``'s arguments)."""
    las, floors = by_host_quantiles(thresholds, floor, floor_marks, epoch, tracker)
    return _tolerant_scan(
        pool, request, preferred, las, ties, probe, floors, True, tracker, model, strand
    )


class TolerantDirect:
    """The tolerant scans' entry points (``kernels.entry_point``), set by
    ``warm_up_tolerant``; until then, the dispatchers."""

    probed: Callable[..., ScanResult] = _probed_tolerant_scan
    refreshed: Callable[..., ScanResult] = _refreshed_tolerant_scan


def _with_tolerance(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """An exact scan's warm-up arguments with a cost tolerance added to the request
    and the guard's test to the preference."""
    return (args[0], (*args[1], 1.0), (*args[2], NO_GUARD_TEST), *args[3:])


def warm_up_tolerant() -> None:
    """Compile (or load) both scans before anything is timed; resolve ``TolerantDirect``."""
    refreshed, probed = lifetime_warm_up_arguments()
    for args in probed:
        _probed_tolerant_scan(*_with_tolerance(args))
    install_entry_point(
        TolerantDirect, "probed", _probed_tolerant_scan, _with_tolerance(probed[-1])
    )
    _refreshed_tolerant_scan(*_with_tolerance(refreshed))
    install_entry_point(
        TolerantDirect, "refreshed", _refreshed_tolerant_scan, _with_tolerance(refreshed)
    )
