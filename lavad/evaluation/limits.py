"""Limits evaluation: Autopilot's moving-window and ML recommenders against the VPA baseline.

Protocol (Autopilot section 4.1, on a recorded trace instead of production):

1. Each VM (or job) of the trace is one job with one task; its usage is a
   fraction of its request, per 5-minute interval. No trace keeps the raw
   samples of an interval, so a window's histogram holds what there is: the
   interval's mean and, where the source also gives its maximum (Azure V1
   CPU), that maximum as a second sample, since the raw samples would have
   included it. The peak (the maximum, else the one reading) is what an
   overrun is measured against; the mean is the usage for slack. Memory
   windows carry the one reading as their peak.
2. Every recommender replays the job's windows in time order. The limit in
   force during a window is the one recommended after the previous window;
   a window whose peak exceeds it is an overrun (throttling for CPU, the OOM
   proxy for memory), reported to the recommender (VPA bumps memory after
   an OOM). The usage is not adjusted after an overrun, as in the paper's
   off-line experiments (3.2.3).
3. Scoring starts after ``warmup_s`` (all recommenders alike) and is cut into
   job-days (calendar days of the trace clock). Per job-day: relative slack
   as Autopilot defines it (section 4.1), ``(mean limit - p95 of the
   5-minute usage) / mean limit``, where the usage is what the task could
   use: CPU above the limit is throttled and memory above it is an OOM, so a
   window's usage is ``min(usage, limit in force)`` and the slack is never
   negative while the limit holds still over the day (a limit that moves
   within it can leave a small negative value); and the same against the
   *demand* (the recorded usage, uncapped), which goes negative when limits
   sit below what the job asked for (the measure before this change);
   absolute slack ``mean(limit - min(usage, limit))`` over its scored
   windows (limit-seconds minus usage-seconds per second covered, in request
   units: the paper divides by a whole day, which would shrink the partial
   days of short traces); the
   windows that overran; whether any did; limit changes.
4. Per recommender: mean and median relative slack over job-days, mean
   absolute slack, overrun rate (overrun windows / scored windows), share of
   job-days without an overrun, limit changes per job-day.

Jobs are subsampled with ``numpy.random.default_rng(seed)`` so each run takes
minutes; the same jobs go to every recommender.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np

from lavad.daemon.plotting import pyplot
from lavad.models.limits.choice import default_choice
from lavad.models.limits.histogram import Observation
from lavad.models.limits.ml import MlConfig, MlRecommender
from lavad.models.limits.vpa import VpaRecommender
from lavad.models.limits.window import LimitRecommender, MovingWindowRecommender, WindowConfig
from lavad.streams.adapters import open_trace
from lavad.streams.schema import UsageSample

Resource = Literal["cpu", "memory"]
FloatArray = np.ndarray[Any, np.dtype[np.float64]]

DAY: Final = 86_400.0
WINDOW_STATISTICS: Final = ("avg", "p90", "p95", "p98", "max", "p60_half_max")
DEFAULT_WARMUP_S: Final = 6 * 3600.0
MIN_DAY_WINDOWS: Final = 12


@dataclass(frozen=True)
class JobSeries:
    """One job's usage: window ends, CPU mean and peak, memory (None when the trace has none).

    A job is its pool's: the same id in two pools is two jobs.
    """

    pool: str
    job_id: str
    end: FloatArray
    cpu_mean: FloatArray
    cpu_peak: FloatArray
    memory: FloatArray | None

    def signal(self, resource: Resource) -> tuple[FloatArray, FloatArray] | None:
        """(sample, peak) per window for one resource, or None if the trace lacks it."""
        if resource == "cpu":
            return self.cpu_mean, self.cpu_peak
        if self.memory is None:
            return None
        return self.memory, self.memory


def load_jobs(path: Path, *, max_jobs: int | None = None, seed: int = 0) -> list[JobSeries]:
    """Every job (VM) of a usage trace, or ``max_jobs`` of them chosen with ``seed``."""
    if max_jobs is not None and max_jobs < 1:
        raise ValueError(f"max_jobs must be >= 1, got {max_jobs!r}")
    # Keyed by (pool, VM): a JSON-lines trace may hold several pools, whose
    # VM ids are their own.
    rows: dict[tuple[str, str], list[tuple[float, float, float, float]]] = defaultdict(list)
    for item in open_trace(path, seed=seed).events():
        if not isinstance(item, UsageSample):
            continue  # BadRecords: the adapter already explains them
        mem = math.nan if item.memory is None else item.memory.peak
        rows[(item.pool, item.vm_id)].append((item.time, item.cpu.mean, item.cpu.peak, mem))
    keys = sorted(rows)
    if max_jobs is not None and max_jobs < len(keys):
        rng = np.random.default_rng(seed)
        keys = sorted(keys[i] for i in rng.choice(len(keys), size=max_jobs, replace=False))
    jobs = []
    for pool, job_id in keys:
        arr = np.asarray(sorted(rows[(pool, job_id)]), dtype=np.float64)
        finite = np.isfinite(arr[:, 3])
        memory = arr[:, 3] if finite.all() else None
        jobs.append(JobSeries(pool, job_id, arr[:, 0], arr[:, 1], arr[:, 2], memory))
    return jobs


RecommenderFactory = Callable[[Resource], LimitRecommender]


def default_recommenders(
    ml: Mapping[str, MlConfig] | None = None,
) -> dict[str, RecommenderFactory]:
    """The moving-window variants (12 h / 48 h half-lives), the ML ensemble and VPA.

    ``ml`` maps a resource to the ML configuration that replaces the tuned
    ``MlConfig.for_resource`` for it.
    """
    chosen = dict(ml or {})
    factories: dict[str, RecommenderFactory] = {}
    for stat in WINDOW_STATISTICS:

        def window(resource: Resource, stat: str = stat) -> LimitRecommender:
            base = WindowConfig.for_resource(resource)
            return MovingWindowRecommender(WindowConfig(stat, base.half_life_s))  # type: ignore[arg-type]

        factories[f"window-{stat}"] = window
    factories["ml-ensemble"] = lambda resource: MlRecommender(
        chosen.get(resource) or MlConfig.for_resource(resource)
    )
    factories["ml"] = default_choice
    factories["vpa"] = VpaRecommender
    return factories


@dataclass
class _DayScore:
    limits: list[float] = field(default_factory=list)
    usage: list[float] = field(default_factory=list)
    # The usage the limit let through: min(usage, limit in force).
    capped: list[float] = field(default_factory=list)
    overruns: int = 0
    changes: int = 0


@dataclass(frozen=True)
class RecommenderScore:
    """One recommender's metrics on one resource of one trace."""

    recommender: str
    resource: Resource
    jobs: int
    job_days: int
    windows: int
    # Autopilot's relative slack: against the usage the limits let through.
    relative_slack_mean: float
    relative_slack_median: float
    # The same against the recorded demand (can be negative).
    demand_slack_mean: float
    demand_slack_median: float
    absolute_slack_mean: float
    overrun_rate: float
    days_without_overrun: float
    limit_changes: int
    changes_per_job_day: float


