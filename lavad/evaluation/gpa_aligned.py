"""The time-aligned GPA evaluation: estimate from the past, measure the future.

The paper's section 5 resamples each task's readings independently, which
assumes time invariance and independence. The daemon lives otherwise: it
estimates a VM from its past and the VM's future plays out next to its
neighbours', on the same clock. Here:

1. Every VM's CPU readings are put on one time grid (steps of 300 s; steps
   where no VM has a reading are dropped, so PlanetLab's two non-adjacent
   days become adjacent). A window's first ``history_steps`` are the
   history, its next ``future_steps`` the future (google-2011-gcd and
   planetlab: a day, then the next; bitbrains-rnd, azure-v1-cpu: two
   weeks, then one).
   Windows start on day boundaries; in each, VMs missing more than 5 % of
   either part, or never above 0 in the history, are left out
   (``load_aligned_windows``).
2. Instance i takes window i mod (number of windows) and ``min(N, VMs)``
   distinct VMs of it in a random order (no duplicates: a copy of a VM
   would be perfectly correlated with it).
3. Every method estimates from the history only (mean, ddof=1 variance,
   percentiles), packs (Best Fit, then the rebalancing heuristic), and q is
   measured on the future with all tasks aligned in time: the fraction of
   (machine, future step) pairs whose summed usage exceeds c.
4. ``gpa-cov rho`` is GPA on the variance of the bin's aligned historical
   sum (``CovarianceGpaFitTest``), so covariances count. ``gpa-cal rho``
   adds a margin on z learned by a backtest inside the history
   (``calibrated_margin``): for drift, which no variance estimate shows.
5. ``gpa-online rho`` is the live method learned on the history
   (``gpa_tail``); ``gpa-react rho`` packs like it, then plays the future
   out with the live relief rule moving VMs off machines whose realised
   overflows reject rho (``gpa_react``): m is then its time-averaged
   machines, and its migrations per VM-day are reported. ``gpa-drift rho``
   is gpa-react with each task's regime changes detected
   (``models/usage/drift.py``): its moments restart, and its machine is
   relieved at once when it no longer passes the fit test.
6. m = machines / ceil(sum of the tasks' future means / c).
"""

from __future__ import annotations

import collections
import copy
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from lavad.core.cluster import FloatArray
from lavad.core.migrations.relief import ReliefConfig
from lavad.evaluation.gpa_react import react
from lavad.evaluation.gpa_sweep import (
    PAPER_AV_FACTORS,
    PAPER_CANTELLI,
    PAPER_CAPACITIES,
    PAPER_PERCENTILES,
    PAPER_RHOS,
    Method,
    ObservedStats,
    machine_totals,
    summary_rows,
)
from lavad.evaluation.gpa_tail import (
    EmpiricalFitTest,
    TailFitTest,
    online_calibration,
    task_cumulants,
)
from lavad.evaluation.stochastic_packing import (
    CovarianceGpaFitTest,
    FitTest,
    GpaFitTest,
    Packing,
    pack,
    rebalance,
)
from lavad.models.usage.drift import DriftConfig
from lavad.models.usage.margin import MarginSettings, OverflowMargin, TailCalibration
from lavad.streams.adapters import open_trace
from lavad.streams.schema import UsageSample

STEP_S: Final = 300.0
DAY_STEPS: Final = 288
MAX_MISSING: Final = 0.05

# History and future lengths in steps per trace (the issue: the job's
# previous day for google-2011-gcd; earlier weeks for bitbrains-rnd and
# azure-v1-cpu). PlanetLab has two days.
DEFAULT_WINDOWS: Final[dict[str, tuple[int, int]]] = {
    "google-2011-gcd": (DAY_STEPS, DAY_STEPS),
    "planetlab": (DAY_STEPS, DAY_STEPS),
    "bitbrains-rnd": (14 * DAY_STEPS, 7 * DAY_STEPS),
    "azure-v1-cpu": (14 * DAY_STEPS, 7 * DAY_STEPS),
}


