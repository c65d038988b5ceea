"""Offline stochastic bin packing (GPA paper, sections 4 and 5.1): fit tests, packer, rebalancing.

Items are tasks with statistics estimated from observed usage; bins are
identical machines of capacity c. A fit test turns each task into additive
load terms (GPA: mean and variance; the baselines: one deterministic size)
and says, for candidate bins' loads with the task added, which fit and how
tightly:

* ``GpaFitTest(rho)``: sum mu + z(rho) sqrt(sum sigma^2) <= c (``gpa.py``);
* ``CovarianceGpaFitTest(rho)``: the same quantile on the bin's aligned
  historical sum, so covariances between co-located tasks count (not in
  the paper, which assumes independent tasks; see the class);
* ``SizeFitTest``: sum of sizes <= c, with the paper's baselines as sizes:
  ``average`` (mean x f), ``percentile`` (the p-th percentile of the
  observations) and ``cantelli`` (mean + b x standard deviation).

``pack`` is First Fit or Best Fit (the fitting bin with the smallest
tightness: leftover capacity for sizes, standardised headroom for GPA). A
task that fits no open bin opens a new one even if it would not fit an empty
bin either, as Algorithm 1's FindBin does, so every task is placed.
``rebalance`` is the paper's heuristic for the underloaded last bin: round
robin over the other bins, try to move each one's first task into the last
bin, stop after ``max_failures`` moves that do not fit (5 in the paper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np

from lavad.core.cluster import BoolArray, FloatArray, IntArray
from lavad.core.placement.gpa import gpa_fits, quantile_factor, standardized_headroom

# Loads are sums of floats; a bin filled exactly to c must still fit.
RELATIVE_TOLERANCE: Final = 1e-9
PAPER_MAX_FAILURES: Final = 5


class FitTest(Protocol):
    name: str

    @property
    def terms(self) -> FloatArray:
        """Load terms per task: shape (width, tasks); a bin's load is the sum over its tasks."""

    def fits(self, load: FloatArray, capacity: float) -> BoolArray:
        """For loads of shape (width, bins) that include the candidate task: which bins fit."""

    def tightness(self, load: FloatArray, capacity: float) -> FloatArray:
        """Best Fit's rank of the same bins: lower is tighter (only fitting bins are compared)."""


class SizeFitTest:
    """Deterministic sizes: a bin fits while the sum of its tasks' sizes is at most c."""

    def __init__(self, name: str, sizes: FloatArray) -> None:
        if sizes.ndim != 1 or not np.all(np.isfinite(sizes)):
            raise ValueError(f"{name}: sizes must be a finite 1-D array")
        self.name = name
        self.terms: FloatArray = sizes.reshape(1, -1).astype(np.float64)

    @classmethod
    def average(cls, mean: FloatArray, factor: float) -> SizeFitTest:
        """av f: the observed mean times ``factor``."""
        return cls(f"av {factor:g}", mean * factor)

    @classmethod
    def percentile(cls, observations: FloatArray, percent: float) -> SizeFitTest:
        """perc p: the p-th percentile of each task's observations (rows: tasks)."""
        if not 0.0 <= percent <= 100.0:
            raise ValueError(f"percentile must be in [0, 100], got {percent}")
        sizes: FloatArray = np.percentile(observations, percent, axis=1)
        return cls(f"perc {percent:g}", sizes)

    @classmethod
    def cantelli(cls, mean: FloatArray, std: FloatArray, multiplier: float) -> SizeFitTest:
        """Cantelli b: mean + b x standard deviation (b = 4.4 bounds P(X > size) by 5 %)."""
        return cls(f"cantelli {multiplier:g}", mean + multiplier * std)

    def fits(self, load: FloatArray, capacity: float) -> BoolArray:
        fits: BoolArray = load[0] <= capacity * (1.0 + RELATIVE_TOLERANCE)
        return fits

    def tightness(self, load: FloatArray, capacity: float) -> FloatArray:
        left: FloatArray = capacity - load[0]
        return left


class GpaFitTest:
    """GPA: load terms are each task's mean and variance; the fit is the normal quantile."""

    def __init__(self, mean: FloatArray, variance: FloatArray, rho: float) -> None:
        if mean.shape != variance.shape or mean.ndim != 1:
            raise ValueError("mean and variance must be 1-D arrays of the same length")
        self.name = f"gpa {rho:g}"
        self.rho = rho
        self.z = quantile_factor(rho)
        self.terms: FloatArray = np.vstack([mean, np.maximum(variance, 0.0)]).astype(np.float64)

    def fits(self, load: FloatArray, capacity: float) -> BoolArray:
        return gpa_fits(load[0], load[1], capacity, self.z, capacity * RELATIVE_TOLERANCE)

    def tightness(self, load: FloatArray, capacity: float) -> FloatArray:
        return standardized_headroom(load[0], load[1], capacity)