def replay_job(
    rec: LimitRecommender,
    end: FloatArray,
    sample: FloatArray,
    peak: FloatArray,
    *,
    warmup_s: float,
) -> list[_DayScore]:
    """Run one recommender over one job's windows; the job-days' raw scores."""
    days: dict[int, _DayScore] = defaultdict(_DayScore)
    start = float(end[0]) if len(end) else 0.0
    previous: float | None = None
    for t, value, top in zip(end.tolist(), sample.tolist(), peak.tolist(), strict=True):
        limit = rec.limit
        if limit is not None and t - start >= warmup_s:
            day = days[math.floor((t - 1e-9) / DAY)]
            day.limits.append(limit)
            day.usage.append(value)
            day.capped.append(min(value, limit))
            if top > limit + 1e-12:
                day.overruns += 1
            if previous is not None and not math.isclose(limit, previous, rel_tol=1e-9):
                day.changes += 1
            previous = limit
        if limit is not None and top > limit + 1e-12:
            rec.on_overrun(t, limit)
        mean, high = max(value, 0.0), max(top, 0.0)
        values = (mean, high) if high > mean else (mean,)
        rec.observe(Observation(t, values, high, mean))
    return [d for _, d in sorted(days.items()) if len(d.limits) >= MIN_DAY_WINDOWS]


