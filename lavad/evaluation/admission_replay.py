"""Replay of a deployment trace through an admission policy, and a threshold tuner.

The replay follows section 2.1 on a recorded trace of VM requests and exits,
each labelled with its deployment:

- a deployment's first VM is its arrival: the policy decides; if admitted and
  the VM fits, the deployment joins the cluster;
- later VMs of an admitted deployment are scale-outs, granted while capacity
  allows; a refused one is a scale-out failure (the SLA metric) and its exit
  is ignored;
- a deployment that reaches zero cores has died (death is permanent): the
  next VM with its label arrives as a new deployment. A rejected deployment
  went to another cluster: its VMs are ignored until the trace's own count of
  its VMs drops to zero.

Events before ``start`` are a warm-up: all granted without capacity checks
and no metrics, so the deployments alive at ``start`` (and what the models
learnt of them) are the cluster's initial state. Metrics cover ``[start, end]``.
"""

from __future__ import annotations

import math
import time as wallclock
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lavad.core.admission.cluster import PAPER_HORIZONS_S, ClusterModel, LookaheadGrid
from lavad.core.admission.policies import AdmissionDecision, AdmissionPolicy
from lavad.models.deployments import DeploymentPriors

REQUEST = 1
EXIT = 0


@dataclass(frozen=True, slots=True)
class VmEvent:
    """A VM of ``deployment`` is requested (``kind=REQUEST``) or exits (``EXIT``)."""

    time: float
    kind: int
    deployment: str
    vm_id: str
    cores: float


@dataclass(slots=True)
class ReplayResult:
    policy: str
    threshold: float
    capacity: float
    utilisation: float
    scale_outs: int
    failures: int
    arrivals: int
    admitted: int
    latencies_s: list[float] = field(default_factory=list)
    decisions: list[AdmissionDecision] = field(default_factory=list)

    @property
    def failure_rate(self) -> float:
        return self.failures / self.scale_outs if self.scale_outs else 0.0


def sort_events(events: Sequence[VmEvent]) -> list[VmEvent]:
    """Time order; at equal times exits first (capacity freed before it is asked for)."""
    return sorted(events, key=lambda e: (e.time, e.kind))


def replay(
    events: Sequence[VmEvent],
    policy: AdmissionPolicy,
    priors: DeploymentPriors,
    capacity: float,
    *,
    start: float,
    end: float | None = None,
    refresh_s: float = 3600.0,
    keep_decisions: bool = False,
) -> ReplayResult:
    """Run ``policy`` over time-ordered ``events`` (see ``sort_events``)."""
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    if refresh_s <= 0:
        raise ValueError(f"refresh_s must be positive, got {refresh_s}")
    grid = policy.grid or LookaheadGrid((PAPER_HORIZONS_S[-1],), 1)
    cluster = ClusterModel(priors, grid, capacity)
    stop = math.inf if end is None else end
    trace_alive: dict[str, int] = {}  # the trace's own VM count per label
    incarnation: dict[str, int] = {}
    status: dict[str, bool] = {}  # current incarnation id -> admitted?
    granted: dict[str, tuple[str, float]] = {}  # vm id -> (incarnation, cores)
    result = ReplayResult(policy.name, policy.threshold, capacity, 0.0, 0, 0, 0, 0)
    area = 0.0
    last = start
    next_refresh = start
    for event in events:
        if event.time > stop:
            break
        now = event.time
        if now >= start:
            area += cluster.active_cores * (now - max(last, start))
            last = now
            if now >= next_refresh:
                cluster.refresh(now)
                next_refresh = now + refresh_s
        label = event.deployment
        if event.kind == EXIT:
            trace_alive[label] = trace_alive.get(label, 1) - 1
            held = granted.pop(event.vm_id, None)
            if held is not None and held[0] in cluster.states:
                cluster.scale_in(held[0], now, held[1])
            if trace_alive[label] <= 0:
                _end_incarnation(label, incarnation, status, cluster)
            continue
        trace_alive[label] = trace_alive.get(label, 0) + 1
        current = f"{label}#{incarnation.get(label, 0)}"
        if current in status and status[current] and current not in cluster.states:
            # It died at zero cores: this VM starts a new deployment.
            del status[current]
            incarnation[label] = incarnation.get(label, 0) + 1
            current = f"{label}#{incarnation[label]}"
        if current not in status:
            admitted = True
            if now >= start:
                result.arrivals += 1
                began = wallclock.perf_counter()
                decision = policy.decide(cluster, current, event.cores, now)
                result.latencies_s.append(wallclock.perf_counter() - began)
                if keep_decisions:
                    result.decisions.append(decision)
                admitted = decision.admitted and cluster.active_cores + event.cores <= capacity
                result.admitted += int(admitted)
            status[current] = admitted
            if admitted:
                cluster.add(current, now, event.cores)
                granted[event.vm_id] = (current, event.cores)
            continue
        if not status[current]:
            continue
        if now >= start:
            result.scale_outs += 1
            if cluster.active_cores + event.cores > capacity:
                result.failures += 1
                continue
        cluster.scale_out(current, now, event.cores)
        granted[event.vm_id] = (current, event.cores)
    final = last if end is None else end
    if end is not None and final > last:
        area += cluster.active_cores * (final - last)
    span = final - start
    result.utilisation = area / (capacity * span) if span > 0 else 0.0
    return result


