"""The GPA paper's section 5 experiment (Janus and Rzadca, SoCC'17) on a recorded usage trace.

1. Each VM's CPU readings (fractions of its request; Azure V1 CPU: the
   5-minute averages, or their maxima with ``statistic="peak"``) are an
   empirical distribution: the paper's time invariance. Series with fewer
   than 24 readings (the paper keeps tasks of 2 hours or more) or never
   above 0 are dropped (section 3.1).
2. An instance is N tasks drawn from the series, each with R realisations
   drawn independently from its distribution. There are fewer series than
   the paper's 100,000 tasks, so each series serves N // S or N // S + 1
   tasks of an instance; under the paper's independence assumption these
   are independent tasks with the same distribution.
3. Clairvoyance a: the first max(2, round(a R)) realisations are the
   observation set O and the rest the evaluation set E; a = 1 uses all R as
   both (section 5.1).
4. Every method estimates per-task statistics from O (mean; variance with
   ddof=1, as ``UsageMoments`` gives it; percentiles) and packs the tasks in
   instance order onto machines of capacity c (Best Fit and/or First Fit,
   then the rebalancing heuristic).
5. m = machines / ceil(sum of the tasks' true means / c), and q = the
   fraction of (machine, realisation in E) pairs whose total exceeds c.

Capacity is in the trace's unit: 1.0 is one VM's whole request. Each
instance draws from ``default_rng((seed, instance))``, so results do not
depend on how many instances run, and every capacity, clairvoyance level and
method of an instance sees the same realisations.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar

import numpy as np

from lavad.core.cluster import FloatArray, IntArray
from lavad.evaluation.stochastic_packing import (
    FitTest,
    GpaFitTest,
    Packing,
    SizeFitTest,
    pack,
    rebalance,
)
from lavad.streams.adapters import open_trace
from lavad.streams.schema import UsageSample

Family = Literal["gpa", "av", "perc", "cantelli"]
Algorithm = Literal["bestfit", "firstfit"]
Statistic = Literal["mean", "peak"]

MIN_READINGS: Final = 24
MIN_OBSERVATIONS: Final = 2

PAPER_RHOS: Final = (0.1, 0.05, 0.01, 0.001)
PAPER_AV_FACTORS: Final = (1.0, 1.25, 2.0)
PAPER_PERCENTILES: Final = (50.0, 70.0, 90.0, 95.0, 99.0, 100.0)
PAPER_CANTELLI: Final = (1.0, 1.7, 4.4)
PAPER_CAPACITIES: Final = (0.5, 1.0, 2.0, 5.0)
PAPER_CLAIRVOYANCE: Final = (0.001, 0.01, 0.1, 0.3, 0.5, 0.8, 1.0)


@dataclass(frozen=True, slots=True)
class Method:
    family: Family
    parameter: float

    @property
    def label(self) -> str:
        return f"{self.family} {self.parameter:g}"


@dataclass(frozen=True, slots=True)
class ObservedStats:
    """Per-task statistics from the observation set."""

    mean: FloatArray
    variance: FloatArray
    percentiles: dict[float, FloatArray]

    @classmethod
    def of(cls, observations: FloatArray, percents: Sequence[float] = ()) -> ObservedStats:
        # One partial sort for all percentiles, not one per method.
        table: FloatArray = (
            np.percentile(observations, list(percents), axis=1)
            if percents
            else np.empty((0, len(observations)))
        )
        return cls(
            observations.mean(axis=1),
            observations.var(axis=1, ddof=1),
            {float(p): np.asarray(row) for p, row in zip(percents, table, strict=True)},
        )

    def fit_test(self, method: Method) -> FitTest:
        family, value = method.family, method.parameter
        if family == "gpa":
            return GpaFitTest(self.mean, self.variance, value)
        if family == "av":
            return SizeFitTest.average(self.mean, value)
        if family == "perc":
            return SizeFitTest(method.label, self.percentiles[float(value)])
        return SizeFitTest.cantelli(self.mean, np.sqrt(self.variance), value)


def _positive_tuple(name: str, values: Sequence[float], *, upper: float | None = None) -> None:
    if not values:
        raise ValueError(f"{name}: give at least one value")
    for value in values:
        if not (math.isfinite(value) and value > 0) or (upper is not None and value > upper):
            bound = f" and at most {upper:g}" if upper is not None else ""
            raise ValueError(f"{name}: {value!r} is not a number > 0{bound}")


@dataclass(frozen=True, slots=True)
class SweepSettings:
    """What to run; the defaults finish in seconds, ``PAPER_SWEEP`` is section 5's size."""

    tasks: int = 200
    instances: int = 5
    realisations: int = 2000
    capacities: tuple[float, ...] = PAPER_CAPACITIES
    clairvoyance: tuple[float, ...] = (1.0,)
    rhos: tuple[float, ...] = PAPER_RHOS
    av_factors: tuple[float, ...] = PAPER_AV_FACTORS
    percentiles: tuple[float, ...] = PAPER_PERCENTILES
    cantelli: tuple[float, ...] = PAPER_CANTELLI
    algorithms: tuple[Algorithm, ...] = ("bestfit",)
    rebalance: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.instances < 1:
            raise ValueError("tasks and instances must be >= 1")
        if self.realisations < MIN_OBSERVATIONS + 1:
            raise ValueError(f"realisations must be >= {MIN_OBSERVATIONS + 1}")
        if self.seed < 0:
            raise ValueError("seed must be >= 0")
        _positive_tuple("capacities", self.capacities)
        _positive_tuple("clairvoyance", self.clairvoyance, upper=1.0)
        for rho in self.rhos:
            if not 0.0 < rho < 1.0:
                raise ValueError(f"rhos: {rho!r} is not in (0, 1)")
        _positive_tuple("av_factors", self.av_factors)
        for percent in self.percentiles:
            if not 0.0 <= percent <= 100.0:
                raise ValueError(f"percentiles: {percent!r} is not in [0, 100]")
        for b in self.cantelli:
            if not (math.isfinite(b) and b >= 0):
                raise ValueError(f"cantelli: {b!r} is not a number >= 0")
        if not self.algorithms or any(a not in ("bestfit", "firstfit") for a in self.algorithms):
            raise ValueError("algorithms: bestfit and/or firstfit")
        if not (self.rhos or self.av_factors or self.percentiles or self.cantelli):
            raise ValueError("no method to run")

    def methods(self) -> list[Method]:
        return [
            *(Method("gpa", rho) for rho in self.rhos),
            *(Method("av", f) for f in self.av_factors),
            *(Method("perc", p) for p in self.percentiles),
            *(Method("cantelli", b) for b in self.cantelli),
        ]

    def observed(self, clairvoyance: float) -> int:
        """Size of the observation set O (all R at clairvoyance 1)."""
        if clairvoyance >= 1.0:
            return self.realisations
        wanted = round(clairvoyance * self.realisations)
        return min(max(MIN_OBSERVATIONS, wanted), self.realisations - 1)


