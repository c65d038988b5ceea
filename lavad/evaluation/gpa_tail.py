"""GPA with an honest tail, offline: the live daemon's method on the time-aligned protocol.

``gpa_aligned`` estimates each task from its history, packs, and measures
the overflow frequency q on the aligned future. The live GPA
(``UsageHooks`` with a ``TailCalibration``) does more: it watches every
host's realised usage against what the host was promised and learns, per
pool, a margin on the predicted excess and the percentile method (normal or
Cornish-Fisher) that needs the least headroom. Its offline counterpart:

1. The history's first half estimates every task (mean, variance, third and
   fourth cumulants) and plain GPA packs them: the pool before it has
   learned anything.
2. Its second half plays out on that packing, step by step in time order: each
   bin whose tasks all have a reading is one host window, fed to the same
   ``TailCalibration`` (and to one ``OverflowMargin`` on the empirical
   percentile of the bin's summed early history, an offline-only method,
   for comparison), against the promise made at packing: the early
   estimates, frozen, as a live host's promise is the state at its last
   placement.
3. The future is packed from the whole history with the method and margin
   learned; q is measured as everywhere in ``gpa_aligned``.

``gpa-online rho`` is that method (what a pool running lavad's GPA would
use); ``gpa-emp rho`` the empirical percentile with its own margin.
"""

from __future__ import annotations

import numpy as np

from lavad.core.cluster import BoolArray, FloatArray
from lavad.core.placement.gpa import gpa_fits, quantile_factor, standardized_headroom
from lavad.evaluation.stochastic_packing import (
    RELATIVE_TOLERANCE,
    GpaFitTest,
    Packing,
    pack,
    rebalance,
)
from lavad.models.usage.margin import (
    HostWindow,
    MarginSettings,
    OverflowMargin,
    TailCalibration,
)
from lavad.models.usage.tail import PERCENTILE_METHODS, tail_factor

# The promise is judged over as long a stretch as it was estimated on.
ONLINE_SPLIT = 1 / 2