def score(name: str, resource: Resource, jobs: int, days: Sequence[_DayScore]) -> RecommenderScore:
    """Aggregate job-days into the paper's metrics."""
    rel: list[float] = []
    demand: list[float] = []
    absolute: list[float] = []
    windows = overruns = clean = changes = 0
    for d in days:
        lim = np.asarray(d.limits)
        use = np.asarray(d.usage)
        mean_limit = float(lim.mean())
        if mean_limit > 0:
            rel.append((mean_limit - float(np.percentile(d.capped, 95))) / mean_limit)
            demand.append((mean_limit - float(np.percentile(use, 95))) / mean_limit)
        absolute.append(float((lim - np.asarray(d.capped)).mean()))
        windows += len(lim)
        overruns += d.overruns
        clean += d.overruns == 0
        changes += d.changes
    n = len(days)
    nan = math.nan
    return RecommenderScore(
        recommender=name,
        resource=resource,
        jobs=jobs,
        job_days=n,
        windows=windows,
        relative_slack_mean=float(np.mean(rel)) if rel else nan,
        relative_slack_median=float(np.median(rel)) if rel else nan,
        demand_slack_mean=float(np.mean(demand)) if demand else nan,
        demand_slack_median=float(np.median(demand)) if demand else nan,
        absolute_slack_mean=float(np.mean(absolute)) if absolute else nan,
        overrun_rate=overruns / windows if windows else nan,
        days_without_overrun=clean / n if n else nan,
        limit_changes=changes,
        changes_per_job_day=changes / n if n else nan,
    )


@dataclass(frozen=True)
class LimitsEvaluation:
    """Scores per (resource, recommender) on one trace."""

    trace: str
    jobs: int
    seed: int
    scores: tuple[RecommenderScore, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "jobs": self.jobs,
            "seed": self.seed,
            "scores": [asdict(s) for s in self.scores],
        }

    def get(self, resource: Resource, recommender: str) -> RecommenderScore | None:
        for s in self.scores:
            if s.resource == resource and s.recommender == recommender:
                return s
        return None


def evaluate_jobs(
    jobs: Sequence[JobSeries],
    recommenders: dict[str, RecommenderFactory],
    *,
    resources: Iterable[Resource] = ("cpu", "memory"),
    warmup_s: float = DEFAULT_WARMUP_S,
) -> list[RecommenderScore]:
    """Every recommender on every job and resource the jobs have."""
    if warmup_s < 0:
        raise ValueError(f"warmup_s must be >= 0, got {warmup_s!r}")
    scores = []
    for resource in resources:
        signals = [(job, job.signal(resource)) for job in jobs]
        present = [(job, sig) for job, sig in signals if sig is not None and len(job.end)]
        if not present:
            continue
        for name, factory in recommenders.items():
            days: list[_DayScore] = []
            for job, (sample, peak) in present:
                days.extend(replay_job(factory(resource), job.end, sample, peak, warmup_s=warmup_s))
            scores.append(score(name, resource, len(present), days))
    return scores


PARTS: Final = ("whole", "first", "second")


def trace_half(jobs: Sequence[JobSeries], part: str) -> list[JobSeries]:
    """Each job's windows in that half of the trace's time span (split at the day
    boundary nearest its middle); jobs with no window there are left out.

    A half is the nearest a single trace has to a month the recommenders never
    saw: a choice that holds on one half and not the other was tuned, not learned.
    """
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    if part == "whole" or not jobs:
        return list(jobs)
    start = min(float(job.end[0]) for job in jobs if len(job.end))
    stop = max(float(job.end[-1]) for job in jobs if len(job.end))
    middle = start + max(1, round((stop - start) / (2 * DAY))) * DAY
    halves = []
    for job in jobs:
        keep = job.end <= middle if part == "first" else job.end > middle
        if keep.any():
            memory = None if job.memory is None else job.memory[keep]
            halves.append(
                replace(
                    job,
                    end=job.end[keep],
                    cpu_mean=job.cpu_mean[keep],
                    cpu_peak=job.cpu_peak[keep],
                    memory=memory,
                )
            )
    return halves


