"""Online recalibration of P(T > e) at every bin edge, learned from resolved predictions.

A lifetime model's survival curve can be off in a systematic way: a workload
that drifts towards shorter lives makes tables of the whole history say
P(T > 1 h) = 0.95 where 0.85 of the VMs now outlive the hour. This
calibrator learns, per bin edge e and per band of the model's own (raw)
prediction p = P(T > e) (``probability_bins`` equal-width bands), how far
the outcomes of recent VMs are from what it said, and shifts every curve by
that much:

    p' = clip(p + (survived - predicted) / (weight + prior_strength), 0, 1)

with ``weight`` the (recency-weighted) number of VMs resolved at that edge
in that band, ``survived`` how many of them outlived e and ``predicted``
the sum of their p. It is histogram binning shrunk towards the identity by
a prior of ``prior_strength`` VMs, as an additive correction so that the
model's order within a band is kept. The calibrated curve is made
non-increasing again (a running minimum over the edges).

**What counts as resolved.** A VM resolves edge e once: as a survivor when
its uptime passes e, as a death when it exits at or before e. A VM evicted
or still running resolves nothing beyond its uptime (censoring). What is
calibrated is the prediction the VM got at its creation (the one placement
used): the model records, per refit interval, the raw curve each key tuple
was given (``record``), and a VM is found again by its key tuple and
creation time. (A VM judged instead by the model of its resolution would
mostly be judged by its own group, which it has joined by then, and not by
the coarser one a new group is predicted from at creation.) Curves are kept
``window_s``: edges past it are not recalibrated (the curve is the model's
there, but never above the calibrated value at the window). Learning happens at the
model's refits (event times only, so a replay and the live daemon agree):
survivors are the running VMs whose uptime passed an edge since the last
refit; exits and evictions since then are queued (``defer``) and resolved
at the refit too.

**Forgetting.** Every count halves each ``half_life_s`` of event time,
weighted by when it resolved. Deaths at edge e resolve up to e earlier than
survivors of the same cohort, so a workload whose lifetimes drift makes
long edges lag; in a stationary one the flows of deaths and survivors are
both steady and the rate is unbiased.

**A floor.** The calibrated masses are mixed with the raw ones at
``RAW_SHARE``, so that no bin the model gave mass to gets none (a bin of
zero probability would make one VM's log score infinite).
"""

from __future__ import annotations

import bisect
import math
from typing import Final

import numba
import numpy as np

from lavad.models.argument_checks import require_at_least
from lavad.models.arrays import FloatArray
from lavad.models.lifetime.bins import LifetimeBins

GroupRows = tuple[int, ...]

RAW_SHARE: Final = 0.02
CALIBRATION_HALF_LIFE_S: Final = 7 * 86_400.0
# A creation time found again from an exit (its time minus its lifetime)
# carries rounding; refits are far further apart than this.
_START_SLACK_S: Final = 1e-6


@numba.njit(cache=True, nogil=True)
def _calibrated_tables(
    survival: FloatArray,
    shift: FloatArray,
    raw_share: float,
    representative: FloatArray,
    mass: FloatArray,
    m0: FloatArray,
    m1: FloatArray,
) -> None:
    """``SurvivalCalibrator.calibrated_mass`` and its suffix sums, one compiled loop per row."""
    rows, edges = survival.shape
    bands = shift.shape[1]
    for i in range(rows):
        running = 1.0
        before = 1.0
        for j in range(edges):
            raw = survival[i, j]
            band = min(int(raw * bands), bands - 1)
            calibrated = min(max(raw + shift[j, band], 0.0), 1.0)
            running = min(running, calibrated)
            curve = (1.0 - raw_share) * running + raw_share * raw
            mass[i, j] = max(before - curve, 0.0)
            before = curve
        mass[i, edges] = before
        m0[i, edges + 1] = 0.0
        m1[i, edges + 1] = 0.0
        total = 0.0
        moment = 0.0
        for j in range(edges, -1, -1):
            total += mass[i, j]
            moment += mass[i, j] * representative[j]
            m0[i, j] = total
            m1[i, j] = moment