@dataclass(frozen=True, slots=True)
class AlignedSeries:
    """CPU usage of the kept VMs on one time grid: history and future, rows = VMs."""

    trace: str
    names: tuple[tuple[str, str], ...]  # (pool, VM): a VM id is its pool's
    history: FloatArray
    future: FloatArray
    dropped: int
    start_step: int


PARTS: Final = ("whole", "first", "second")


def _windows(
    path: Path, history_steps: int | None, future_steps: int | None, part: str = "whole"
) -> tuple[str, list[tuple[str, str]], FloatArray, int, int]:
    """The trace's CPU readings on one grid (rows: VMs, NaN: no reading) and the window sizes.

    ``part`` "first" or "second" keeps that half of the grid's steps (split
    at the day boundary nearest the middle), the nearest a single trace has to
    a month the models never saw. A half keeps the trace's default windows
    when it holds one (google-2011-gcd: a day then a day); otherwise they are
    halved (planetlab's one-day halves: 12 h then 12 h; bitbrains-rnd and
    azure-v1-cpu: two weeks then one becomes 7 days then 3.5).
    """
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    trace = open_trace(path)
    default = DEFAULT_WINDOWS.get(trace.name, (DAY_STEPS, DAY_STEPS))
    history_n = default[0] if history_steps is None else history_steps
    future_n = default[1] if future_steps is None else future_steps
    if history_n < 2:
        raise ValueError(f"history_steps must be >= 2, got {history_n}")
    if future_n < 1:
        raise ValueError(f"future_steps must be >= 1, got {future_n}")
    readings: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    steps: set[int] = set()
    for event in trace.events():
        if isinstance(event, UsageSample):
            # ``time`` is the end of the reading's interval: step 0 ends at 300 s.
            step = round(event.time / STEP_S) - 1
            readings[(event.pool, event.vm_id)][step] = event.cpu.mean
            steps.add(step)
    grid = {step: column for column, step in enumerate(sorted(steps))}
    if len(grid) < history_n + future_n:
        # The caller names the trace (the command line prefixes its path).
        raise ValueError(
            f"{len(grid)} time steps, fewer than history {history_n} + future {future_n}"
        )
    names = list(readings)
    full: FloatArray = np.full((len(names), len(grid)), np.nan)
    for row, name in enumerate(names):
        for step, value in readings[name].items():
            full[row, grid[step]] = value
    if part != "whole":
        # Split on a day boundary, so both halves' windows start at the same time of day.
        middle = max(1, round(full.shape[1] / (2 * DAY_STEPS))) * DAY_STEPS
        full = full[:, :middle] if part == "first" else full[:, middle:]
        shortest = min(middle, len(grid) - middle)
        if history_steps is None and future_steps is None and sum(default) > shortest:
            history_n, future_n = default[0] // 2, default[1] // 2
        if full.shape[1] < history_n + future_n:
            raise ValueError(
                f"the {part} half has {full.shape[1]} time steps, fewer than "
                f"history {history_n} + future {future_n}"
            )
    return trace.name, names, full, history_n, future_n


def load_aligned_windows(
    path: Path,
    history_steps: int | None = None,
    future_steps: int | None = None,
    *,
    max_missing: float = MAX_MISSING,
    min_vms: int = 1,
    part: str = "whole",
) -> list[AlignedSeries]:
    """Every (history, future) window starting on a day boundary with ``min_vms`` usable VMs.

    Windows start at multiples of 288 steps, so co-located tasks always share
    the clock: google-2011-gcd's jobs span different days of the trace, and
    one job's day 1 next to another's day 3 would not be aligned in time. A
    VM is usable in a window when at most ``max_missing`` of each part's
    steps lack a reading (bitbrains-rnd's clock jitter leaves a few steps
    with two readings and their neighbours with none) and it is above 0
    somewhere in the history; missing steps stay NaN. Windows may overlap
    (bitbrains-rnd, azure-v1-cpu: two weeks then one, sliding by a day).
    """
    if not 0.0 <= max_missing < 1.0:
        raise ValueError(f"max_missing must be in [0, 1), got {max_missing}")
    if min_vms < 1:
        raise ValueError(f"min_vms must be >= 1, got {min_vms}")
    trace, names, full, history_n, future_n = _windows(path, history_steps, future_steps, part)
    width = history_n + future_n
    windows: list[AlignedSeries] = []
    for start in range(0, full.shape[1] - width + 1, DAY_STEPS):
        window = full[:, start : start + width]
        missing = ~np.isfinite(window)
        history_ok = missing[:, :history_n].mean(axis=1) <= max_missing
        future_ok = missing[:, history_n:].mean(axis=1) <= max_missing
        busy = np.nanmax(np.where(missing[:, :history_n], -1.0, window[:, :history_n]), axis=1)
        keep = np.flatnonzero(history_ok & future_ok & (busy > 0))
        if len(keep) >= min_vms:
            matrix = window[keep]
            windows.append(
                AlignedSeries(
                    trace,
                    tuple(names[i] for i in keep.tolist()),
                    matrix[:, :history_n].copy(),
                    matrix[:, history_n:].copy(),
                    len(names) - len(keep),
                    start,
                )
            )
    if not windows:
        raise ValueError(f"{path}: no window has {min_vms} VMs with readings in both parts")
    return windows


