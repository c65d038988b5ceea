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
can only narrow it, and it stays within [floor, cap]; 1 before any window.

The ratios are kept in a fixed histogram (``BINS`` bins, log-spaced from
``floor / 4`` to ``cap``, plus one below and one above): O(1) state and
O(BINS) work per window whatever the pool's size or the stream's length,
and the margin is a bin's upper edge (at most 3% wide at the defaults), so
it never rounds down.

``TailCalibration`` runs one margin per percentile method (normal,
Cornish-Fisher) on the same windows and picks, per pool, the method that
holds rho with the least headroom: the smallest margin x mean predicted
excess (relative to capacity), after ``min_windows`` windows; normal
(plain GPA with its margin) before. ``explain`` says which and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from lavad.models.arrays import FloatArray
from lavad.models.usage.tail import NORMAL, TAIL_METHODS

BINS: Final = 256


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
        if self.min_windows < 1:
            raise ValueError(f"min_windows must be >= 1, got {self.min_windows}")
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
        self.value = min(self.cap, max(self.floor, self.value))

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
        """The smallest bin edge with at most rho of the weight above it, within [floor, cap]."""
        total = float(self.weights.sum())
        # Weight strictly above each inner edge: everything in later bins.
        above = total - np.cumsum(self.weights[:-1])
        index = int(np.argmax(above <= self.rho * total)) if total else 0
        if total and above[index] > self.rho * total:
            return self.cap  # not even cap holds rho
        return float(min(self.cap, max(self.floor, self.edges[index]))) if total else 1.0

    @property
    def frequency(self) -> float:
        """Host windows that passed the margin in force / host windows (0 before any)."""
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
        """The method in force: the least headroom once ``min_windows`` are in, else normal."""
        methods = self.settings.methods
        if self.windows < self.settings.min_windows:
            return NORMAL if NORMAL in methods else methods[0]
        return min(methods, key=lambda m: (self.headroom(m), methods.index(m)))

    @property
    def margin(self) -> float:
        return self.margins[self.method].value

    def explain(self) -> dict[str, Any]:
        """Which method, which margin, and the measurements that chose them."""
        return {
            "method": self.method,
            "margin": self.margin,
            "windows": self.windows,
            "min_windows": self.settings.min_windows,
            "methods": {
                name: {
                    "margin": margin.value,
                    "headroom": self.headroom(name),
                    "overflow_frequency": margin.frequency,
                }
                for name, margin in self.margins.items()
            },
        }
