"""Does ``ml`` dominate the VPA on every (trace, resource) pair, over seeds and both halves?

One *cell* is one (trace, resource, seed, half): the jobs ``load_jobs`` draws
with that seed, cut to that half of the trace (``trace_half``), replayed by
``ml`` and the VPA alone (the other recommenders do not enter the verdict).
A cell dominates as ``dominates`` says (both means no worse, one better,
changes within ``change_ratio`` x the VPA's).

Per pair, over its cells: how many dominate, the worst cell (the one that
misses dominance by most: the largest of the slack and overrun differences,
each relative to the VPA's value in that cell, and of the changes past their
bound; among equals, one that does not dominate, such as a tie), and for
each of the two differences (ml - VPA, mean relative slack in points,
overrun rate in points) the mean over cells with a 95% Student-t interval.
Cells are treated as independent draws: the seeds draw different (possibly
overlapping) job samples and the halves are different days, so the interval
is the spread of what a pair shows across them, not a test on one sample. A
pair's verdict is read from its worst cell, never from the mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from scipy import stats

from lavad.evaluation.limits import (
    DEFAULT_WARMUP_S,
    RecommenderFactory,
    RecommenderScore,
    Resource,
    default_recommenders,
    dominates,
    evaluate_jobs,
    load_jobs,
    trace_half,
)

HALVES: Final = ("first", "second")
CONFIDENCE: Final = 0.95


@dataclass(frozen=True)
class Cell:
    """``ml`` and the VPA on one (trace, resource, seed, half)."""

    trace: str
    resource: Resource
    seed: int
    part: str
    jobs: int
    ml: RecommenderScore
    vpa: RecommenderScore
    dominates: bool
    change_ratio: float = 2.0

    @property
    def slack_diff(self) -> float:
        """ml - VPA mean relative slack (a fraction; negative: ml leaves less)."""
        return self.ml.relative_slack_mean - self.vpa.relative_slack_mean

    @property
    def overrun_diff(self) -> float:
        """ml - VPA overrun rate (a fraction of windows; negative: ml runs over less)."""
        return self.ml.overrun_rate - self.vpa.overrun_rate

    def shortfall(self) -> float:
        """How far the cell is from dominance: the largest of the two differences, each over
        the VPA's own value, and of ml's changes over their bound, less 1 (<= 0 on all
        three is what dominance needs)."""
        slack = self.slack_diff / max(self.vpa.relative_slack_mean, 1e-12)
        over = self.overrun_diff / max(self.vpa.overrun_rate, 1e-12)
        bound = self.change_ratio * self.vpa.changes_per_job_day
        changes = self.ml.changes_per_job_day / max(bound, 1e-12) - 1.0
        return max(slack, over, changes)


@dataclass(frozen=True)
class Interval:
    """Mean over cells and the half-width of its Student-t interval (nan with one cell)."""

    mean: float
    half_width: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
        n = len(values)
        if n == 0:
            return cls(math.nan, math.nan, 0)
        arr = np.asarray(values, dtype=np.float64)
        mean = float(arr.mean())
        if n == 1:
            return cls(mean, math.nan, 1)
        sem = float(arr.std(ddof=1)) / math.sqrt(n)
        quantile = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1))
        return cls(mean, quantile * sem, n)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


@dataclass(frozen=True)
class PairSummary:
    """One (trace, resource) over its cells."""

    trace: str
    resource: Resource
    cells: int
    dominated: int
    slack_diff: Interval
    overrun_diff: Interval
    worst: Cell

    @property
    def all_dominate(self) -> bool:
        return self.dominated == self.cells


def evaluate_cells(
    path: Path,
    *,
    seeds: Iterable[int],
    parts: Iterable[str] = HALVES,
    max_jobs: int | None = 20,
    warmup_s: float = DEFAULT_WARMUP_S,
    change_ratio: float = 2.0,
    recommenders: dict[str, RecommenderFactory] | None = None,
) -> list[Cell]:
    """``ml`` against the VPA on every seed x part of one trace, for each resource it has."""
    every = recommenders or default_recommenders()
    pair = {name: every[name] for name in ("ml", "vpa")}
    trace = Path(path).name
    cells = []
    for seed in seeds:
        drawn = load_jobs(path, max_jobs=max_jobs, seed=seed)
        for part in parts:
            jobs = trace_half(drawn, part)
            scores = evaluate_jobs(jobs, pair, warmup_s=warmup_s)
            for resource in ("cpu", "memory"):
                got = {s.recommender: s for s in scores if s.resource == resource}
                if "ml" not in got or "vpa" not in got:
                    continue
                ml, vpa = got["ml"], got["vpa"]
                verdict = dominates(ml, vpa, change_ratio=change_ratio)
                cells.append(
                    Cell(trace, resource, seed, part, ml.jobs, ml, vpa, verdict, change_ratio)
                )
    return cells


def summarise(cells: Sequence[Cell]) -> list[PairSummary]:
    """Per (trace, resource), in the order the cells first name them."""
    keys: list[tuple[str, Resource]] = []
    for cell in cells:
        if (cell.trace, cell.resource) not in keys:
            keys.append((cell.trace, cell.resource))
    out = []
    for trace, resource in keys:
        mine = [c for c in cells if c.trace == trace and c.resource == resource]
        out.append(
            PairSummary(
                trace=trace,
                resource=resource,
                cells=len(mine),
                dominated=sum(c.dominates for c in mine),
                slack_diff=Interval.of([c.slack_diff for c in mine]),
                overrun_diff=Interval.of([c.overrun_diff for c in mine]),
                worst=max(mine, key=lambda c: (c.shortfall(), not c.dominates)),
            )
        )
    return out


def cells_as_dicts(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """The cells as plain data (for ``--json``)."""
    return [
        {
            "trace": c.trace,
            "resource": c.resource,
            "seed": c.seed,
            "part": c.part,
            "jobs": c.jobs,
            "dominates": c.dominates,
            "ml": asdict(c.ml),
            "vpa": asdict(c.vpa),
        }
        for c in cells
    ]