def load_aligned_series(
    path: Path,
    history_steps: int | None = None,
    future_steps: int | None = None,
    *,
    max_missing: float = MAX_MISSING,
) -> AlignedSeries:
    """The window (see ``load_aligned_windows``) with the most usable VMs; the earliest on ties."""
    windows = load_aligned_windows(path, history_steps, future_steps, max_missing=max_missing)
    return max(windows, key=lambda w: (len(w.names), -w.start_step))


def history_stats(history: FloatArray, percents: Sequence[float]) -> ObservedStats:
    """Mean, ddof=1 variance and percentiles of each task's history, skipping missing steps."""
    table: FloatArray = (
        np.nanpercentile(history, list(percents), axis=1)
        if percents
        else np.empty((0, len(history)))
    )
    return ObservedStats(
        np.nanmean(history, axis=1),
        np.nanvar(history, axis=1, ddof=1),
        {float(p): np.asarray(row) for p, row in zip(percents, table, strict=True)},
    )


def filled_history(history: FloatArray) -> FloatArray:
    """Missing history steps set to the task's mean: they add nothing to any covariance."""
    means = np.nanmean(history, axis=1, keepdims=True)
    filled: FloatArray = np.where(np.isfinite(history), history, means)
    return filled


CALIBRATION_MARGINS: Final = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
CALIBRATION_SPLIT: Final = 2 / 3


def calibrated_margin(
    history: FloatArray,
    rho: float,
    capacity: float,
    margins: Sequence[float] = CALIBRATION_MARGINS,
) -> float:
    """The smallest z multiplier that would have held rho inside the history (a backtest).

    The first 2/3 of the history estimate and pack (``CovarianceGpaFitTest``
    with z x margin), the last 1/3 measures the aligned overflow frequency;
    the first margin with q <= rho wins, else the largest. This learns a
    margin for drift and correlation from realised overflows, as the issue
    suggests; it is not in the paper.
    """
    split = int(history.shape[1] * CALIBRATION_SPLIT)
    if split < 2 or history.shape[1] - split < 1:
        raise ValueError(f"history of {history.shape[1]} steps is too short to calibrate")
    early, late = history[:, :split], history[:, split:]
    for margin in margins:
        test = CovarianceGpaFitTest(early, rho, margin)
        packing = pack(test, capacity, best_fit=True)
        rebalance(packing, test, capacity)
        if aligned_overflow_frequency(packing, late, capacity) <= rho:
            return margin
    return margins[-1]


def pooled_variance_factor(
    history: FloatArray, stats: ObservedStats, rho: float, capacity: float
) -> float:
    """What the live GPA's ``UsageHooks`` learns, computed on the history: the factor.

    Plain GPA packs the history's statistics; over its bins, the variance
    of each bin's aligned summed history against the sum of its tasks'
    variances, pooled (sum over bins / sum over bins), never below 1. The
    live daemon learns the same ratio from each host's realised usage
    against its variance sum, over the mix that is actually co-located.
    """
    test = GpaFitTest(stats.mean, stats.variance, rho)
    packing = pack(test, capacity, best_fit=True)
    rebalance(packing, test, capacity)
    realised = predicted = 0.0
    for tasks in packing.bins:
        if len(tasks) < 2:
            continue  # one task: its variance is the bin's, nothing to learn
        realised += float(np.var(history[tasks].sum(axis=0), ddof=1))
        predicted += float(stats.variance[tasks].sum())
    return max(1.0, realised / predicted) if predicted > 0 else 1.0