def task_cumulants(history: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per task: mean, variance (ddof=1), third and fourth cumulants, skipping NaN steps."""
    mean = np.nanmean(history, axis=1)
    centred = history - mean[:, None]
    variance = np.nanvar(history, axis=1, ddof=1)
    second = np.nanmean(centred**2, axis=1)
    third = np.nanmean(centred**3, axis=1)
    fourth = np.nanmean(centred**4, axis=1) - 3.0 * second * second
    return mean, variance, third, fourth


class TailFitTest:
    """GPA with a percentile method and a margin: mu + m z_method(k2, k3, k4) sqrt(k2) <= c.

    Load terms are the additive cumulant sums (mean, variance, third,
    fourth); ``normal`` with margin 1 is ``GpaFitTest``.
    """

    def __init__(
        self,
        cumulants: tuple[FloatArray, FloatArray, FloatArray, FloatArray],
        rho: float,
        method: str,
        margin: float = 1.0,
    ) -> None:
        if method not in PERCENTILE_METHODS:
            raise ValueError(f"unknown tail method {method!r}")
        if not (np.isfinite(margin) and margin > 0):
            raise ValueError(f"margin must be > 0, got {margin}")
        self.name = f"gpa-{method} {rho:g} x{margin:.3g}"
        self.rho = rho
        self.method = method
        self.margin = margin
        self.z = quantile_factor(rho)
        mean, variance, third, fourth = cumulants
        self.terms: FloatArray = np.vstack([mean, np.maximum(variance, 0.0), third, fourth]).astype(
            np.float64
        )

    def _scaled_variance(self, load: FloatArray) -> FloatArray:
        """The variance whose normal percentile is this method's: (m z_method / z)^2 k2."""
        factor = tail_factor(self.method, self.z, self.rho, load[1], load[2], load[3])
        scale = self.margin * factor / self.z
        scaled: FloatArray = np.maximum(load[1], 0.0) * scale * scale
        return scaled

    def fits(self, load: FloatArray, capacity: float) -> BoolArray:
        variance = self._scaled_variance(load)
        return gpa_fits(load[0], variance, capacity, self.z, capacity * RELATIVE_TOLERANCE)

    def tightness(self, load: FloatArray, capacity: float) -> FloatArray:
        return standardized_headroom(load[0], self._scaled_variance(load), capacity)


class EmpiricalFitTest:
    """The (1 - rho) percentile of the bin's summed aligned history, its excess times a margin."""

    def __init__(self, history: FloatArray, rho: float, margin: float = 1.0) -> None:
        if history.ndim != 2 or history.shape[1] < 2 or not np.all(np.isfinite(history)):
            raise ValueError("history must be finite (tasks, steps) with at least 2 steps")
        self.name = f"gpa-emp {rho:g} x{margin:.3g}"
        self.rho = rho
        self.margin = margin
        self.terms: FloatArray = np.ascontiguousarray(history.T, dtype=np.float64)

    def _load(self, load: FloatArray) -> tuple[FloatArray, FloatArray]:
        mean: FloatArray = load.mean(axis=0)
        upper: FloatArray = np.percentile(load, 100.0 * (1.0 - self.rho), axis=0)
        return mean, mean + self.margin * np.maximum(upper - mean, 0.0)

    def fits(self, load: FloatArray, capacity: float) -> BoolArray:
        _, upper = self._load(load)
        fits: BoolArray = upper <= capacity * (1.0 + RELATIVE_TOLERANCE)
        return fits

    def tightness(self, load: FloatArray, capacity: float) -> FloatArray:
        mean, upper = self._load(load)
        spread = np.maximum(upper - mean, capacity * 1e-9)
        rank: FloatArray = (capacity - mean) / spread
        return rank


def _bin_sums(packing: Packing, values: FloatArray) -> FloatArray:
    """Per bin (rows), the sum of its tasks' rows of ``values`` (NaN where any is missing)."""
    sums: FloatArray = np.stack([values[tasks].sum(axis=0) for tasks in packing.bins if tasks])
    return sums


def online_calibration(
    history: FloatArray,
    filled: FloatArray,
    rho: float,
    capacity: float,
    settings: MarginSettings,
) -> tuple[TailCalibration, OverflowMargin]:
    """What a pool learns while the history's second half plays out on its first half's packing."""
    split = int(history.shape[1] * ONLINE_SPLIT)
    if split < 2 or history.shape[1] - split < 1:
        raise ValueError(f"history of {history.shape[1]} steps is too short to calibrate")
    early, late = history[:, :split], history[:, split:]
    mean, variance, third, fourth = task_cumulants(early)
    packing = pack(GpaFitTest(mean, variance, rho), capacity, best_fit=True)
    rebalance(packing, GpaFitTest(mean, variance, rho), capacity)
    z = quantile_factor(rho)
    bin_mean = np.array([mean[t].sum() for t in packing.bins if t])
    bin_var = np.maximum(np.array([variance[t].sum() for t in packing.bins if t]), 0.0)
    bin_third = np.array([third[t].sum() for t in packing.bins if t])
    bin_fourth = np.array([fourth[t].sum() for t in packing.bins if t])
    sigma = np.sqrt(bin_var)
    excess = {
        method: tail_factor(method, z, rho, bin_var, bin_third, bin_fourth) * sigma
        for method in settings.methods
    }
    early_sums = _bin_sums(packing, filled[:, :split])
    empirical_excess = np.maximum(
        np.percentile(early_sums, 100.0 * (1.0 - rho), axis=1) - early_sums.mean(axis=1), 0.0
    )
    realised = _bin_sums(packing, late)
    calibration = TailCalibration(rho, settings)
    empirical = OverflowMargin(rho, settings.half_life, settings.floor, settings.cap)
    means = bin_mean.tolist()
    excesses = [excess[method].tolist() for method in settings.methods]
    empirical_means = early_sums.mean(axis=1).tolist()
    empirical_list = empirical_excess.tolist()
    for step in range(realised.shape[1]):
        column = realised[:, step]
        hosts = np.flatnonzero(np.isfinite(column)).tolist()
        calibration.observe(
            [
                HostWindow(float(column[h]), means[h], tuple(e[h] for e in excesses), capacity)
                for h in hosts
            ]
        )
        empirical.observe(
            [
                (float(column[h]) - empirical_means[h]) / empirical_list[h]
                for h in hosts
                if empirical_list[h] > 0
            ]
        )
    return calibration, empirical
