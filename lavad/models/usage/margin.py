"""An online, per-pool margin on GPA's predicted excess, driven by realised overflows.

GPA promises P(host usage > c) <= rho: a host fits while its mean sum plus
the predicted excess (``z sigma``, or the Cornish-Fisher excess of
``tail.py``) stays below c. When the stream shows the promise broken (VMs
that move together, a workload that drifts after placement, tails no
moment captures), a margin ``m`` scales the excess: ``mu + m x excess <= c``.

Each closed usage window of a host whose VMs all reported gives the
realised sum S against the host's promise (its mean sum mu and excess e).
The host *would have overflowed had it been packed to the margin* m iff
S > mu + m e, i.e. iff the ratio r = (S - mu) / e exceeds m. The margin is
the smallest m at which the realised overflow frequency of the recent host
windows, so counted, is at most rho: the (1 - rho) quantile of their
ratios (split conformal prediction, with time decay as in adaptive conformal
inference, Gibbs and Candes 2021). It needs no feedback from its own
packing: a host that is not full still tells what a full one would have
done. Each window's weight halves every ``half_life`` windows (a week of
5-minute windows by default), so the margin follows a workload that
changes; an overflow (a ratio above m) can only widen it, a window without
can only narrow it, and it stays within [floor, cap].

Split conformal prediction bounds the next score at level 1 - rho with n
calibration scores only when ceil((n + 1)(1 - rho)) <= n, i.e. when
n >= (1 - rho) / rho (9, 19 and 99 scores at rho = 0.1, 0.05, 0.01); with
fewer, the honest bound is infinite. With decayed weights the same holds
for the weighted quantile (Barber, Candes, Ramdas and Tibshirani 2023,
nonexchangeable conformal prediction): the scores carry their weights, the
next one weight 1 at +infinity, and the margin is the smallest m with at
most rho of the total weight W + 1 above it, finite iff W >= (1 - rho) / rho.
Until then the margin is ``cap`` and ``conformal`` is false: the pool's
learned margins are no bound yet.

The ratios are kept in a fixed histogram (``BINS`` bins, log-spaced from
``floor / 4`` to ``cap``, plus one below and one above): O(1) state and
O(BINS) work per window whatever the pool's size or the stream's length,
and the margin is a bin's upper edge (at most 3% wide at the defaults), so
it never rounds down.

``TailCalibration`` runs one margin per percentile method (normal,
Cornish-Fisher) on the same windows and picks, per pool, among the methods
whose margin is a conformal bound, the one that holds rho with the least
headroom: the smallest margin x mean predicted excess (relative to
capacity), after ``min_windows`` windows; normal (plain GPA with its
margin) before. While no margin is a bound (a new pool, or one whose hosts
score too few windows for rho), the pool reads its hosts through Cantelli's
one-sided bound, mu + sqrt((1 - rho) / rho) sigma, which holds for every
distribution with that mean and variance and needs no score at all.
``explain`` says which method, which margin, and the evidence behind them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from lavad.models.argument_checks import require_at_least
from lavad.models.arrays import FloatArray
from lavad.models.usage.tail import CANTELLI, NORMAL, TAIL_METHODS

BINS: Final = 256


def scores_needed(rho: float) -> float:
    """(1 - rho) / rho: the fewest scores (total weight) whose conformal (1 - rho) bound is finite.

    The weighted conformal quantile puts the next score's weight 1 at
    +infinity; it is finite iff rho (W + 1) >= 1, i.e. W >= (1 - rho) / rho.
    """
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho!r}")
    return (1.0 - rho) / rho


@dataclass(frozen=True, slots=True)
class MarginSettings:
    """half_life in windows; floor/cap: the margin's range; min_windows before a method choice."""

    half_life: float = 2016.0
    floor: float = 1.0
    cap: float = 20.0
    min_windows: int = 48
    methods: tuple[str, ...] = TAIL_METHODS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.half_life) and self.half_life > 0):
            raise ValueError(f"margin half_life must be > 0 windows, got {self.half_life}")
        if not (math.isfinite(self.floor) and 0.0 < self.floor <= 1.0):
            raise ValueError(f"margin floor must be in (0, 1], got {self.floor}")
        if not (math.isfinite(self.cap) and self.cap >= 1.0):
            raise ValueError(f"margin cap must be a number >= 1, got {self.cap}")
        require_at_least(1, min_windows=self.min_windows)
        unknown = [m for m in self.methods if m not in TAIL_METHODS]
        if unknown or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {TAIL_METHODS}, got {unknown}")