def aligned_overflow_frequency(packing: Packing, future: FloatArray, capacity: float) -> float:
    """q on the aligned future: over (machine, step) pairs where every task has a reading."""
    totals = machine_totals(packing, future)
    valid = np.isfinite(totals)
    counted = int(np.count_nonzero(valid))
    if not counted:
        return 0.0
    over = int(np.count_nonzero(valid & (np.where(valid, totals, 0.0) > capacity)))
    return over / counted


@dataclass(frozen=True, slots=True)
class AlignedSettings:
    tasks: int = 100
    instances: int = 5
    capacities: tuple[float, ...] = PAPER_CAPACITIES
    rhos: tuple[float, ...] = PAPER_RHOS
    av_factors: tuple[float, ...] = PAPER_AV_FACTORS
    percentiles: tuple[float, ...] = PAPER_PERCENTILES
    cantelli: tuple[float, ...] = PAPER_CANTELLI
    covariance_aware: bool = True
    calibrated: bool = True
    live_factor: bool = True
    online: bool = True
    # gpa-react: gpa-online with the live relief rule (needs ``online``).
    react: bool = True
    relief: ReliefConfig = field(default_factory=lambda: ReliefConfig(enabled=True))
    # Steps a relief's migrations take (the live default duration_s, 1,200 s).
    relief_migration_steps: int = 4
    # gpa-drift: gpa-react with per-VM regime-change detection (``models/usage/drift.py``).
    drift: bool = True
    drift_config: DriftConfig = field(default_factory=lambda: DriftConfig(detector="cusum"))
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.instances < 1:
            raise ValueError("tasks and instances must be >= 1")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        for capacity in self.capacities:
            if not (math.isfinite(capacity) and capacity > 0):
                raise ValueError(f"capacities: {capacity!r} is not a number > 0")
        for rho in self.rhos:
            if not 0.0 < rho < 1.0:
                raise ValueError(f"rhos: {rho!r} is not in (0, 1)")

    def methods(self) -> list[tuple[str, Method]]:
        """(label, method); ``gpa-cov`` reuses Method("gpa", rho) with its own label."""
        methods = [(f"gpa {rho:g}", Method("gpa", rho)) for rho in self.rhos]
        if self.covariance_aware:
            methods += [(f"gpa-cov {rho:g}", Method("gpa", rho)) for rho in self.rhos]
        if self.calibrated:
            methods += [(f"gpa-cal {rho:g}", Method("gpa", rho)) for rho in self.rhos]
        if self.live_factor:
            methods += [(f"gpa-live {rho:g}", Method("gpa", rho)) for rho in self.rhos]
        if self.online:
            methods += [(f"gpa-online {rho:g}", Method("gpa", rho)) for rho in self.rhos]
            methods += [(f"gpa-emp {rho:g}", Method("gpa", rho)) for rho in self.rhos]
            if self.react:
                methods += [(f"gpa-react {rho:g}", Method("gpa", rho)) for rho in self.rhos]
                if self.drift:
                    methods += [(f"gpa-drift {rho:g}", Method("gpa", rho)) for rho in self.rhos]
        methods += [(f"av {f:g}", Method("av", f)) for f in self.av_factors]
        methods += [(f"perc {p:g}", Method("perc", p)) for p in self.percentiles]
        methods += [(f"cantelli {b:g}", Method("cantelli", b)) for b in self.cantelli]
        return methods

    def method_labels(self) -> list[str]:
        return [label for label, _ in self.methods()]