def _end_incarnation(
    label: str, incarnation: dict[str, int], status: dict[str, bool], cluster: ClusterModel
) -> None:
    current = f"{label}#{incarnation.get(label, 0)}"
    if current in cluster.states:
        cluster.remove(current)
    if current in status:
        del status[current]
        incarnation[label] = incarnation.get(label, 0) + 1


@dataclass(frozen=True, slots=True)
class TuneResult:
    threshold: float
    result: ReplayResult
    tried: tuple[tuple[float, float, float], ...]  # (threshold, failure rate, utilisation)


def tune_threshold(
    run: Callable[[float], ReplayResult],
    low: float,
    high: float,
    target: float,
    *,
    iterations: int = 10,
    log_scale: bool = False,
) -> TuneResult:
    """Binary search of a threshold whose replay meets the ``target`` failure rate.

    Assumes the failure rate grows with the threshold (a more permissive
    policy). ``low`` should meet the target; if it does not, it is returned
    anyway with its (violating) result so the caller can see it. ``log_scale``
    bisects in log space (for thresholds spanning decades, e.g. probabilities).
    """
    if not low < high:
        raise ValueError(f"low must be < high, got {low} and {high}")
    if target < 0:
        raise ValueError(f"target must be >= 0, got {target}")
    if log_scale and low <= 0:
        raise ValueError(f"low must be positive with log_scale, got {low}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    tried: list[tuple[float, float, float]] = []

    def attempt(threshold: float) -> ReplayResult:
        outcome = run(threshold)
        tried.append((threshold, outcome.failure_rate, outcome.utilisation))
        return outcome

    results: dict[float, ReplayResult] = {}
    top = attempt(high)
    if top.failure_rate <= target:
        return TuneResult(high, top, tuple(tried))
    results[low] = attempt(low)
    lo, hi = low, high
    for _ in range(iterations):
        mid = math.sqrt(lo * hi) if log_scale else 0.5 * (lo + hi)
        outcome = attempt(mid)
        results[mid] = outcome
        if outcome.failure_rate <= target:
            lo = mid
        else:
            hi = mid
    # On a real trace the failure rate is not quite monotone in the threshold:
    # of the thresholds tried that meet the target, keep the best utilisation.
    feasible = [t for t, r in results.items() if r.failure_rate <= target]
    if not feasible:
        return TuneResult(low, results[low], tuple(tried))
    best = max(feasible, key=lambda t: (results[t].utilisation, t))
    return TuneResult(best, results[best], tuple(tried))


def latency_summary(latencies_s: Sequence[float]) -> tuple[float, float]:
    """Median and 99th percentile, in milliseconds (0, 0 when empty)."""
    if not latencies_s:
        return 0.0, 0.0
    values = np.asarray(latencies_s) * 1e3
    return float(np.median(values)), float(np.percentile(values, 99))
