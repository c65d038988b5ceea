"""An online, per-pool margin on GPA's predicted excess, driven by realised overflows.

GPA promises P(host usage > c) <= rho: a host fits while its mean sum plus
the predicted excess (``z sigma``, or the Cornish-Fisher excess of
``tail.py``) stays below c. When the stream shows the promise broken (VMs
that move together, a workload that drifts after placement, tails no
moment captures), a margin ``m`` scales the excess: ``mu + m x excess <= c``.

Each closed usage window of a host whose VMs all reported gives the
realised sum S against the host's promise (its mean sum mu and excess e).
The host *would have overflowed had it been packed to the margin* iff
S > mu + m e, i.e. iff the ratio r = (S - mu) / e exceeds m. When a usage
window closes with W such hosts, O of them overflowing,

    log m <- log m + rate x (O / W - rho),

the online quantile update behind adaptive conformal inference (Gibbs and
Candes, 2021): its drift is 0 exactly where P(r > m) = rho, so m settles at
the (1 - rho) quantile of the realised ratios whatever made them that large,
and it needs no feedback from its own packing (a host that is not full still
tells what a full one would have done). It widens after overflows and
narrows while none come, within [floor, cap]. One step per window, not per
host, so its memory is in time (about 1 / (rate x rho) windows: 1,000 five-
minute windows, 3.5 days, at rate 0.1 and rho 0.01) whatever the pool's size.

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
from typing import Any

from lavad.models.usage.tail import NORMAL, TAIL_METHODS


@dataclass(frozen=True, slots=True)
class MarginSettings:
    """rate: log step per window; floor/cap: the margin's range; windows before a choice."""

    rate: float = 0.1
    floor: float = 1.0
    cap: float = 20.0
    min_windows: int = 48
    headroom_half_life: float = 1000.0
    methods: tuple[str, ...] = TAIL_METHODS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and 0.0 < self.rate <= 1.0):
            raise ValueError(f"margin rate must be in (0, 1], got {self.rate}")
        if not (math.isfinite(self.floor) and 0.0 < self.floor <= 1.0 <= self.cap):
            raise ValueError(
                f"margin floor must be in (0, 1] and cap >= 1, got {self.floor}, {self.cap}"
            )
        if not math.isfinite(self.cap):
            raise ValueError(f"margin cap must be finite, got {self.cap}")
        if self.min_windows < 1:
            raise ValueError(f"min_windows must be >= 1, got {self.min_windows}")
        if not self.headroom_half_life > 0:
            raise ValueError(f"headroom_half_life must be > 0, got {self.headroom_half_life}")
        unknown = [m for m in self.methods if m not in TAIL_METHODS]
        if unknown or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {TAIL_METHODS}, got {unknown}")


@dataclass(slots=True)
class OverflowMargin:
    """The multiplier m on a method's predicted excess, and the overflows that moved it."""

    rho: float
    rate: float = 0.1
    floor: float = 1.0
    cap: float = 20.0
    value: float = 1.0
    windows: int = 0
    overflows: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.rho < 1.0:
            raise ValueError(f"rho must be in (0, 1), got {self.rho!r}")
        self.value = min(self.cap, max(self.floor, self.value))

    def observe(self, ratios: Sequence[float]) -> int:
        """One closed window: each scored host's realised excess / predicted; returns overflows."""
        if not ratios:
            return 0
        margin = self.value
        overflows = sum(1 for ratio in ratios if ratio > margin)
        if any(math.isnan(ratio) for ratio in ratios):
            raise ValueError("ratios must not be NaN")
        step = self.rate * (overflows / len(ratios) - self.rho)
        self.value = min(self.cap, max(self.floor, margin * math.exp(step)))
        self.windows += len(ratios)
        self.overflows += overflows
        return overflows

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
            self.margins.setdefault(method, OverflowMargin(self.rho, s.rate, s.floor, s.cap))
            self._excess.setdefault(method, 0.0)

    def observe(self, hosts: Sequence[HostWindow]) -> None:
        """One closed window: per scored host, its realised sum against its promise.

        A method whose predicted excess is not > 0 (a host without spread)
        learns nothing from that host: no margin scales 0.
        """
        if not hosts:
            return
        decay = 0.5 ** (1.0 / self.settings.headroom_half_life)
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