class SurvivalCalibrator:
    def __init__(
        self,
        bins: LifetimeBins,
        *,
        half_life_s: float | None = CALIBRATION_HALF_LIFE_S,
        prior_strength: float = 20.0,
        probability_bins: int = 10,
        window_s: float = 7 * 86_400.0,
    ) -> None:
        if half_life_s is not None and not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        if not prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
        require_at_least(1, probability_bins=probability_bins)
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        # The edges learned: those within the window.
        self._window_edges = int(np.searchsorted(bins.edges[1:], window_s, side="right"))
        # Survival is calibrated at the inner edges e_1 .. e_last (S(e_0 = 0) = 1).
        self.edges: FloatArray = np.asarray(bins.edges[1:], dtype=np.float64)
        self.half_life_s = half_life_s
        self.prior_strength = float(prior_strength)
        self.probability_bins = probability_bins
        shape = (len(self.edges), probability_bins)
        self.weight: FloatArray = np.zeros(shape)
        self.survived: FloatArray = np.zeros(shape)
        self.predicted: FloatArray = np.zeros(shape)
        # Bumped whenever the map changes: rows calibrated before are stale.
        self.map_version = 0
        # The map's shifts, as of ``shift_version``.
        self.shift: FloatArray = np.zeros(shape)
        self.shift_version = -1
        self.last_learned: float | None = None
        # Exits and evictions since the last refit: (group rows, uptime at the
        # last refit, lifetime or uptime seen, exited, creation time).
        self.pending: list[tuple[GroupRows, float, float, bool, float]] = []
        # Per refit interval still in the window: its start, and the raw
        # curve each key tuple (its group rows) was predicted with in it.
        self.interval_starts: list[float] = []
        self.at_creation: list[dict[GroupRows, FloatArray]] = []

    def record(self, rows: GroupRows, survival: FloatArray) -> None:
        """VMs of these group rows created now are predicted ``survival`` (raw, at the edges)."""
        if not self.at_creation:
            # Before the first refit: an interval from the beginning of time.
            self.interval_starts.append(-math.inf)
            self.at_creation.append({})
        current = self.at_creation[-1]
        if rows not in current:
            current[rows] = np.array(survival, dtype=np.float64)

    def creation_survival(
        self, rows: np.ndarray, starts: FloatArray
    ) -> tuple[FloatArray, np.ndarray]:
        """The raw curves VMs (group rows, creation times) got at creation, and which were kept."""
        survival = np.zeros((len(rows), len(self.edges)))
        found = np.zeros(len(rows), dtype=np.bool_)
        starts_list = self.interval_starts
        for i, (line, start) in enumerate(zip(rows.tolist(), starts.tolist(), strict=True)):
            interval = bisect.bisect_right(starts_list, start + _START_SLACK_S) - 1
            if interval < 0:
                continue
            curve = self.at_creation[interval].get(tuple(line))
            if curve is not None:
                survival[i] = curve
                found[i] = True
        return survival, found

    # ------------------------------------------------------------ learning

    def defer(self, rows: GroupRows, seen: float, now: float, exited: bool) -> None:
        """A VM left at ``now`` after ``seen``: resolve it at the next refit."""
        last = self.last_learned
        uptime_then = -math.inf if last is None else seen - (now - last)
        self.pending.append((rows, uptime_then, seen, exited, now - seen))

    def age(self, now: float) -> None:
        """Counts decay since the last refit, and a new refit interval starts (a refit)."""
        self.interval_starts.append(now)
        self.at_creation.append({})
        last = self.last_learned
        if self.half_life_s is not None and last is not None and now > last:
            factor = 0.5 ** ((now - last) / self.half_life_s)
            self.weight *= factor
            self.survived *= factor
            self.predicted *= factor
            self.map_version += 1
        self.last_learned = now

    def prune(self, now: float) -> None:
        """Drop the curves of intervals that ended before the window (after a refit's learning).

        Their VMs are older than ``window_s`` now, and edges past it are not learned.
        """
        while len(self.interval_starts) > 1 and self.interval_starts[1] < now - self.window_s:
            del self.interval_starts[0]
            del self.at_creation[0]

    def learn(
        self,
        survival: FloatArray,
        survived_from: FloatArray,
        survived_to: FloatArray,
        died_from: FloatArray,
    ) -> None:
        """Resolve edges of N predictions: ``survival`` (N, edges) is each one's raw P(T > e).

        Prediction i survived every edge e with survived_from[i] <= e <
        survived_to[i] and died at every edge e >= died_from[i] (inf: none).
        """
        survival = np.asarray(survival, dtype=np.float64).reshape(-1, len(self.edges))
        if not len(survival):
            return
        edges = self.edges
        low = np.searchsorted(edges, survived_from, side="left")
        high = np.searchsorted(edges, survived_to, side="left")
        dead = np.searchsorted(edges, died_from, side="left")
        # Only the predictions that resolve something (most running VMs pass
        # no edge in an hour: the edges are log-spaced).
        some = (high > low) | (dead < len(edges))
        if not some.any():
            return
        survival, low, high, dead = survival[some], low[some], high[some], dead[some]
        index = np.arange(len(edges))[None, :]
        # Only edges within the window: past it no survivor is found again
        # (its curve is gone), so its deaths alone would bias the edge.
        within = index < self._window_edges
        lived = (index >= low[:, None]) & (index < high[:, None]) & within
        died = (index >= dead[:, None]) & within
        resolved = lived | died
        band = np.minimum(
            (survival * self.probability_bins).astype(np.int64), self.probability_bins - 1
        )
        cell = (index * self.probability_bins + band)[resolved]
        size = self.weight.size
        self.weight += np.bincount(cell, minlength=size).reshape(self.weight.shape)
        self.survived += np.bincount(
            cell, weights=lived[resolved].astype(np.float64), minlength=size
        ).reshape(self.weight.shape)
        self.predicted += np.bincount(cell, weights=survival[resolved], minlength=size).reshape(
            self.weight.shape
        )
        self.map_version += 1

    # ------------------------------------------------------------ applying

    def calibrate(self, survival: FloatArray) -> FloatArray:
        """Calibrated P(T > e) at every edge, non-increasing, for rows of raw ``survival``."""
        survival = np.asarray(survival, dtype=np.float64).reshape(-1, len(self.edges))
        band = np.minimum(
            (survival * self.probability_bins).astype(np.int64), self.probability_bins - 1
        )
        edge = np.arange(len(self.edges))[None, :]
        shift = (self.survived - self.predicted) / (self.weight + self.prior_strength)
        calibrated = np.clip(survival + shift[edge, band], 0.0, 1.0)
        result: FloatArray = np.minimum.accumulate(calibrated, axis=1)
        return result

    def tables(
        self, survival: FloatArray, representative: FloatArray
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``calibrated_mass`` and its suffix sums (``survival.suffix_sums``), compiled."""
        if self.shift_version != self.map_version:
            self.shift = (self.survived - self.predicted) / (self.weight + self.prior_strength)
            self.shift_version = self.map_version
        survival = np.ascontiguousarray(survival, dtype=np.float64).reshape(-1, len(self.edges))
        rows, width = len(survival), len(self.edges) + 1
        mass = np.empty((rows, width))
        m0 = np.empty((rows, width + 1))
        m1 = np.empty((rows, width + 1))
        _calibrated_tables(
            survival,
            self.shift,
            RAW_SHARE,
            np.ascontiguousarray(representative, dtype=np.float64),
            mass,
            m0,
            m1,
        )
        return mass, m0, m1

    def fill_row(
        self,
        survival: FloatArray,
        representative: FloatArray,
        mass: FloatArray,
        m0: FloatArray,
        m1: FloatArray,
        row: int,
    ) -> None:
        """``tables`` of one raw curve written into row ``row`` of ``mass``, ``m0``, ``m1``.

        The same compiled loop, without its temporaries (a row at a time, at
        its first use after a refit: what a prediction at creation waits for).
        """
        if self.shift_version != self.map_version:
            self.shift = (self.survived - self.predicted) / (self.weight + self.prior_strength)
            self.shift_version = self.map_version
        _calibrated_tables(
            survival.reshape(1, -1),
            self.shift,
            RAW_SHARE,
            representative,
            mass[row : row + 1],
            m0[row : row + 1],
            m1[row : row + 1],
        )

    def calibrated_mass(self, survival: FloatArray) -> FloatArray:
        """Bin masses (one more than edges: the open bin) of the calibrated curves."""
        raw = np.asarray(survival, dtype=np.float64).reshape(-1, len(self.edges))
        curve = (1.0 - RAW_SHARE) * self.calibrate(raw) + RAW_SHARE * raw
        ones = np.ones((len(curve), 1))
        before = np.concatenate([ones, curve], axis=1)
        after = np.concatenate([curve, np.zeros((len(curve), 1))], axis=1)
        mass: FloatArray = np.maximum(before - after, 0.0)
        return mass