PAPER_SWEEP: Final = SweepSettings(
    tasks=1000,
    instances=50,
    realisations=10_000,
    clairvoyance=PAPER_CLAIRVOYANCE,
    algorithms=("bestfit", "firstfit"),
)


@dataclass(frozen=True, slots=True)
class UsageSeries:
    """Each kept VM's readings, from a usage trace."""

    trace: str
    statistic: Statistic
    names: tuple[tuple[str, str], ...]  # (pool, VM): a VM id is its pool's
    values: tuple[FloatArray, ...]
    dropped: int

    @property
    def true_means(self) -> FloatArray:
        return np.array([float(v.mean()) for v in self.values])


def load_usage_series(
    path: Path, statistic: Statistic = "mean", *, min_readings: int = MIN_READINGS
) -> UsageSeries:
    """Per VM, its CPU readings in time order (``UsageSample.cpu.mean`` or ``.peak``)."""
    trace = open_trace(path)
    readings: dict[tuple[str, str], list[float]] = defaultdict(list)
    for event in trace.events():
        if isinstance(event, UsageSample):
            stats = event.cpu
            value = stats.peak if statistic == "peak" else stats.mean
            readings[(event.pool, event.vm_id)].append(value)
    names: list[tuple[str, str]] = []
    values: list[FloatArray] = []
    for name, series in readings.items():
        array = np.asarray(series, dtype=np.float64)
        if len(array) >= min_readings and array.max() > 0:
            names.append(name)
            values.append(array)
    if not names:
        raise ValueError(f"{path}: no VM has {min_readings} or more CPU readings above 0")
    return UsageSeries(
        trace.name, statistic, tuple(names), tuple(values), len(readings) - len(names)
    )


@dataclass(frozen=True, slots=True)
class RunResult:
    """One packing: a method on one instance, capacity, clairvoyance level and algorithm."""

    instance: int
    capacity: float
    clairvoyance: float
    algorithm: Algorithm
    method: str
    family: Family
    parameter: float
    machines: int
    normalization: int
    m: float
    q: float
    moved: int


class PackingRun(Protocol):
    """What a summary row reads of one packing (read-only, so a narrower type fits)."""

    @property
    def family(self) -> str: ...
    @property
    def parameter(self) -> float: ...
    @property
    def machines(self) -> int: ...
    @property
    def m(self) -> float: ...
    @property
    def q(self) -> float: ...


_Run = TypeVar("_Run", bound=PackingRun)


def summary_rows(
    runs: Iterable[_Run],
    key_names: tuple[str, ...],
    key: Callable[[_Run], tuple[Any, ...]],
    more: Callable[[list[_Run], FloatArray], dict[str, Any]],
) -> list[dict[str, Any]]:
    """A row per group of ``runs`` with the same ``key`` (in first-seen order): the key
    under ``key_names``, the group's family, parameter, size and mean machines, m and q,
    then what ``more`` makes of the group and its q values."""
    groups: dict[tuple[Any, ...], list[_Run]] = defaultdict(list)
    for run in runs:
        groups[key(run)].append(run)
    rows = []
    for values, group in groups.items():
        q = np.array([r.q for r in group])
        first = group[0]
        rows.append(
            {
                **dict(zip(key_names, values, strict=True)),
                "family": first.family,
                "parameter": first.parameter,
                "instances": len(group),
                "machines": float(np.mean([r.machines for r in group])),
                "m": float(np.mean([r.m for r in group])),
                "q": float(q.mean()),
                **more(group, q),
            }
        )
    return rows


