"""GPA, the Gaussian Percentile Approximation fit test (Janus and Rzadca, SoCC'17).

A VM fits a host iff, with the VM added, the normal approximation of the
host's total usage N(sum mu_i, sum sigma_i^2) exceeds the capacity c with
probability at most rho (Algorithm 1: FitBin = rho - (1 - F(c)) >= 0).
With z = Phi^-1(1 - rho) that is the quantile form used here,

    sum mu_i + z * sqrt(sum sigma_i^2) <= c,

which needs no CDF per host and stays exact when the variance is 0.

Best Fit (the paper: "the minimal among non-negative FitBin results") takes
the host whose overflow probability after the placement is largest, i.e.
whose standardised headroom h = (c - mu') / sigma' is smallest. Ranking by h
is the same order, and keeps apart hosts whose overflow probability is far
below rho, where rho - P would round to rho for all of them. A host with no
variance (every VM still on the prior) would have h infinite; sigma' is
floored at ``SIGMA_FLOOR`` x c, so such hosts rank by mean headroom, the
classic Best Fit, and no score is infinite (the pipeline reads an infinite
best score as "nothing fits").

The math is shared with the offline packer (``evaluation/stochastic_packing.py``); the
plugins below are the live pipeline's: ``GpaFilter`` for the fit, and
``GpaBestFitScore`` (or ``FirstFitScore``) to rank, on the host sums of
``lavad.models.usage.hosts.HostUsage``, which ``UsageHooks`` keep up to date
as the engine books and releases VMs.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Final

import numpy as np
from scipy.special import ndtr

from lavad.core.cluster import (
    FIT_TOLERANCE,
    N_RESOURCES,
    BoolArray,
    ClusterState,
    FloatArray,
    VmRecord,
)
from lavad.core.migrations.relief_rule import OverflowEvidence, ReliefConfig
from lavad.core.placement.framework import (
    Booking,
    ClusterListener,
    Notice,
    NumpyScorer,
    PlacementRequest,
)
from lavad.models.usage.hosts import FOURTH, MEAN, THIRD, VARIANCE, HostUsage
from lavad.models.usage.margin import HostWindow, TailCalibration
from lavad.models.usage.moments import CPU, MEMORY, USAGE_RESOURCES
from lavad.models.usage.tail import effective_variance, tail_factor
from lavad.streams.schema import UsageSample

# The cluster row of each usage resource (cores, memory_gib).
CLUSTER_ROW: Final = {CPU: 0, MEMORY: 1}
SIGMA_FLOOR: Final = 1e-9


def quantile_factor(rho: float) -> float:
    """z = Phi^-1(1 - rho): how many standard deviations the mean may sit below c."""
    if not (isinstance(rho, float | int) and 0.0 < rho < 1.0):
        raise ValueError(f"rho must be in (0, 1), got {rho!r}")
    return NormalDist().inv_cdf(1.0 - rho)


def overflow_probability(
    mean: FloatArray | float, variance: FloatArray | float, capacity: FloatArray | float
) -> FloatArray:
    """P(N(mean, variance) > capacity), elementwise; a point mass when the variance is 0."""
    mean_a = np.asarray(mean, dtype=np.float64)
    sd = np.sqrt(np.maximum(np.asarray(variance, dtype=np.float64), 0.0))
    excess = mean_a - np.asarray(capacity, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        smooth = ndtr(excess / sd)
    probability: FloatArray = np.where(sd > 0, smooth, (excess > 0).astype(np.float64))
    return probability


def gpa_fits(
    mean: FloatArray,
    variance: FloatArray,
    capacity: FloatArray | float,
    z: float,
    tolerance: float = 0.0,
) -> BoolArray:
    """The GPA fit of bins whose totals (with the item added) are ``mean`` and ``variance``."""
    load = mean + z * np.sqrt(np.maximum(variance, 0.0))
    fits: BoolArray = load <= np.asarray(capacity) + tolerance
    return fits


def standardized_headroom(
    mean: FloatArray, variance: FloatArray, capacity: FloatArray | float
) -> FloatArray:
    """(c - mean) / sigma, sigma floored at SIGMA_FLOOR * c: GPA Best Fit's rank (lower first)."""
    cap = np.asarray(capacity, dtype=np.float64)
    floor = SIGMA_FLOOR * cap
    headroom: FloatArray = (cap - mean) / np.sqrt(np.maximum(variance, 0.0) + floor * floor)
    return headroom