class CovarianceGpaFitTest:
    """GPA on the variance of the bin's summed, time-aligned history (not in the paper).

    The paper's GPA adds variances, which assumes co-located tasks are
    independent. Real tasks drift through the day together, so the variance
    of their sum is sum sigma^2 + 2 sum cov. Here each task's load terms are
    its whole history (one row per time step, all tasks on the same steps),
    a bin's load is the summed series, and the fit is mean + z std (ddof=1)
    of that series <= c, which counts every covariance at O(steps) per test.
    """

    def __init__(self, history: FloatArray, rho: float, margin: float = 1.0) -> None:
        if history.ndim != 2 or history.shape[1] < 2:
            raise ValueError("history must be (tasks, steps) with at least 2 steps")
        if not np.all(np.isfinite(history)):
            raise ValueError("history must be finite")
        if not (np.isfinite(margin) and margin >= 1.0):
            raise ValueError(f"margin must be a number >= 1, got {margin}")
        self.name = f"gpa-cov {rho:g}" if margin == 1.0 else f"gpa-cov {rho:g} x{margin:g}"
        self.rho = rho
        # ``margin`` widens z for what the history cannot show (drift): see
        # ``gpa_aligned.calibrated_margin``.
        self.z = margin * quantile_factor(rho)
        self.terms: FloatArray = np.ascontiguousarray(history.T, dtype=np.float64)

    def _moments(self, load: FloatArray) -> tuple[FloatArray, FloatArray]:
        mean: FloatArray = load.mean(axis=0)
        variance: FloatArray = load.var(axis=0, ddof=1)
        return mean, variance

    def fits(self, load: FloatArray, capacity: float) -> BoolArray:
        mean, variance = self._moments(load)
        return gpa_fits(mean, variance, capacity, self.z, capacity * RELATIVE_TOLERANCE)

    def tightness(self, load: FloatArray, capacity: float) -> FloatArray:
        mean, variance = self._moments(load)
        return standardized_headroom(mean, variance, capacity)


@dataclass(slots=True)
class Packing:
    """Tasks per bin, in the order they were put there, and each bin's load."""

    bins: list[list[int]]
    loads: FloatArray

    @property
    def machines(self) -> int:
        return sum(1 for tasks in self.bins if tasks)

    def bin_of(self, n_tasks: int) -> IntArray:
        """The bin of every task (-1 for a task not packed)."""
        owner: IntArray = np.full(n_tasks, -1, dtype=np.int64)
        for index, tasks in enumerate(self.bins):
            owner[tasks] = index
        return owner


def pack(test: FitTest, capacity: float, *, best_fit: bool) -> Packing:
    """Place the tasks in index order by First Fit or Best Fit under ``test``."""
    if not capacity > 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    terms = test.terms
    width, n_tasks = terms.shape
    loads: FloatArray = np.zeros((width, max(n_tasks, 1)))
    bins: list[list[int]] = []
    opened = 0
    for task in range(n_tasks):
        chosen = opened
        if opened:
            after = loads[:, :opened] + terms[:, task : task + 1]
            fits = test.fits(after, capacity)
            if best_fit:
                rank = np.where(fits, test.tightness(after, capacity), np.inf)
                best = int(rank.argmin())
                if fits[best]:
                    chosen = best
            else:
                first = int(fits.argmax())
                if fits[first]:
                    chosen = first
        if chosen == opened:
            bins.append([])
            opened += 1
        loads[:, chosen] += terms[:, task]
        bins[chosen].append(task)
    return Packing(bins, loads[:, :opened].copy())


def rebalance(
    packing: Packing, test: FitTest, capacity: float, max_failures: int = PAPER_MAX_FAILURES
) -> int:
    """The paper's rebalancing, in place; returns how many tasks moved to the last bin."""
    if max_failures < 1:
        raise ValueError(f"max_failures must be >= 1, got {max_failures}")
    bins = packing.bins
    if len(bins) < 2:
        return 0
    terms = test.terms
    loads = packing.loads
    last = len(bins) - 1
    sources = last
    occupied = sum(1 for tasks in bins[:last] if tasks)
    failures = 0
    moved = 0
    turn = 0
    while failures < max_failures and occupied:
        source = turn
        turn = (turn + 1) % sources
        tasks = bins[source]
        if not tasks:
            continue
        task = tasks[0]
        after = loads[:, last] + terms[:, task]
        if not test.fits(after.reshape(-1, 1), capacity)[0]:
            failures += 1
            continue
        tasks.pop(0)
        bins[last].append(task)
        loads[:, source] -= terms[:, task]
        loads[:, last] = after
        moved += 1
        if not tasks:
            occupied -= 1
    return moved
