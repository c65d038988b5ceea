"""Autopilot's moving-window recommenders (section 3.2.2).

A recommender sees one job's one resource as a stream of ``Observation``s
(5-minute windows, in time order) and keeps a limit. ``observe(obs)`` learns
from a window; ``limit`` is the recommendation for the next window, ``None``
before the first observation.

Statistics over the decayed aggregated signal (weights ``2**(-age / t_half)``):

- ``max``: the highest non-empty bucket bound over the last ``peak_samples``
  windows (``S_max``; the paper leaves N to the system: default one day).
- ``avg``: the weighted mean of the windows' averages (``S_avg``, equation 2).
  The paper divides by ``sum_{tau<=N} w``; we divide by the sum of the same
  weights as the numerator, so a constant signal gives its value.
- ``pJJ``: the JJ-th percentile of the load-adjusted decayed histogram
  ``h[k] = b[k] * sum w s[k]`` (``S_pj``, equation 3).
- ``p60_half_max``: ``max(S_p60, 0.5 S_max)``, memory at intermediate OOM tolerance.

Post-processing: times ``1 + margin`` (the paper's 10-15 %), then the maximum of
those values over the last hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal, Protocol

import numpy as np

from lavad.models.limits.histogram import (
    CPU_HALF_LIFE_S,
    HOUR_S,
    MEMORY_HALF_LIFE_S,
    BucketScheme,
    Cumulative,
    DecayedCounts,
    Observation,
    cumulative_percentile,
    cumulative_weights,
)
from lavad.models.limits.window_max import WindowMax

Statistic = Literal["max", "avg", "p60", "p90", "p95", "p98", "p60_half_max"]
Resource = Literal["cpu", "memory"]
JobClass = Literal["batch", "serving", "serving_latency_sensitive"]
OomTolerance = Literal["minimal", "low", "intermediate"]

STATISTICS: Final[tuple[Statistic, ...]] = (
    "max",
    "avg",
    "p60",
    "p90",
    "p95",
    "p98",
    "p60_half_max",
)
DEFAULT_MARGIN: Final = 0.10
DAY_SAMPLES: Final = 288


class LimitRecommender(Protocol):
    """What the evaluation and the limit decisions need from any recommender."""

    name: str

    def observe(self, obs: Observation) -> None:
        """Learn from one window (windows arrive in time order)."""

    @property
    def limit(self) -> float | None:
        """The limit for the next window, or None before any observation."""

    def explain(self) -> dict[str, str | float | None]:
        """Statistic, window, margin and chosen model, for a person to read."""

    def on_overrun(self, time: float, limit: float) -> None:
        """The window ending at ``time`` ran over ``limit`` (an OOM, for memory)."""


class HeldLimit:
    """A recommender that keeps the limit it chose in ``_limit``: callers read it, never set it."""

    _limit: float | None

    @property
    def limit(self) -> float | None:
        return self._limit


def default_statistic(
    resource: Resource,
    job_class: JobClass = "serving",
    oom_tolerance: OomTolerance = "low",
) -> Statistic:
    """The paper's default statistic by resource, job class and OOM tolerance."""
    if resource == "cpu":
        if job_class == "batch":
            return "avg"
        return "p95" if job_class == "serving_latency_sensitive" else "p90"
    if resource == "memory":
        by_tolerance: dict[str, Statistic] = {
            "minimal": "max",
            "low": "p98",
            "intermediate": "p60_half_max",
        }
        return by_tolerance[oom_tolerance]
    raise ValueError(f"resource must be 'cpu' or 'memory', got {resource!r}")


@dataclass(frozen=True)
class WindowConfig:
    """A moving-window recommender's parameters (defaults: the paper's)."""

    statistic: Statistic = "p95"
    half_life_s: float = CPU_HALF_LIFE_S
    margin: float = DEFAULT_MARGIN
    hold_s: float = HOUR_S
    peak_samples: int = DAY_SAMPLES

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {self.statistic!r}")
        if not (math.isfinite(self.half_life_s) and self.half_life_s > 0):
            raise ValueError(f"half_life_s must be > 0, got {self.half_life_s!r}")
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"margin must be >= 0, got {self.margin!r}")
        if not (math.isfinite(self.hold_s) and self.hold_s >= 0):
            raise ValueError(f"hold_s must be >= 0, got {self.hold_s!r}")
        if self.peak_samples < 1:
            raise ValueError(f"peak_samples must be >= 1, got {self.peak_samples!r}")

    @classmethod
    def for_resource(
        cls,
        resource: Resource,
        job_class: JobClass = "serving",
        oom_tolerance: OomTolerance = "low",
    ) -> WindowConfig:
        """12 h half-life for CPU, 48 h for memory, and the class's default statistic."""
        half = CPU_HALF_LIFE_S if resource == "cpu" else MEMORY_HALF_LIFE_S
        return cls(default_statistic(resource, job_class, oom_tolerance), half)