def evaluate_limits(
    path: Path,
    *,
    max_jobs: int | None = 20,
    seed: int = 0,
    ml: Mapping[str, MlConfig] | None = None,
    warmup_s: float = DEFAULT_WARMUP_S,
    part: str = "whole",
) -> LimitsEvaluation:
    """The full comparison on one trace, or on one half of it (``trace_half``)."""
    jobs = trace_half(load_jobs(path, max_jobs=max_jobs, seed=seed), part)
    scores = evaluate_jobs(jobs, default_recommenders(ml), warmup_s=warmup_s)
    return LimitsEvaluation(Path(path).name, len(jobs), seed, tuple(scores))


def sweep_ml(
    jobs: Sequence[JobSeries],
    grid: Sequence[MlConfig],
    *,
    resource: Resource = "cpu",
    warmup_s: float = DEFAULT_WARMUP_S,
) -> list[tuple[MlConfig, RecommenderScore]]:
    """The paper's off-line hyperparameter sweep: every configuration on the same jobs."""
    out = []
    for config in grid:

        def factory(_: Resource, config: MlConfig = config) -> LimitRecommender:
            return MlRecommender(config)

        [result] = evaluate_jobs(jobs, {"ml": factory}, resources=(resource,), warmup_s=warmup_s)
        out.append((config, result))
    return out


def training_jobs(
    path: Path, *, count: int, exclude_sample: int | None = 20, seed: int = 0
) -> list[JobSeries]:
    """``count`` jobs outside the evaluation sample (``load_jobs(max_jobs=exclude_sample)``).

    Tuning on these and evaluating on the sample keeps the reported numbers
    out-of-sample. The draw uses ``default_rng(seed + 1)``.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count!r}")
    every = load_jobs(path, seed=seed)
    held = {(j.pool, j.job_id) for j in load_jobs(path, max_jobs=exclude_sample, seed=seed)}
    if exclude_sample is None:
        held = set()
    rest = [j for j in every if (j.pool, j.job_id) not in held]
    if not rest:
        raise ValueError("no jobs left outside the evaluation sample")
    rng = np.random.default_rng(seed + 1)
    picks = sorted(rng.choice(len(rest), size=min(count, len(rest)), replace=False).tolist())
    return [rest[i] for i in picks]


def dominates(
    a: RecommenderScore,
    b: RecommenderScore,
    slack_tol: float = 0.0,
    change_ratio: float | None = None,
) -> bool:
    """``a`` has lower relative slack at no higher overrun rate, or fewer overruns at equal slack.

    Slack is the mean relative slack over job-days; ``slack_tol`` is what counts as equal.
    With ``change_ratio``, ``a`` must also change limits at most that many times as often
    per job-day as ``b`` (a limit change restarts or resizes the task).
    """
    lower_slack = a.relative_slack_mean < b.relative_slack_mean - slack_tol
    equal_slack = abs(a.relative_slack_mean - b.relative_slack_mean) <= slack_tol
    better = (lower_slack and a.overrun_rate <= b.overrun_rate) or (
        equal_slack and a.overrun_rate < b.overrun_rate
    )
    if change_ratio is not None and a.changes_per_job_day > change_ratio * b.changes_per_job_day:
        return False
    return better


def plot_pareto(evaluations: Sequence[LimitsEvaluation], png: Path) -> None:
    """Relative slack against overrun rate, one panel per (trace, resource)."""
    plt = pyplot()

    panels = [
        (ev, res)
        for ev in evaluations
        for res in ("cpu", "memory")
        if any(s.resource == res for s in ev.scores)
    ]
    if not panels:
        raise ValueError("evaluations must hold at least one score")
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax, (ev, res) in zip(axes.flat, panels, strict=False):
        for s in ev.scores:
            if s.resource != res:
                continue
            marker = "*" if s.recommender == "ml" else "s" if s.recommender == "vpa" else "o"
            size = 160 if marker != "o" else 50
            ax.scatter(s.overrun_rate * 100, s.relative_slack_mean * 100, marker=marker, s=size)
            ax.annotate(
                s.recommender,
                (s.overrun_rate * 100, s.relative_slack_mean * 100),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.set_title(f"{ev.trace} {res} ({ev.jobs} jobs)")
        ax.set_xlabel("overrun rate (% of 5-min windows)")
        ax.set_ylabel("mean relative slack (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