@dataclass(frozen=True, slots=True)
class AlignedRun:
    instance: int
    window_start: int
    tasks: int
    capacity: float
    method: str
    family: str
    parameter: float
    machines: int
    normalization: int
    m: float
    q: float
    margin: float = 1.0
    # gpa-online: the percentile method the pool chose (see gpa_tail).
    detail: str = ""
    # gpa-react: VMs moved per VM-day of the future, and reliefs that moved any.
    migrations_per_vm_day: float = 0.0
    reliefs: int = 0
    # gpa-react: the first future step a relief moved a VM (None: none did).
    first_relief_step: int | None = None
    # gpa-drift: tasks reset by the drift detector per VM-day, and reliefs it started.
    drift_resets_per_vm_day: float = 0.0
    drift_reliefs: int = 0
    # gpa-react: overflowed machine-steps of machines running one task alone
    # (no relief helps: the task alone exceeds the capacity).
    overflows_alone: int = 0


# The GPA variants that learn from the realised usage (a margin, a method choice, reliefs).
LEARNING_FAMILIES: Final = (
    "gpa-cal",
    "gpa-live",
    "gpa-online",
    "gpa-emp",
    "gpa-react",
    "gpa-drift",
)
GPA_FAMILIES: Final = ("gpa", "gpa-cov", *LEARNING_FAMILIES)


@dataclass(slots=True)
class AlignedResult:
    trace: str
    vms: int
    dropped: int
    history_steps: int
    future_steps: int
    settings: AlignedSettings
    window_starts: list[int] = field(default_factory=list)
    runs: list[AlignedRun] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """Means over instances per (capacity, method)."""

        def more(runs: list[AlignedRun], q: FloatArray) -> dict[str, Any]:
            first = runs[0]
            is_gpa = first.family in GPA_FAMILIES
            chosen = collections.Counter(r.detail for r in runs if r.detail)
            return {
                "q_over_rho": float(q.mean() / first.parameter) if is_gpa else None,
                "margin": float(np.mean([r.margin for r in runs])),
                "migrations_per_vm_day": float(np.mean([r.migrations_per_vm_day for r in runs])),
                "reliefs": float(np.mean([r.reliefs for r in runs])),
                "q_max": float(q.max()),
                "drift_resets_per_vm_day": float(
                    np.mean([r.drift_resets_per_vm_day for r in runs])
                ),
                "overflows_alone": int(sum(r.overflows_alone for r in runs)),
                "detail": ", ".join(f"{name} {n}/{len(runs)}" for name, n in chosen.items()),
            }

        return summary_rows(
            self.runs, ("capacity", "method"), lambda r: (r.capacity, r.method), more
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "vms": self.vms,
            "dropped_vms": self.dropped,
            "history_steps": self.history_steps,
            "future_steps": self.future_steps,
            "window_starts": self.window_starts,
            "settings": asdict(self.settings),
            "summary": self.summary(),
            "runs": [asdict(run) for run in self.runs],
        }