class WindowSignal:
    """What a moving window's statistics read, learned once per window: the decayed
    histogram, the decayed average and the last ``peak_samples`` windows' peaks.

    Windows of one job that differ only in their statistic, margin or hold share
    one signal (lavad's ``ml`` runs three for CPU): each would learn the same
    from the same windows, and binning, decaying and averaging a window is most
    of what a moving window costs. The first of them to see a window updates
    the signal; the others find it done.
    """

    def __init__(self, scheme: BucketScheme, half_life_s: float, peak_samples: int) -> None:
        if peak_samples < 1:
            raise ValueError(f"peak_samples must be >= 1, got {peak_samples!r}")
        self.scheme = scheme
        self.half_life_s = half_life_s
        self.peak_samples = peak_samples
        self.counts = DecayedCounts(len(scheme), half_life_s)
        # The decayed sum of the windows' averages and of their weights, in one
        # array: they decay together, and one add costs less than two.
        self.average_pair = DecayedCounts(2, half_life_s)
        self.peaks = WindowMax()  # the last ``peak_samples`` windows' peaks
        self.windows = 0  # windows learned
        self.last_end: float | None = None
        # The load-adjusted histogram's cumulative weights, and the window they
        # are of: windows sharing the signal take their percentiles of one.
        self._cumulative: Cumulative | None = None
        self._cumulative_of = 0

    def learn(self, obs: Observation, seen: int) -> None:
        """``obs`` is the ``seen``-th window of the window asking: learn it, unless a
        window sharing this signal already has."""
        if seen == self.windows and obs.end == self.last_end:
            return
        if seen != self.windows + 1:
            raise ValueError(
                f"windows sharing a signal must see the same windows: this one is at "
                f"window {seen} (ending {obs.end}), the signal at {self.windows} "
                f"(ending {self.last_end})"
            )
        scheme = self.scheme
        values = obs.values
        # The window's average is that of its histogram, as the paper's
        # s-bar[tau] = sum b[j] s[j] / sum s[j].
        if len(values) <= 2:
            # A window of an interval's mean and peak (the traces' usage records):
            # its one or two buckets by bisection, and the sums above in scalars.
            # They are numpy's to the bit: the histogram's other entries add exact
            # zeros, and a sum of two nonzero terms is the same in either order.
            buckets: dict[int, float] = {}
            for value in values:
                bucket = scheme.bucket(value)
                buckets[bucket] = buckets.get(bucket, 0.0) + 1.0
            self.counts.add_at(buckets, obs.end)
            load = 0.0
            for bucket, count in buckets.items():
                load += scheme.bounds[bucket] * count
            mean = load / len(values)
            top = max(buckets)
        else:
            counts = scheme.counts(values)
            self.counts.add(counts, obs.end)
            mean = float((scheme.b * counts).sum() / counts.sum())
            top = int(np.flatnonzero(counts)[-1])
        self.average_pair.add_at({0: mean, 1: 1.0}, obs.end)
        self.peaks.add(obs.end, scheme.bounds[top])
        self.peaks.drop_beyond(self.peak_samples)
        self.windows = seen
        self.last_end = obs.end

    def load_cumulative(self) -> Cumulative:
        """The cumulative weights of ``h[k] = b[k] sum w s[k]``, taken once per window."""
        cumulative = self._cumulative
        if cumulative is None or self._cumulative_of != self.windows:
            cumulative = self._cumulative = cumulative_weights(self.scheme.b * self.counts.acc)
            self._cumulative_of = self.windows
        return cumulative


class MovingWindowRecommender(HeldLimit):
    """One statistic over the decayed signal, plus margin and one-hour hold.

    ``signal``: one shared with other windows of the same job, scheme, half-life
    and number of peaks (``WindowSignal``); without it the window has its own.
    """

    def __init__(
        self,
        config: WindowConfig,
        scheme: BucketScheme | None = None,
        signal: WindowSignal | None = None,
    ) -> None:
        self.config = config
        if signal is None:
            scheme = scheme if scheme is not None else BucketScheme.default()
            signal = WindowSignal(scheme, config.half_life_s, config.peak_samples)
        elif (
            (scheme is not None and scheme != signal.scheme)
            or signal.half_life_s != config.half_life_s
            or signal.peak_samples != config.peak_samples
        ):
            raise ValueError(
                "a shared signal must have the window's scheme, half_life_s and peak_samples"
            )
        self.scheme = signal.scheme
        self.signal = signal
        self.name = f"window-{config.statistic}"
        self._seen = 0  # windows observed
        self._held = WindowMax()  # the limits with margin of the last ``hold_s``
        self._raw: float | None = None
        self._limit: float | None = None

    # ----------------------------------------------------------- statistics

    def percentile(self, q: float) -> float:
        """``P_q`` of the load-adjusted histogram ``h[k] = b[k] sum w s[k]``."""
        return cumulative_percentile(self.scheme.b, self.signal.load_cumulative(), q)

    def average(self) -> float:
        acc = self.signal.average_pair.acc
        num, den = float(acc[0]), float(acc[1])
        return num / den if den > 0 else 0.0

    def peak(self) -> float:
        peaks = self.signal.peaks
        return peaks.max() if len(peaks) else 0.0

    def raw(self) -> float:
        """``S[t]`` before margin and hold."""
        stat = self.config.statistic
        if stat == "max":
            return self.peak()
        if stat == "avg":
            return self.average()
        if stat == "p60_half_max":
            return max(self.percentile(0.60), 0.5 * self.peak())
        return self.percentile(int(stat[1:]) / 100.0)

    # ------------------------------------------------------------ interface

    def observe(self, obs: Observation) -> None:
        self._seen += 1
        self.signal.learn(obs, self._seen)
        self._raw = self.raw()
        with_margin = self._raw * (1.0 + self.config.margin)
        self._held.add(obs.end, with_margin)
        # Keep the current window even with hold_s = 0 (drop_through keeps one).
        self._held.drop_through(obs.end - self.config.hold_s)
        self._limit = self._held.max()

    def explain(self) -> dict[str, str | float | None]:
        return {
            "recommender": self.name,
            "statistic": self.config.statistic,
            "half_life_s": self.config.half_life_s,
            "window_s": self.config.hold_s,
            "margin": self.config.margin,
            "raw": self._raw,
            "model": None,
        }

    def on_overrun(self, time: float, limit: float) -> None:
        """Autopilot's moving window does not react to OOMs beyond the signal itself."""