# ------------------------------------------------------------ live plugins


def _request_scale(request: PlacementRequest) -> tuple[float, float]:
    return (request.demand[0], request.demand[1])


def _after_placement(
    usage: HostUsage,
    request: PlacementRequest,
    resource: int,
    n: int,
    calibration: TailCalibration | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Per host, the mean sum and the variance GPA reads, with the request's VM added.

    Without a calibration the variance is the paper's sum (times the learned
    covariance factor); with one, the effective variance of the pool's
    percentile method and margin (``tail.effective_variance``).
    """
    added = usage.contribution(request.vm_id, _request_scale(request))
    usage.ensure_columns(n)
    mean = usage.mean_sum[resource, :n] + added[MEAN + resource]
    variance = (
        usage.variance(resource, n) + added[VARIANCE + resource] * usage.variance_factor[resource]
    )
    if calibration is None:
        return mean, variance
    third = usage.third_sum[resource, :n] + added[THIRD + resource]
    fourth = usage.fourth_sum[resource, :n] + added[FOURTH + resource]
    return mean, _effective(calibration, variance, third, fourth)


def _effective(
    calibration: TailCalibration,
    variance: FloatArray,
    third: FloatArray,
    fourth: FloatArray,
) -> FloatArray:
    rho = calibration.rho
    return effective_variance(
        calibration.method,
        quantile_factor(rho),
        rho,
        calibration.margin,
        variance,
        third,
        fourth,
    )


class GpaFilter:
    """Blocks hosts where the VM would push P(usage > capacity) above rho.

    ``resources``: which usage resources are overcommitted this way (CPU by
    default: the paper's rate-limited resource; running out of memory kills,
    so memory is better left to a hard fit on the request).

    When the test passes no host the earlier filters left (it runs last), an
    empty host whose capacity holds the request still takes the VM: no host
    is safer for it than one it has alone, and refusing would stop the pool
    placing anything while its learned margin is wide (after a regime change
    the margin can reach its cap, where even a lone VM fails the test;
    ``docs/results/gpa-drift.md``). The paper's test refuses instead; this
    only turns a "nothing fits" into a placement, so every decision the test
    made before is unchanged.
    """

    name = "gpa"

    def __init__(
        self,
        usage: HostUsage,
        rho: float,
        *,
        resources: tuple[int, ...] = (CPU,),
        calibration: TailCalibration | None = None,
    ) -> None:
        unknown = [r for r in resources if r not in CLUSTER_ROW]
        if unknown or not resources:
            raise ValueError(f"resources must be a non-empty subset of {USAGE_RESOURCES} indices")
        if calibration is not None and calibration.rho != rho:
            raise ValueError(f"calibration is for rho {calibration.rho}, the filter for {rho}")
        self.usage = usage
        self.rho = rho
        self.z = quantile_factor(rho)
        self.resources = resources
        # The pool's percentile method and margin (CPU only: it is learned
        # from realised CPU usage).
        self.calibration = calibration

    def apply(self, cluster: ClusterState, request: PlacementRequest, blocked: BoolArray) -> None:
        n = cluster.n_hosts
        refused = np.zeros(n, dtype=np.bool_)
        for resource in self.resources:
            calibration = self.calibration if resource == CPU else None
            mean, variance = _after_placement(self.usage, request, resource, n, calibration)
            capacity = cluster.capacity[CLUSTER_ROW[resource], :n]
            fits = gpa_fits(mean, variance, capacity, self.z, FIT_TOLERANCE)
            np.logical_or(refused, ~fits, out=refused)
        if (blocked | refused).all():
            np.logical_and(refused, ~self._alone(cluster, request), out=refused)
        np.logical_or(blocked, refused, out=blocked)

    def _alone(self, cluster: ClusterState, request: PlacementRequest) -> BoolArray:
        """The empty hosts whose capacity holds the request in every resource the test reads."""
        n = cluster.n_hosts
        alone: BoolArray = cluster.vm_count[:n] == 0
        for resource in self.resources:
            row = CLUSTER_ROW[resource]
            holds = cluster.capacity[row, :n] >= request.demand[row] - FIT_TOLERANCE
            np.logical_and(alone, holds, out=alone)
        return alone


class GpaBestFitScore(NumpyScorer):
    """GPA Best Fit on CPU: the smallest standardised headroom after the placement."""

    name = "gpa_bestfit"

    def __init__(self, usage: HostUsage, calibration: TailCalibration | None = None) -> None:
        self.usage = usage
        self.calibration = calibration

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        n = cluster.n_hosts
        mean, variance = _after_placement(self.usage, request, CPU, n, self.calibration)
        # A host without CPU (capacity 0) is blocked by the filter; keep its score finite.
        capacity = np.maximum(cluster.capacity[CLUSTER_ROW[CPU], :n], FIT_TOLERANCE)
        out[:] = standardized_headroom(mean, variance, capacity)


class RequestFitFilter:
    """Hard fit on the requested amounts of some resources only (those GPA does not overcommit).

    ``FitFilter`` checks every resource, cores included, which would forbid
    the CPU overcommitment GPA is for.
    """

    name = "request_fit"

    def __init__(self, resource_rows: tuple[int, ...] = (1, 2, 3)) -> None:
        if any(not 0 <= row < N_RESOURCES for row in resource_rows):
            raise ValueError(f"resource rows must be in 0..{N_RESOURCES - 1}")
        self.resource_rows = resource_rows

    def apply(self, cluster: ClusterState, request: PlacementRequest, blocked: BoolArray) -> None:
        n = cluster.n_hosts
        for row in self.resource_rows:
            amount = request.demand[row]
            if amount:
                np.logical_or(blocked, cluster.free[row, :n] < amount - FIT_TOLERANCE, out=blocked)


class UsageHooks(ClusterListener):
    """Policy hooks that keep ``HostUsage`` in step with the engine's bookings.

    They also take the pool's usage stream (``observe``): each sample moves
    its VM's estimate and its host's sums in O(1), and when a host's
    predicted P(CPU usage > capacity) crosses above ``rho`` a ``host``
    notice ``overflow_risk`` is queued (once per crossing; it re-arms when
    the probability falls back to rho or below), which the engine publishes
    on the repredictions output. A VM without samples stays on the prior.

    With ``calibrate``, they learn how much the host sums really vary: for
    each closed window and each host whose VMs all had a reading and all
    count by their own estimates, the squared gap between the realised sum
    and the predicted mean sum, against the predicted variance sum. The
    decayed ratio of the two (half-life ``calibration_half_life`` host
    windows, applied once ``MIN_CALIBRATION`` host windows are in, never
    below 1) becomes ``usage.variance_factor`` for CPU. Independent VMs give
    about 1; VMs that move together (the time-aligned evaluation's case)
    give more, and GPA then packs as if their covariances were counted. The
    offline ``gpa-cov`` sums aligned histories instead; live, a host's mix
    changes too often for that, and a pooled factor needs no history.

    They also measure what GPA promises: the *realised* overflow frequency.
    Samples fall into ``interval_s`` windows; when a window closes (a sample
    of a later one arrives), each host with readings in it counts one
    window, and one overflow if its VMs' summed CPU usage (mean over the
    sample x the VM's requested cores) exceeded its capacity. A VM with no
    reading in a window is missing from that sum, so this can only
    undercount.

    With a ``tail`` (``TailCalibration``), the same windows keep GPA's
    promise honest: each host keeps the promise made at its last placement
    or release (its mean sum and cumulant sums then, once every VM counts by
    its own estimate), and each closed window of a host whose VMs all
    reported scores the realised sum against it. The calibration learns the
    pool's margin and percentile method from these (``models/usage/
    margin.py``), and the filter, the score and the risk notices read the
    host's variance through them. Until the pool has scored enough host
    windows for a learned margin to be a conformal bound ((1 - rho) / rho:
    19 at rho 0.05, 99 at 0.01), they read it through Cantelli's
    distribution-free bound instead of plain GPA's normal percentile. The
    margin replaces the variance factor's job (both widen the excess), so a
    pool learns one or the other.

    With relief enabled (``enable_relief``), each closed window of a host
    whose VMs all reported is also one outcome (overflowed or not) for the
    relief rule (``core/migrations/relief_rule.py``); ``relief_due`` lists
    the hosts whose recent outcomes reject rho, and a move off or onto a
    host clears its outcomes (they were about another mix of VMs).
    """

    MIN_CALIBRATION = 30

    def __init__(
        self,
        usage: HostUsage,
        rho: float | None = None,
        *,
        interval_s: float = 300.0,
        calibrate: bool = True,
        calibration_half_life: float = 2000.0,
        tail: TailCalibration | None = None,
    ) -> None:
        if rho is not None:
            quantile_factor(rho)  # validates rho
        if tail is not None and tail.rho != rho:
            raise ValueError(f"the tail calibration is for rho {tail.rho}, the hooks for {rho}")
        if tail is not None and calibrate:
            raise ValueError("learn the margin (tail) or the variance factor (calibrate), not both")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.usage = usage
        self.rho = rho
        self.interval_s = interval_s
        self._notices: list[Notice] = []
        self._at_risk: set[int] = set()
        self._window_end = -math.inf
        self._window_cores: dict[int, float] = {}
        self._window_vms: dict[int, set[str]] = {}
        self.host_windows = 0
        self.host_overflows = 0
        if not calibration_half_life > 0:
            raise ValueError(f"calibration_half_life must be > 0, got {calibration_half_life}")
        self.calibrate = calibrate
        self._decay = 0.5 ** (1.0 / calibration_half_life)
        self._squared_gap = 0.0
        self._predicted_variance = 0.0
        self.calibration_windows = 0
        self.tail = tail
        # Per host column: (mean, variance, third, fourth) CPU sums when the
        # host last changed with every VM on its own estimate.
        self._promises: dict[int, tuple[float, float, float, float]] = {}

    observes_usage = True
    # The relief rule's outcomes per host (None: relief off). A class default,
    # so state saved before relief existed still reads as "off".
    relief_evidence: OverflowEvidence | None = None
    # Hosts whose promise is renewed when the current window closes: a VM on
    # them changed regime (the drift detector restarted its moments). Kept
    # against the old regime's sums, every later window would score the
    # change again and hold the pool's margin at its cap until the host
    # changed; renewed at once, the window that revealed it would be scored
    # against moments that include it. Immutable, a class default as above.
    _renewals: frozenset[int] = frozenset()

    def enable_relief(self, config: ReliefConfig) -> None:
        """Feed the relief rule every fully reported host window from now on."""
        if self.rho is None:
            raise ValueError("relief needs the policy's rho")
        if config.enabled and self.relief_evidence is None:
            self.relief_evidence = OverflowEvidence(self.rho, config)

    def relief_due(self) -> list[int]:
        """Host columns whose recent windows reject rho (re-checked by the rule), ascending."""
        evidence = self.relief_evidence
        return [] if evidence is None else evidence.due_hosts()

    @property
    def realised_overflow(self) -> float:
        """Overflowed host-windows / host-windows observed (0 before any)."""
        return self.host_overflows / self.host_windows if self.host_windows else 0.0

    def summary(self) -> dict[str, Any]:
        """What GPA promised against what happened: the realised CPU overflow frequency."""
        summary: dict[str, Any] = {
            "usage_state": {
                "unplaced_vms": self.usage.unplaced,
                "evicted": self.usage.evicted,
            },
            "cpu_overflow": {
                "host_windows": self.host_windows,
                "overflowed": self.host_overflows,
                "frequency": self.realised_overflow,
            },
        }
        if self.tail is not None:
            summary["cpu_tail"] = self.tail.explain()
        return summary

    def _promise(self, host: int) -> None:
        """Record what the host promises now, if every VM on it counts by its estimate."""
        usage = self.usage
        if self.tail is None:
            return
        if usage.vm_count[host] and not usage.prior_count[host]:
            self._promises[host] = (
                float(usage.mean_sum[CPU, host]),
                max(float(usage.variance_sum[CPU, host]), 0.0) * usage.variance_factor[CPU],
                float(usage.third_sum[CPU, host]),
                float(usage.fourth_sum[CPU, host]),
            )
        else:
            self._promises.pop(host, None)

    def _score_window(self, cluster: ClusterState) -> None:
        """Feed the tail calibration this window's hosts that kept a promise and fully reported."""
        tail = self.tail
        if tail is None:
            return
        rho = tail.rho
        z = quantile_factor(rho)
        methods = tail.settings.methods
        row = CLUSTER_ROW[CPU]
        hosts = []
        for host, cores in self._window_cores.items():
            promise = self._promises.get(host)
            if promise is None or host >= cluster.n_hosts:
                continue
            if len(self._window_vms.get(host, ())) != int(self.usage.vm_count[host]):
                continue
            mean, variance, third, fourth = promise
            sigma = math.sqrt(variance)
            excess = tuple(
                float(tail_factor(method, z, rho, variance, third, fourth)) * sigma
                for method in methods
            )
            capacity = float(cluster.capacity[row, host])
            if capacity > 0:
                hosts.append(HostWindow(cores, mean, excess, capacity))
        tail.observe(hosts)

    def _record_relief(self, cluster: ClusterState) -> None:
        """This window's outcome of each host whose VMs all reported, for the relief rule."""
        evidence = self.relief_evidence
        if evidence is None:
            return
        row = CLUSTER_ROW[CPU]
        hosts: list[int] = []
        overflowed: list[bool] = []
        for host in sorted(self._window_cores):
            if host >= cluster.n_hosts:
                continue
            if len(self._window_vms.get(host, ())) != int(self.usage.vm_count[host]):
                continue
            hosts.append(host)
            capacity = float(cluster.capacity[row, host])
            overflowed.append(self._window_cores[host] > capacity + FIT_TOLERANCE)
        evidence.record(np.asarray(hosts, dtype=np.int64), np.asarray(overflowed, dtype=np.bool_))

    def _count_window(self, cluster: ClusterState) -> None:
        row = CLUSTER_ROW[CPU]
        usage = self.usage
        self._score_window(cluster)
        self._record_relief(cluster)
        for host, cores in self._window_cores.items():
            if host >= cluster.n_hosts:
                continue
            self.host_windows += 1
            if cores > cluster.capacity[row, host] + FIT_TOLERANCE:
                self.host_overflows += 1
            if self.calibrate:
                seen = self._window_vms.get(host, set())
                complete = len(seen) == int(usage.vm_count[host]) and all(
                    usage.estimated(vm_id, CPU) for vm_id in seen
                )
                predicted = float(usage.variance_sum[CPU, host])
                if complete and predicted > 0:
                    gap = cores - float(usage.mean_sum[CPU, host])
                    self._squared_gap = self._squared_gap * self._decay + gap * gap
                    self._predicted_variance = self._predicted_variance * self._decay + predicted
                    self.calibration_windows += 1
        if self.calibration_windows >= self.MIN_CALIBRATION and self._predicted_variance > 0:
            usage.variance_factor[CPU] = max(1.0, self._squared_gap / self._predicted_variance)
        self._window_cores.clear()
        self._window_vms.clear()
        if self._renewals:
            for host in sorted(self._renewals):
                self._promise(host)
            self._renewals = frozenset()

    @property
    def next_deadline(self) -> float:
        return math.inf

    def advance(self, cluster: ClusterState, now: float) -> None:
        """No timers: everything happens on bookings and samples."""

    def take_notices(self) -> list[Notice]:
        notices, self._notices = self._notices, []
        return notices

    def on_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: Booking
    ) -> None:
        self.usage.place(record.vm_id, record.host, (record.demand[0], record.demand[1]))
        self._promise(record.host)

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None:
        host = self.usage.remove(record.vm_id)
        if exited:
            # An evicted VM comes back with its history; an exited one is done.
            self.usage.forget(record.vm_id)
        if host is not None:
            self._promise(host)
            self._check(cluster, host, now)

    def on_moved(
        self, cluster: ClusterState, before: VmRecord, after: VmRecord, now: float
    ) -> None:
        # Same VM, same usage: its moments stay, and ``place`` adds its
        # current estimate to the new host.
        old_host = self.usage.remove(before.vm_id)
        self.usage.place(after.vm_id, after.host, (after.demand[0], after.demand[1]))
        if self.relief_evidence is not None:
            for host in (before.host, after.host):
                self.relief_evidence.clear(host)
        if old_host is not None:
            self._promise(old_host)
            self._check(cluster, old_host, now)
        self._promise(after.host)
        self._check(cluster, after.host, now)

    def observe(self, cluster: ClusterState, sample: UsageSample) -> None:
        """Feed one usage sample; a placed VM's host is re-checked against rho."""
        moments = self.usage.moments
        resets = moments.resets
        host = self.usage.observe(sample)
        if host is None:
            return
        if self.tail is not None and host not in self._promises:
            # Its last VM on the prior just got its own estimate.
            self._promise(host)
        end = math.ceil(sample.time / self.interval_s) * self.interval_s
        if end > self._window_end:
            self._count_window(cluster)
            self._window_end = end
        if self.tail is not None and moments.resets != resets:
            self._renewals = self._renewals | {host}
        record = cluster.vms.get(sample.vm_id)
        if record is not None:
            used = sample.cpu.mean * record.demand[0]
            self._window_cores[host] = self._window_cores.get(host, 0.0) + used
            self._window_vms.setdefault(host, set()).add(sample.vm_id)
        self._check(cluster, host, sample.time)

    def _check(self, cluster: ClusterState, host: int, now: float) -> None:
        if self.rho is None or host >= cluster.n_hosts:
            return
        row = CLUSTER_ROW[CPU]
        usage = self.usage
        variance = max(float(usage.variance_sum[CPU, host]), 0.0) * usage.variance_factor[CPU]
        if self.tail is not None:
            variance = float(
                _effective(
                    self.tail,
                    np.asarray(variance),
                    np.asarray(usage.third_sum[CPU, host]),
                    np.asarray(usage.fourth_sum[CPU, host]),
                )
            )
        probability = float(
            overflow_probability(usage.mean_sum[CPU, host], variance, cluster.capacity[row, host])
        )
        if probability > self.rho:
            if host not in self._at_risk:
                self._at_risk.add(host)
                self._notices.append(
                    Notice(
                        now,
                        "host",
                        cluster.host_ids[host],
                        "overflow_risk",
                        {
                            "probability": probability,
                            "rho": self.rho,
                            "mean": float(self.usage.mean_sum[CPU, host]),
                            "variance": variance,
                            "variance_factor": float(usage.variance_factor[CPU]),
                            "capacity": float(cluster.capacity[row, host]),
                            **self._tail_reason(),
                        },
                    )
                )
        else:
            self._at_risk.discard(host)

    def _tail_reason(self) -> dict[str, Any]:
        """Which percentile method and margin the notice's probability is read through."""
        if self.tail is None:
            return {}
        return {"method": self.tail.method, "margin": self.tail.margin}