@dataclass(slots=True)
class OverflowMargin:
    """The margin m on one method's predicted excess, from a decayed histogram of ratios."""

    rho: float
    half_life: float = 2016.0
    floor: float = 1.0
    cap: float = 20.0
    value: float = 1.0
    windows: int = 0
    overflows: int = 0
    # Upper edges of the inner bins; weights[0] is below edges[0], weights[-1] above cap.
    edges: FloatArray = field(default_factory=lambda: np.empty(0))
    weights: FloatArray = field(default_factory=lambda: np.empty(0))

    def __post_init__(self) -> None:
        if not 0.0 < self.rho < 1.0:
            raise ValueError(f"rho must be in (0, 1), got {self.rho!r}")
        if not (0.0 < self.floor <= 1.0 <= self.cap and math.isfinite(self.cap)):
            raise ValueError(f"need 0 < floor <= 1 <= cap, got {self.floor}, {self.cap}")
        if not self.edges.size:
            self.edges = np.geomspace(self.floor / 4.0, self.cap, BINS)
            self.weights = np.zeros(BINS + 1)
        # Too few scores for a finite conformal bound: the margin is its clip, cap.
        self.value = min(self.cap, max(self.floor, self.value)) if self.conformal else self.cap

    def observe(self, ratios: Sequence[float]) -> int:
        """One closed window: each scored host's realised excess / predicted; returns overflows.

        Overflows are counted against the margin in force before the window.
        """
        if not ratios:
            return 0
        values = np.asarray(ratios, dtype=np.float64)
        if np.isnan(values).any():
            raise ValueError("ratios must not be NaN")
        overflows = int(np.count_nonzero(values > self.value))
        self.weights *= 0.5 ** (1.0 / self.half_life)
        # Bin i holds ratios in (edges[i-1], edges[i]]; the last, those above cap.
        np.add.at(self.weights, np.searchsorted(self.edges, values, side="left"), 1.0)
        self.windows += len(values)
        self.overflows += overflows
        self.value = self._quantile()
        return overflows

    def _quantile(self) -> float:
        """The weighted conformal quantile: the smallest bin edge with at most rho of the
        weight above it, the next score's weight 1 counted above every edge; within
        [floor, cap], and cap while that bound is infinite (too little weight)."""
        if not self.conformal:
            return self.cap
        total = float(self.weights.sum())
        # Rounding must not turn an exact tie (W = 19 at rho 0.1: one score may sit above) away.
        allowed = self.rho * (total + 1.0) - 1.0 + 1e-9 * (total + 1.0)
        # Weight strictly above each inner edge: everything in later bins.
        above = total - np.cumsum(self.weights[:-1])
        index = int(np.argmax(above <= allowed))
        if above[index] > allowed:
            return self.cap  # not even cap holds rho
        return float(min(self.cap, max(self.floor, self.edges[index])))

    @property
    def evidence(self) -> float:
        """The scores' total (decayed) weight: the n of the conformal condition."""
        return float(self.weights.sum())

    @property
    def conformal(self) -> bool:
        """Whether the scores are enough for a finite conformal bound: W >= (1 - rho) / rho."""
        return self.rho * (self.evidence + 1.0) >= 1.0 - 1e-9

    @property
    def frequency(self) -> float:
        """Host windows that passed the margin in force / host windows (0 before any).

        Before the conformal condition holds, the margin in force is ``cap``.
        """
        return self.overflows / self.windows if self.windows else 0.0


@dataclass(frozen=True, slots=True)
class HostWindow:
    """One host's closed window: realised sum, the promise's mean sum, each method's excess."""

    realised: float
    mean: float
    # Predicted excess over the mean per method, in ``MarginSettings.methods`` order.
    excess: tuple[float, ...]
    capacity: float

    def __post_init__(self) -> None:
        if not self.capacity > 0:
            raise ValueError(f"capacity must be > 0, got {self.capacity}")


@dataclass(slots=True)
class TailCalibration:
    """Per pool: one margin per percentile method, and the method chosen by measurement."""

    rho: float
    settings: MarginSettings = field(default_factory=MarginSettings)
    margins: dict[str, OverflowMargin] = field(default_factory=dict)
    # Decayed mean over windows of each method's mean predicted excess / capacity.
    _excess: dict[str, float] = field(default_factory=dict)
    _weight: float = 0.0
    windows: int = 0

    def __post_init__(self) -> None:
        s = self.settings
        for method in s.methods:
            self.margins.setdefault(method, OverflowMargin(self.rho, s.half_life, s.floor, s.cap))
            self._excess.setdefault(method, 0.0)

    def observe(self, hosts: Sequence[HostWindow]) -> None:
        """One closed window: per scored host, its realised sum against its promise.

        A method whose predicted excess is not > 0 (a host without spread)
        learns nothing from that host: no margin scales 0.
        """
        if not hosts:
            return
        decay = 0.5 ** (1.0 / self.settings.half_life)
        for index, (method, margin) in enumerate(self.margins.items()):
            ratios = []
            excess = 0.0
            for host in hosts:
                predicted = host.excess[index]
                excess += predicted / host.capacity
                if predicted > 0:
                    ratios.append((host.realised - host.mean) / predicted)
            self._excess[method] = self._excess[method] * decay + excess / len(hosts)
            margin.observe(ratios)
        self._weight = self._weight * decay + 1.0
        self.windows += 1

    def headroom(self, method: str) -> float:
        """Margin x mean predicted excess, as a share of capacity: what the method reserves."""
        if not self._weight:
            return 0.0
        return self.margins[method].value * self._excess[method] / self._weight

    @property
    def method(self) -> str:
        """The method in force, among those whose margin is a conformal bound: the least
        headroom once ``min_windows`` are in, else normal; Cantelli's bound while none is."""
        bounded = [m for m in self.settings.methods if self.margins[m].conformal]
        if not bounded:
            return CANTELLI
        if self.windows < self.settings.min_windows:
            return NORMAL if NORMAL in bounded else bounded[0]
        return min(bounded, key=lambda m: (self.headroom(m), bounded.index(m)))

    @property
    def margin(self) -> float:
        """The margin on the method in force; 1 on Cantelli's bound, which no score scales."""
        method = self.method
        return 1.0 if method == CANTELLI else self.margins[method].value

    def explain(self) -> dict[str, Any]:
        """Which method, which margin, and the measurements that chose them."""
        return {
            "method": self.method,
            "margin": self.margin,
            "windows": self.windows,
            "min_windows": self.settings.min_windows,
            "scores_needed": scores_needed(self.rho),
            "methods": {
                name: {
                    "margin": margin.value,
                    "headroom": self.headroom(name),
                    "overflow_frequency": margin.frequency,
                    "evidence": margin.evidence,
                    "conformal": margin.conformal,
                }
                for name, margin in self.margins.items()
            },
        }