def run_aligned(
    windows: AlignedSeries | Sequence[AlignedSeries],
    settings: AlignedSettings,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> AlignedResult:
    """Every method x capacity on every instance, estimated on history, measured on future.

    Instance i uses window i mod len(windows), so instances spread over the
    trace's days instead of one day pair.
    """
    ordered = [windows] if isinstance(windows, AlignedSeries) else list(windows)
    if not ordered:
        raise ValueError("windows must hold at least one AlignedSeries")
    first = ordered[0]
    result = AlignedResult(
        first.trace,
        max(len(w.names) for w in ordered),
        min(w.dropped for w in ordered),
        first.history.shape[1],
        first.future.shape[1],
        settings,
        [w.start_step for w in ordered],
    )
    methods = settings.methods()
    for instance in range(settings.instances):
        series = ordered[instance % len(ordered)]
        n_vms = len(series.names)
        n_tasks = min(settings.tasks, n_vms)
        rng = np.random.default_rng([settings.seed, instance])
        picks = rng.permutation(n_vms)[:n_tasks]
        history = series.history[picks]
        future = series.future[picks]
        stats = history_stats(history, settings.percentiles)
        filled = filled_history(history)
        true_total = float(np.nanmean(future, axis=1).sum())
        tests: list[tuple[str, str, float, FitTest | None]] = []
        for label, method in methods:
            if label.startswith("gpa-cov"):
                test: FitTest = CovarianceGpaFitTest(filled, method.parameter)
                tests.append((label, "gpa-cov", method.parameter, test))
            elif label.startswith("gpa-cal"):
                # Built per capacity: the margin is learned for each.
                tests.append((label, "gpa-cal", method.parameter, None))
            elif label.startswith("gpa-live"):
                # Built per capacity: the factor is learned on that packing.
                tests.append((label, "gpa-live", method.parameter, None))
            elif label.startswith(("gpa-online", "gpa-emp", "gpa-react", "gpa-drift")):
                # Built per capacity: learned online on the history (gpa_tail).
                tests.append((label, label.split()[0], method.parameter, None))
            else:
                tests.append((label, method.family, method.parameter, stats.fit_test(method)))
        cumulants = task_cumulants(history) if settings.online else None
        for capacity in settings.capacities:
            normalization = max(1, math.ceil(true_total / capacity))
            learned: dict[float, tuple[TailCalibration, OverflowMargin]] = {}
            for label, family, parameter, fixed in tests:
                margin = 1.0
                detail = ""
                chosen: FitTest
                if fixed is not None:
                    chosen = fixed
                elif family in ("gpa-online", "gpa-emp", "gpa-react", "gpa-drift"):
                    if parameter not in learned:
                        learned[parameter] = online_calibration(
                            history, filled, parameter, capacity, MarginSettings()
                        )
                    calibration, empirical = learned[parameter]
                    if family != "gpa-emp" and cumulants is not None:
                        margin, detail = calibration.margin, calibration.method
                        chosen = TailFitTest(cumulants, parameter, detail, margin)
                    else:
                        margin = empirical.value
                        chosen = EmpiricalFitTest(filled, parameter, margin)
                elif family == "gpa-live":
                    # Reported in the margin column: the variance factor.
                    margin = pooled_variance_factor(filled, stats, parameter, capacity)
                    chosen = GpaFitTest(stats.mean, stats.variance * margin, parameter)
                else:
                    margin = calibrated_margin(filled, parameter, capacity)
                    chosen = CovarianceGpaFitTest(filled, parameter, margin)
                packing = pack(chosen, capacity, best_fit=True)
                rebalance(packing, chosen, capacity)
                machines = packing.machines
                m = packing.machines / normalization
                migrations = 0.0
                reliefs = 0
                first_relief: int | None = None
                drift_resets = 0.0
                drift_reliefs = alone = 0
                if family in ("gpa-react", "gpa-drift"):
                    # The pool keeps learning while it reacts: its own copy.
                    outcome = react(
                        history,
                        future,
                        packing,
                        copy.deepcopy(learned[parameter][0]),
                        capacity,
                        settings.relief,
                        settings.relief_migration_steps,
                        settings.drift_config if family == "gpa-drift" else None,
                    )
                    q = outcome.q
                    machines = outcome.machines_max
                    m = outcome.machines_mean / normalization
                    migrations = outcome.migrations_per_vm_day
                    reliefs = outcome.reliefs
                    first_relief = outcome.first_relief_step
                    drift_resets = (
                        outcome.drift_resets / outcome.vm_days if outcome.vm_days else 0.0
                    )
                    drift_reliefs = outcome.drift_reliefs
                    alone = outcome.overflows_alone
                else:
                    q = aligned_overflow_frequency(packing, future, capacity)
                result.runs.append(
                    AlignedRun(
                        instance=instance,
                        window_start=series.start_step,
                        tasks=n_tasks,
                        capacity=capacity,
                        method=label,
                        family=family,
                        parameter=parameter,
                        machines=machines,
                        normalization=normalization,
                        m=m,
                        q=q,
                        margin=margin,
                        detail=detail,
                        migrations_per_vm_day=migrations,
                        reliefs=reliefs,
                        first_relief_step=first_relief,
                        drift_resets_per_vm_day=drift_resets,
                        drift_reliefs=drift_reliefs,
                        overflows_alone=alone,
                    )
                )
        if progress is not None:
            progress(instance + 1, settings.instances)
    return result
