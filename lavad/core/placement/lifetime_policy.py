"""LAS and LAVA placement in one compiled pass over the hosts (``lifetime_scan``).

The policies stay the numpy pipeline of ``framework.Policy`` (filters, then
the lexicographic scorers preference -> LAS -> Best Fit, the preference
being the deployment affinity and LAVA's classes, either or both); this
subclass only computes the same decision faster where the pipeline's
general path would run a dozen numpy passes per request: with the default
filters, the preference (one key per host, as its scorer writes it) goes to
one compiled scan that filters, costs LAS and Best Fit and collects the
ties, in the pipeline's floating-point order. The decision, its tie count,
its scores and the seeded draw are the pipeline's; a test holds them equal
on replayed states. A request's anti-affinity reaches the scan as hosts
marked unschedulable for that request alone (the hosts already at its
deployment's limit, as the anti-affinity filter blocks them), so pools whose
every request has a limit (DLRM's instances) keep the scan. Anything else
(other filters, no host fitting, whose explanation the pipeline gives) goes
to the pipeline.
"""

from __future__ import annotations

import numpy as np

from lavad.core.cluster import FIT_TOLERANCE, BoolArray, ClusterState, FloatArray
from lavad.core.placement.affinity import DeploymentAffinity
from lavad.core.placement.bestfit import BestFitScore
from lavad.core.placement.floor_sets import FloorSets
from lavad.core.placement.framework import (
    DEFAULT_FILTERS,
    Placed,
    PlacementHooks,
    PlacementRequest,
    PlacementResult,
    Policy,
    ScorePlugin,
    scan_pool,
    unschedulable_for,
)
from lavad.core.placement.kernels import warm_up_lifetime
from lavad.core.placement.lifetime import LAS_BUCKETS_S, LasTemporalCost, Prediction
from lavad.core.placement.lifetime_scan import ScanDirect, ScanResult, warm_up_lifetime_scan
from lavad.core.placement.strand_kernels import Stranding, no_stranding
from lavad.core.placement.stranding_cost import LasStrandingCost
from lavad.core.placement.tolerance_rule import StrandingTolerance
from lavad.core.placement.waste import NO_GUARD_TEST, WasteGuard

_NO_THRESHOLDS: FloatArray = np.zeros(0)
_NO_HOST_QUANTILES: FloatArray = np.zeros((0, 0))
_NO_STRANDING: Stranding = no_stranding()