@dataclass(slots=True)
class SweepResult:
    trace: str
    path: str
    statistic: Statistic
    series: int
    dropped: int
    settings: SweepSettings
    runs: list[RunResult] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """Means over instances per (algorithm, clairvoyance, capacity, method)."""

        def more(runs: list[RunResult], q: FloatArray) -> dict[str, Any]:
            return {
                "q_min": float(q.min()),
                "q_max": float(q.max()),
                "q_over_rho": float(q.mean() / runs[0].parameter)
                if runs[0].family == "gpa"
                else None,
            }

        return summary_rows(
            self.runs,
            ("algorithm", "clairvoyance", "capacity", "method"),
            lambda r: (r.algorithm, r.clairvoyance, r.capacity, r.method),
            more,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "path": self.path,
            "statistic": self.statistic,
            "series": self.series,
            "dropped_series": self.dropped,
            "settings": asdict(self.settings),
            "summary": self.summary(),
            "runs": [asdict(run) for run in self.runs],
        }


def draw_tasks(rng: np.random.Generator, n_series: int, n_tasks: int) -> IntArray:
    """Series index per task: each series N // S times, the remainder without replacement."""
    whole, rest = divmod(n_tasks, n_series)
    picks = np.concatenate(
        [np.repeat(np.arange(n_series), whole), rng.choice(n_series, size=rest, replace=False)]
    ).astype(np.int64)
    rng.shuffle(picks)
    return picks


def realisations(
    rng: np.random.Generator, series: UsageSeries, picks: IntArray, count: int
) -> FloatArray:
    """``count`` independent draws from each picked series' empirical distribution (rows)."""
    drawn: FloatArray = np.empty((len(picks), count))
    for row, index in enumerate(picks.tolist()):
        values = series.values[index]
        drawn[row] = values[rng.integers(0, len(values), size=count)]
    return drawn


def machine_totals(packing: Packing, usage: FloatArray) -> FloatArray:
    """Per machine of ``packing`` (rows, in machine order), the sum of its tasks' rows of
    ``usage`` (a row per task)."""
    owner = packing.bin_of(len(usage))
    order = np.argsort(owner, kind="stable")
    sorted_owner = owner[order]
    starts = np.flatnonzero(np.r_[True, sorted_owner[1:] != sorted_owner[:-1]])
    totals: FloatArray = np.add.reduceat(usage[order], starts, axis=0)
    return totals


def overflow_frequency(packing: Packing, evaluation: FloatArray, capacity: float) -> float:
    """q: the fraction of (machine, realisation) pairs whose total usage exceeds ``capacity``."""
    totals = machine_totals(packing, evaluation)
    over = int(np.count_nonzero(totals > capacity))
    return float(over / (len(totals) * evaluation.shape[1]))


def run_sweep(
    series: UsageSeries,
    settings: SweepSettings,
    *,
    path: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Every method x capacity x clairvoyance x algorithm on every instance."""
    result = SweepResult(
        series.trace, path, series.statistic, len(series.values), series.dropped, settings
    )
    methods = settings.methods()
    all_means = series.true_means
    total = settings.instances * len(settings.clairvoyance)
    done = 0
    for instance in range(settings.instances):
        rng = np.random.default_rng([settings.seed, instance])
        picks = draw_tasks(rng, len(series.values), settings.tasks)
        drawn = realisations(rng, series, picks, settings.realisations)
        true_total = float(all_means[picks].sum())
        for clairvoyance in settings.clairvoyance:
            observed = settings.observed(clairvoyance)
            stats = ObservedStats.of(drawn[:, :observed], settings.percentiles)
            evaluation = drawn if observed == settings.realisations else drawn[:, observed:]
            tests = [(method, stats.fit_test(method)) for method in methods]
            for capacity in settings.capacities:
                normalization = max(1, math.ceil(true_total / capacity))
                for algorithm in settings.algorithms:
                    for method, test in tests:
                        packing = pack(test, capacity, best_fit=algorithm == "bestfit")
                        moved = rebalance(packing, test, capacity) if settings.rebalance else 0
                        machines = packing.machines
                        result.runs.append(
                            RunResult(
                                instance=instance,
                                capacity=capacity,
                                clairvoyance=clairvoyance,
                                algorithm=algorithm,
                                method=method.label,
                                family=method.family,
                                parameter=method.parameter,
                                machines=machines,
                                normalization=normalization,
                                m=machines / normalization,
                                q=overflow_frequency(packing, evaluation, capacity),
                                moved=moved,
                            )
                        )
            done += 1
            if progress is not None:
                progress(done, total)
    return result
