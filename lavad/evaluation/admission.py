"""Admission control on real deployments: zeroth vs first vs second moment policies.

Protocol, per trace:

1. Read VM requests and exits with their deployment label through the
   project's trace adapters (read-only): ``alibaba-dlrm`` (an app is a
   deployment; instance creations are scale-outs, deletions scale-ins) and
   ``azure-v1-vms`` (a tenant batch is a deployment; see below).
2. Fit the population priors on the deployments seen in the first
   ``fit_fraction`` of the trace's time span (appendix B; ``fit_samples``).
3. Pick the capacity where admission binds: between ``low``, the smallest
   capacity at which rejecting every new deployment meets the target (the
   deployments already there scale too), and ``high``, the peak of active
   cores when everything is admitted, at ``capacity_position`` (0: low, 1: high).
4. Replay the rest of the trace for each policy, its threshold tuned by binary
   search to the target scale-out failure rate; report utilisation (average
   active cores / capacity), the failure rate, and per-decision latency.

``azure-v1-vms``: the encoding keeps no tenant across 300 s bins, so a tenant
batch is the only deployment label. The adapter spreads a batch's VMs evenly
over its bin: the first is the arrival, the others are scale-outs minutes
later. Scale-outs are therefore short-range, which favours policies that look
at the current load; we report it as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from lavad.core.admission import AdmissionPolicy, ZerothMoment, build_admission_policy
from lavad.evaluation.admission_replay import (
    EXIT,
    REQUEST,
    ReplayResult,
    VmEvent,
    latency_summary,
    replay,
    sort_events,
    tune_threshold,
)
from lavad.models.deployments import DeploymentPriors, DeploymentState
from lavad.models.deployments.fit import FitSample, fit_priors
from lavad.streams.adapters.azure_vms import AzureV1Vms
from lavad.streams.adapters.dlrm import AlibabaDlrm
from lavad.streams.schema import VmExit, VmRequest

TraceName = Literal["alibaba-dlrm", "azure-v1-vms"]
_DROPPED = VmEvent(math.nan, REQUEST, "", "", 0.0)
# A deployment whose last VMs (at least this many) exit at one instant was shut down whole
# (appendix B counts 3 VMs).
KILL_MIN_VMS = 3
# Threshold search ranges: zeroth and first are fractions of capacity, second a probability.
SEARCH: dict[str, tuple[float, float, bool]] = {
    "zeroth": (0.05, 1.0, False),
    "first": (0.05, 1000.0, True),
    "second": (1e-6, 0.999, True),
}


def load_vm_events(
    path: Path, trace: TraceName, *, seed: int = 0, max_arrival_s: float | None = None
) -> list[VmEvent]:
    """Time-ordered VM requests and exits labelled with their deployment.

    ``max_arrival_s`` keeps only requests within that many seconds of the first
    one (and their exits), to bound a run's time. VMs that exit when they are
    requested are dropped (they hold no capacity).
    """
    source: AlibabaDlrm | AzureV1Vms
    if trace == "alibaba-dlrm":
        source = AlibabaDlrm(path, seed=seed, pool="eval", view="vms")
    elif trace == "azure-v1-vms":
        source = AzureV1Vms(path, seed=seed, pool="eval")
    else:
        raise ValueError(f"trace must be 'alibaba-dlrm' or 'azure-v1-vms', got {trace!r}")
    owner: dict[str, tuple[str, float, int]] = {}
    events: list[VmEvent] = []
    origin: float | None = None
    for item in source.events():
        if isinstance(item, VmRequest):
            origin = item.time if origin is None else origin
            if max_arrival_s is not None and item.time - origin > max_arrival_s:
                continue
            label = item.deployment or item.vm_id
            owner[item.vm_id] = (label, item.cores, len(events))
            events.append(VmEvent(item.time, REQUEST, label, item.vm_id, item.cores))
        elif isinstance(item, VmExit):
            held = owner.pop(item.vm_id, None)
            if held is None:
                continue
            if item.time <= events[held[2]].time:
                # Zero lifetime: it never held capacity, and at equal times exits
                # sort first, so its exit would precede its request. Drop both.
                events[held[2]] = _DROPPED
                continue
            events.append(VmEvent(item.time, EXIT, held[0], item.vm_id, held[1]))
    return sort_events([e for e in events if e is not _DROPPED])


def fit_samples(
    events: Sequence[VmEvent], until: float, *, arrived_only: bool = True
) -> list[FitSample]:
    """Deployment histories up to ``until``, as fitting samples.

    ``arrived_only`` keeps only deployments that arrived after the first event
    time (the paper drops those present at the start: survivors bias the fit).
    """
    first_time = events[0].time if events else 0.0
    states: dict[str, DeploymentState] = {}
    alive: dict[str, int] = {}
    samples: list[FitSample] = []
    generation: dict[str, int] = {}
    exits_at: dict[str, tuple[float, int]] = {}
    for event in events:
        if event.time >= until:
            break
        label = event.deployment
        key = f"{label}#{generation.get(label, 0)}"
        if event.kind == REQUEST:
            alive[label] = alive.get(label, 0) + 1
            state = states.get(key)
            if state is None:
                states[key] = DeploymentState.arrive(key, event.time, event.cores)
            else:
                state.scale_out(event.time, event.cores)
            continue
        state = states.get(key)
        if state is None:
            continue
        alive[label] = alive.get(label, 1) - 1
        at, count = exits_at.get(key, (math.nan, 0))
        exits_at[key] = (event.time, count + 1 if at == event.time else 1)
        state.scale_in(event.time, event.cores)
        if alive[label] <= 0:
            killed = exits_at[key][1] >= KILL_MIN_VMS
            if not arrived_only or state.arrived > first_time:
                samples.append(FitSample(state, killed))
            del states[key]
            generation[label] = generation.get(label, 0) + 1
    for state in states.values():
        state.advance(until)
        if not arrived_only or state.arrived > first_time:
            samples.append(FitSample(state, False))
    return samples


def offered_load(events: Sequence[VmEvent], start: float) -> tuple[float, float]:
    """Active cores at ``start`` and their peak after it, with every VM granted."""
    active = 0.0
    at_start = math.nan
    peak = 0.0
    for event in events:
        if event.time >= start and math.isnan(at_start):
            at_start = active
        active += event.cores if event.kind == REQUEST else -event.cores
        if event.time >= start:
            peak = max(peak, active)
    return (active if math.isnan(at_start) else at_start), peak


@dataclass(frozen=True, slots=True)
class PolicyScore:
    policy: str
    threshold: float
    utilisation: float
    failure_rate: float
    scale_outs: int
    failures: int
    arrivals: int
    admitted: int
    latency_median_ms: float
    latency_p99_ms: float
    meets_target: bool
    tried: tuple[tuple[float, float, float], ...]


@dataclass(frozen=True, slots=True)
class AdmissionEvaluation:
    trace: str
    capacity: float
    start: float
    end: float
    target_failure_rate: float
    deployments_fitted: int
    priors: dict[str, tuple[float, float]]
    scores: tuple[PolicyScore, ...]

    def gain(self, policy: str, baseline: str = "zeroth") -> float:
        """Relative utilisation gain of ``policy`` over ``baseline``."""
        by_name = {s.policy: s for s in self.scores}
        if policy not in by_name or baseline not in by_name:
            raise ValueError(f"policy and baseline must be among {sorted(by_name)}")
        base = by_name[baseline].utilisation
        return by_name[policy].utilisation / base - 1.0 if base > 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _policy(name: str, threshold: float, moment_args: dict[str, Any]) -> AdmissionPolicy:
    args: dict[str, Any] = {"threshold": threshold}
    if name != "zeroth":
        args.update(moment_args)
    return build_admission_policy(name, args)


@dataclass(frozen=True)
class MomentSettings:
    """The moment policies' own arguments (``first``, ``second``; ``zeroth`` takes none).

    ``horizons_s`` None: the policies' default horizons.
    """

    horizons_s: Sequence[float] | None = None
    steps: int = 100
    marginal_fraction: float = 0.0


def evaluate_admission(
    path: Path,
    trace: TraceName,
    *,
    target_failure_rate: float = 0.01,
    capacity_position: float = 0.5,
    fit_fraction: float = 0.3,
    policies: Sequence[str] = ("zeroth", "first", "second"),
    moments: MomentSettings = MomentSettings(),
    iterations: int = 10,
    max_arrival_s: float | None = None,
    refresh_s: float = 3600.0,
    seed: int = 0,
) -> AdmissionEvaluation:
    """Tune and score each policy on one trace (see the module docstring)."""
    if not 0 < fit_fraction < 1:
        raise ValueError(f"fit_fraction must be in (0, 1), got {fit_fraction}")
    if not 0 <= capacity_position <= 1:
        raise ValueError(f"capacity_position must be in [0, 1], got {capacity_position}")
    events = load_vm_events(path, trace, seed=seed, max_arrival_s=max_arrival_s)
    if not events:
        raise ValueError(f"path {path} holds no VM events")
    first = events[0].time
    last = max(e.time for e in events if e.kind == REQUEST)
    start = first + fit_fraction * (last - first)
    samples = fit_samples(events, start, arrived_only=trace != "alibaba-dlrm")
    priors = fit_priors(samples)
    capacity = choose_capacity(events, priors, start, last, target_failure_rate, capacity_position)
    moment_args: dict[str, Any] = {
        "steps": moments.steps,
        "marginal_fraction": moments.marginal_fraction,
    }
    if moments.horizons_s is not None:
        moment_args["horizons_s"] = tuple(moments.horizons_s)

    def run(name: str, threshold: float) -> ReplayResult:
        return replay(
            events,
            _policy(name, threshold, moment_args),
            priors,
            capacity,
            start=start,
            end=last,
            refresh_s=refresh_s,
        )

    scores: list[PolicyScore] = []
    for name in policies:
        if name not in SEARCH:
            raise ValueError(f"policies must be among {sorted(SEARCH)}, got {name!r}")
        low, high, log_scale = SEARCH[name]
        tuned = tune_threshold(
            lambda thr, name=name: run(name, thr),  # type: ignore[misc]
            low,
            high,
            target_failure_rate,
            iterations=iterations,
            log_scale=log_scale,
        )
        res = tuned.result
        median, p99 = latency_summary(res.latencies_s)
        scores.append(
            PolicyScore(
                name,
                tuned.threshold,
                res.utilisation,
                res.failure_rate,
                res.scale_outs,
                res.failures,
                res.arrivals,
                res.admitted,
                median,
                p99,
                res.failure_rate <= target_failure_rate,
                tuned.tried,
            )
        )
    return AdmissionEvaluation(
        trace,
        capacity,
        start,
        last,
        target_failure_rate,
        len(samples),
        _priors_dict(priors),
        tuple(scores),
    )


def choose_capacity(
    events: Sequence[VmEvent],
    priors: DeploymentPriors,
    start: float,
    end: float,
    target: float,
    position: float,
    *,
    iterations: int = 20,
) -> float:
    """A capacity between "reject-all meets the target" and "admit-all never fails"."""
    _, peak = offered_load(events, start)

    def reject_all(capacity: float) -> float:
        # A threshold no arrival can pass: only the deployments present at start scale.
        outcome = replay(events, ZerothMoment(1e-12), priors, capacity, start=start, end=end)
        return outcome.failure_rate

    lo, hi = 1.0, max(peak, 1.0)
    if reject_all(hi) > target:
        return hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if reject_all(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi + position * (max(peak, hi) - hi)


def _priors_dict(priors: DeploymentPriors) -> dict[str, tuple[float, float]]:
    return {
        "core_death": (priors.core_death.shape, priors.core_death.rate),
        "scale_out": (priors.scale_out.shape, priors.scale_out.rate),
        "size": (priors.size.shape, priors.size.rate),
        "kill": (priors.kill.shape, priors.kill.rate),
    }