class LifetimePolicy(Policy):
    """``Policy`` for [preference,] LAS, Best Fit scorers, with the compiled scan."""

    def __init__(
        self,
        name: str,
        scorers: tuple[ScorePlugin, ...],
        rng: np.random.Generator,
        *,
        random_ties: bool = True,
        hooks: PlacementHooks | None = None,
        compiled: bool = True,
        tolerance_rule: StrandingTolerance | None = None,
    ) -> None:
        super().__init__(name, scorers, rng, random_ties=random_ties, hooks=hooks)
        # Sets the LAS scorer's tolerance from the CPU the pool strands, or None.
        self.tolerance_rule = tolerance_rule
        *first, las, best_fit = scorers
        if not isinstance(las, LasTemporalCost) or not isinstance(best_fit, BestFitScore):
            raise TypeError("a lifetime policy's last scorers are LAS and Best Fit")
        if len(first) > 1:
            raise TypeError("a lifetime policy has at most one scorer above LAS")
        self.preference = first[0] if first else None
        # A waste guard above LAS (and above the preference, which it
        # wraps): the scan runs unguarded first, and again with the guard's
        # levels only when a tied choice would add more waste than the
        # tolerance; the decision is the guarded pipeline's either way.
        self.guard = self.preference if isinstance(self.preference, WasteGuard) else None
        scored = self.guard.below if self.guard is not None else self.preference
        # The deployment affinity alone (LAS's default): its levels are the
        # key, kept between placements (``DeploymentAffinity.levels``), which
        # the scan reads where they are.
        self._affinity = (
            scored if isinstance(scored, DeploymentAffinity) and scored.below is None else None
        )
        self._levels: FloatArray = np.zeros(0)
        self.las = las
        # LAS counting stranded host time: the scan counts it itself.
        self.stranding = las if isinstance(las, LasStrandingCost) else None
        if self.guard is not None and self.stranding is not None:
            raise TypeError("a lifetime policy takes a waste guard or the stranding cost, not both")
        self.best_fit = best_fit
        self.scan = compiled
        # The tracker's settings are fixed: whether LAS costs hosts by their quantiles.
        self._by_host_quantiles = las.tracker.uses_host_quantiles
        # The host the scan costs first (its last choice): only a bound, for speed.
        self._probe = -1
        # Per host, a lower bound of its LAS cost from earlier scans (host
        # quantiles only), valid in the epoch it names while the host's
        # quantiles keep the stamp it names (``lifetime_scan``),
        # one set per recent thresholds array (``floor_sets``).
        self._floors = FloorSets()
        if compiled:
            # Compile (or load from numba's cache) before the first placement is timed.
            warm_up_lifetime()
            warm_up_lifetime_scan()

    def place(self, cluster: ClusterState, request: PlacementRequest) -> PlacementResult:
        n = cluster.n_hosts
        rule = self.tolerance_rule
        if rule is not None and request.now >= rule.next_sample:
            # Before either path decides: the pipeline reads the same scorer's tolerance.
            rule.update(cluster, request.now)
        if self.stranding is not None:
            # Every request enters the mix, whichever path decides it (under
            # LAVA the pipeline stops before LAS when no host fits).
            self.stranding.observe(request)
        if not self.scan or n == 0 or self.filters != DEFAULT_FILTERS:
            return super().place(cluster, request)
        # Once for every buffer this placement uses (the blocked copy, the key,
        # the ties; the guard's rescan's key).
        self._grow_buffers(n)
        unschedulable = unschedulable_for(cluster, request, self._blocked)
        guard = self.guard
        preference = guard.below if guard is not None else self.preference
        if guard is not None:
            guard.observe(request)
        if self._affinity is not None:
            key = self._affinity.levels(cluster, request)
        elif preference is not None:
            # Whole, as below: these preferences (the affinity, LAVA's, or
            # both) write only the first ``n`` entries, all the scan reads.
            key = self._key
            preference.score(cluster, request, key, self._scratch)
        else:
            # The scan reads no preference (the guard's rescan writes its
            # levels into the first ``n``), and no host past ``n`` in the
            # buffers: whole, they save the three slices of ``_buffers``.
            key = self._key
        tracker = self.las.tracker
        tracker.refresh(cluster, request.now)
        prediction = tracker.prediction_for(request)
        count, best_p, best_c, best_s, least_host, within = self._scan(
            cluster, request, key, preference is not None, prediction, guard, unschedulable
        )
        rescanned = False
        # The unguarded choice is the guarded one when the guard passes every
        # tie and a host of the least LAS cost (at the best preference): the
        # least cost among the hosts the guard passes is then that same least
        # cost, so the hosts within the cost tolerance of it are the same less
        # those the guard refuses, and the ties, the best Best Fit among them,
        # are all still there. The scan has tested this itself (``within``).
        if guard is not None and count and not (least_host >= 0 and within):
            if len(self._levels) < n:
                self._levels = np.zeros(len(self._key))
            levels = self._levels[:n]
            guard.levels(cluster, request, levels)
            # The scan's test measured against a bar of 0; against the real
            # bar the same hosts may all be at level 0 still, and then the
            # unguarded choice stands as argued above.
            if least_host < 0 or levels[self._ties[:count]].any() or levels[least_host]:
                rescanned = True
                # Into the policy's own buffer: the affinity's key is only read.
                packed = self._key
                below = key[:n] if preference is not None else None
                guard.pack(levels, below, packed[:n])
                count, best_p, best_c, best_s, _, _ = self._scan(
                    cluster, request, packed, True, prediction, None, unschedulable
                )
        if count == 0:
            # No host passed the default filters the scan applies: the
            # pipeline would score every host only to find none left.
            return self._explain_unfit(cluster, request)
        host = self._probe = self._tied_host(count)
        scores: dict[str, float] = {}
        if guard is not None:
            # The pipeline's key: the guard's level (0 unless rescanned) packed
            # above the preference's best.
            scores[guard.name] = best_p if preference is not None or rescanned else 0.0
        elif preference is not None:
            scores[preference.name] = best_p
        scores[self.las.name] = best_c
        scores[self.best_fit.name] = best_s
        return Placed(host=host, ties=count, scores=scores)

    def _scan(
        self,
        cluster: ClusterState,
        request: PlacementRequest,
        key: FloatArray,
        has_preference: bool,
        prediction: Prediction,
        guard: WasteGuard | None,
        unschedulable: BoolArray,
    ) -> ScanResult:
        """The compiled scan: filters, then (preference,) LAS, Best Fit; ties into ``_ties``.

        Returns ``lifetime_scan.ScanResult``: (count, best preference, least
        LAS cost, best Best Fit score, a host of that least cost or -1, and
        whether ``guard`` passes the ties and that host; True without one).
        """
        n = cluster.n_hosts
        tracker = self.las.tracker
        now = request.now
        thresholds = prediction.thresholds
        d0, d1, d2, d3 = request.demand
        free, inv_capacity, _, present, weights = scan_pool(cluster, self.best_fit)
        pool = (free, inv_capacity, unschedulable, present, weights)
        # LAS costs within the scorer's tolerance of the least tie; 0: exact.
        tolerance = self.las.tie_tolerance
        scanned = (n, d0, d1, d2, d3, FIT_TOLERANCE, now, prediction.lifetime_s, tolerance)
        preferred = (key, has_preference, NO_GUARD_TEST if guard is None else guard.scan_test())
        if thresholds is not None and self._by_host_quantiles:
            floors = self._floors
            index, epoch = floors.for_scan(thresholds, now, n)
            # Grows the tracker's arrays first: the stranded count reads the
            # host quantiles the scan refreshes, so the same array.
            tracker_arrays, model_arrays = tracker.quantile_refresh(n)
            strand = self._strand(cluster, request)
            # ``lifetime_scan._refreshed_lifetime_scan`` without numba's type
            # dispatch (the types its warm-up compiled, checked on the first
            # call): the scan, bringing each stale host's quantiles up to date
            # as it reaches them, costing the previous choice first to skip
            # hosts that cost more.
            return ScanDirect.refreshed(
                pool,
                scanned,
                preferred,
                thresholds,
                self._ties,
                self._probe,
                floors.floors[index],
                floors.marks[index],
                epoch,
                tracker_arrays,
                model_arrays,
                strand,
            )
        # As above, by the hosts' point exits (unclipped: the scan takes
        # max(exit, now) itself).
        las = (
            tracker.hosts.latest(n),
            _NO_THRESHOLDS if thresholds is None else thresholds,
            thresholds is not None,
            LAS_BUCKETS_S,
            _NO_HOST_QUANTILES,
            False,
        )
        strand = self._strand(cluster, request)
        return ScanDirect.probed(pool, scanned, preferred, las, self._ties, self._probe, strand)

    def _strand(self, cluster: ClusterState, request: PlacementRequest) -> Stranding:
        """What the scan counts of stranded host time: nothing without the stranding cost,
        or before its pool has a request mix."""
        stranding = self.stranding
        if stranding is None:
            return _NO_STRANDING
        strand = stranding.kernel_input(request, stranding.scan_exits(cluster))
        return _NO_STRANDING if strand is None else strand
