"""The Kubernetes Vertical Pod Autoscaler recommender, rebuilt from its public description.

Written from the VPA documentation and the behaviour its unit tests pin down
(``vertical-pod-autoscaler/pkg/recommender``), so that VPA and Autopilot run on
the same stream. Its defaults:

- CPU: a decaying histogram (half-life 24 h) of usage samples, exponential
  buckets from 0.01 cores growing 5 % (up to 1000 cores), each sample weighted
  by ``max(request, 0.1 cores)``.
- Memory: the peak of each 24-hour aggregation window, in a decaying histogram
  (half-life 24 h) with exponential buckets from 1e7 bytes growing 5 % (up to
  1e12); a window's peak replaces its earlier, smaller peak.
- Target: the 90th percentile, plus a 15 % margin, at least the minimum
  resources (25 millicores, 250 MiB).
- OOM: a memory sample of ``max(request + 100 MiB, 1.2 x request)`` in the
  current window.

Our streams give usage as a fraction of the VM's request, so ``VpaConfig``
carries the unit: how many cores and bytes one unit of the signal is. The
recommender works in cores and bytes inside, with VPA's buckets, and answers
in the signal's unit. The VPA target (its request recommendation) is used as
the limit; VPA would keep the limit/request ratio of the pod spec, which our
traces do not have. Confidence multipliers touch only VPA's lower and upper
bounds, never the target, so they are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from lavad.models.limits.histogram import HOUR_S, FloatArray, Observation
from lavad.models.limits.window import HeldLimit

MIB: Final = 1024.0 * 1024.0
GIB: Final = 1024.0 * MIB
VPA_HALF_LIFE_S: Final = 24 * HOUR_S
MEMORY_AGGREGATION_S: Final = 24 * HOUR_S
MAX_DECAY_EXPONENT: Final = 100
EPSILON: Final = 1e-4
MIN_SAMPLE_WEIGHT: Final = 0.1


class VpaBuckets:
    """VPA's histogram options: linear or exponential bucket starts, and an epsilon weight."""

    def __init__(self, starts: FloatArray, epsilon: float, *, kind: str, params: tuple[float, ...]):
        self.starts = starts
        self.epsilon = epsilon
        self.kind = kind
        self.params = params

    @classmethod
    def linear(cls, max_value: float, bucket_size: float, epsilon: float) -> VpaBuckets:
        if not (max_value > 0 and bucket_size > 0 and epsilon > 0):
            raise ValueError("max_value, bucket_size and epsilon must be > 0")
        n = math.ceil(max_value / bucket_size) + 1
        starts = np.asarray([bucket_size * i for i in range(n)], dtype=np.float64)
        return cls(starts, epsilon, kind="linear", params=(bucket_size,))

    @classmethod
    def exponential(
        cls, max_value: float, first_bucket_size: float, ratio: float, epsilon: float
    ) -> VpaBuckets:
        if not (max_value > 0 and first_bucket_size > 0 and epsilon > 0):
            raise ValueError("max_value, first_bucket_size and epsilon must be > 0")
        if not ratio > 1.0:
            raise ValueError(f"ratio must be > 1, got {ratio!r}")
        n = math.ceil(math.log(max_value * (ratio - 1) / first_bucket_size + 1) / math.log(ratio))
        starts = np.asarray(
            [first_bucket_size * (ratio**i - 1) / (ratio - 1) for i in range(n + 1)],
            dtype=np.float64,
        )
        return cls(starts, epsilon, kind="exponential", params=(first_bucket_size, ratio))

    @property
    def num_buckets(self) -> int:
        return len(self.starts)

    def start(self, bucket: int) -> float:
        return float(self.starts[bucket])

    def find(self, value: float) -> int:
        """The bucket holding ``value``: the last start <= value, clamped to the range."""
        if self.kind == "linear":
            raw = math.floor(value / self.params[0]) if value > 0 else 0
        else:
            first, ratio = self.params
            if value < first:
                return 0
            raw = math.floor(math.log(value * (ratio - 1) / first + 1) / math.log(ratio))
        bucket = min(max(raw, 0), self.num_buckets - 1)
        # Guard the closed form against rounding at a bucket edge.
        while bucket + 1 < self.num_buckets and self.starts[bucket + 1] <= value:
            bucket += 1
        while bucket > 0 and self.starts[bucket] > value:
            bucket -= 1
        return bucket


class VpaHistogram:
    """VPA's histogram: bucket weights, epsilon-empty buckets, end-of-bucket percentiles.

    With ``half_life_s`` it decays as VPA's: a sample at ``time`` weighs
    ``2**((time - ref) / half_life)``; ``ref`` moves (to a whole number of
    half-lives) when the exponent would pass 100, rescaling the stored weights.
    """

    def __init__(self, buckets: VpaBuckets, half_life_s: float | None = None) -> None:
        if half_life_s is not None and not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s!r}")
        self.buckets = buckets
        self.half_life_s = half_life_s
        self.weight = np.zeros(buckets.num_buckets)
        self.total = 0.0
        self.min_bucket = buckets.num_buckets - 1
        self.max_bucket = 0
        self.ref: float = 0.0

    # ------------------------------------------------------------- decaying

    def _decay(self, time: float) -> float:
        if self.half_life_s is None:
            return 1.0
        half = self.half_life_s
        if time > self.ref + half * MAX_DECAY_EXPONENT:
            new_ref = round(time / half) * half
            exponent = round((self.ref - new_ref) / half)
            self._scale(2.0**exponent)
            self.ref = new_ref
        return float(2.0 ** ((time - self.ref) / half))

    def _scale(self, factor: float) -> None:
        self.weight *= factor
        self.total *= factor
        self._update_min_max()

    # ------------------------------------------------------------ histogram

    def add(self, value: float, weight: float, time: float) -> None:
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight!r}")
        w = weight * self._decay(time)
        bucket = self.buckets.find(value)
        self.weight[bucket] += w
        self.total += w
        eps = self.buckets.epsilon
        if bucket < self.min_bucket and self.weight[bucket] >= eps:
            self.min_bucket = bucket
        if bucket > self.max_bucket and self.weight[bucket] >= eps:
            self.max_bucket = bucket

    def subtract(self, value: float, weight: float, time: float) -> None:
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight!r}")
        w = weight * self._decay(time)
        bucket = self.buckets.find(value)
        if w > self.weight[bucket] - self.buckets.epsilon:
            w = float(self.weight[bucket])
        self.total -= w
        self.weight[bucket] -= w
        self._update_min_max()

    def merge(self, other: VpaHistogram) -> None:
        if other.buckets is not self.buckets:
            raise ValueError("other must use the same bucket options")
        self.weight += other.weight
        self.total += other.total
        self.min_bucket = min(self.min_bucket, other.min_bucket)
        self.max_bucket = max(self.max_bucket, other.max_bucket)

    def _update_min_max(self) -> None:
        eps = self.buckets.epsilon
        last = self.buckets.num_buckets - 1
        while self.weight[self.min_bucket] < eps and self.min_bucket < last:
            self.min_bucket += 1
        while self.weight[self.max_bucket] < eps and self.max_bucket > 0:
            self.max_bucket -= 1

    def is_empty(self) -> bool:
        return bool(self.weight[self.min_bucket] < self.buckets.epsilon)

    def percentile(self, p: float) -> float:
        """The end of the bucket where the cumulative weight reaches ``p`` (0 when empty)."""
        if self.is_empty():
            return 0.0
        threshold = p * self.total
        partial = 0.0
        bucket = self.min_bucket
        while bucket < self.max_bucket:
            partial += self.weight[bucket]
            if partial >= threshold:
                break
            bucket += 1
        if bucket < self.buckets.num_buckets - 1:
            return self.buckets.start(bucket + 1)
        return self.buckets.start(bucket)


def cpu_buckets() -> VpaBuckets:
    """VPA's CPU histogram options: 0.01 cores first bucket, 5 % growth, up to 1000 cores."""
    return VpaBuckets.exponential(1000.0, 0.01, 1.05, EPSILON)


def memory_buckets() -> VpaBuckets:
    """VPA's memory histogram options: 1e7 bytes first bucket, 5 % growth, up to 1e12 bytes."""
    return VpaBuckets.exponential(1e12, 1e7, 1.05, EPSILON)


@dataclass(frozen=True)
class VpaConfig:
    """VPA's defaults; ``unit`` is how many cores (CPU) or bytes (memory) one signal unit is.

    The evaluation's traces give usage as a fraction of the VM's request;
    the default units take a request as 1 core and 4 GiB, which sets VPA's
    absolute floors (25 millicores, 250 MiB) at 2.5 % and 6.1 % of a request.
    """

    target_percentile: float = 0.9
    margin: float = 0.15
    half_life_s: float = VPA_HALF_LIFE_S
    min_cpu_cores: float = 0.025
    min_memory_bytes: float = 250 * MIB
    oom_min_bump_bytes: float = 100 * MIB
    oom_bump_ratio: float = 1.2
    memory_window_s: float = MEMORY_AGGREGATION_S
    cpu_unit_cores: float = 1.0
    memory_unit_bytes: float = 4 * GIB
    request_cores: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.target_percentile <= 1.0:
            raise ValueError(f"target_percentile must be in [0, 1], got {self.target_percentile}")
        for name in (
            "half_life_s",
            "memory_window_s",
            "cpu_unit_cores",
            "memory_unit_bytes",
            "request_cores",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value!r}")
        for name in ("margin", "min_cpu_cores", "min_memory_bytes", "oom_min_bump_bytes"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if self.oom_bump_ratio < 1.0:
            raise ValueError(f"oom_bump_ratio must be >= 1, got {self.oom_bump_ratio}")


def with_margin(value: float, margin: float) -> float:
    """VPA's margin estimator: ``value * (1 + margin)``."""
    return value * (1.0 + margin)


def with_minimum(value: float, minimum: float) -> float:
    """VPA's minimum-resources estimator: at least ``minimum``."""
    return max(value, minimum)


def oom_bump(request: float, min_bump: float, ratio: float) -> float:
    """The memory VPA records after an OOM: ``max(request + min_bump, request x ratio)``."""
    return max(request + min_bump, request * ratio)


class VpaRecommender(HeldLimit):
    """VPA's target for one job's one resource."""

    def __init__(self, resource: Literal["cpu", "memory"], config: VpaConfig | None = None):
        if resource not in ("cpu", "memory"):
            raise ValueError(f"resource must be 'cpu' or 'memory', got {resource!r}")
        self.resource = resource
        self.config = config if config is not None else VpaConfig()
        self.name = "vpa"
        buckets = cpu_buckets() if resource == "cpu" else memory_buckets()
        self.histogram = VpaHistogram(buckets, self.config.half_life_s)
        self.unit = (
            self.config.cpu_unit_cores if resource == "cpu" else self.config.memory_unit_bytes
        )
        self._window_end: float | None = None
        self._window_peak = 0.0  # absolute units
        self._limit: float | None = None

    def _add_memory_peak(self, value: float, time: float) -> None:
        """One sample per aggregation window: its peak so far, timestamped at the window end."""
        window = self.config.memory_window_s
        if self._window_end is None:
            self._window_end = time + window
        elif time >= self._window_end:
            skipped = math.floor((time - self._window_end) / window) + 1
            self._window_end += skipped * window
            self._window_peak = 0.0
        if value <= self._window_peak:
            return
        if self._window_peak > 0:
            self.histogram.subtract(self._window_peak, 1.0, self._window_end)
        self.histogram.add(value, 1.0, self._window_end)
        self._window_peak = value

    def observe(self, obs: Observation) -> None:
        if self.resource == "cpu":
            weight = max(self.config.request_cores, MIN_SAMPLE_WEIGHT)
            for value in obs.values:
                self.histogram.add(value * self.unit, weight, obs.end)
        else:
            self._add_memory_peak(obs.peak * self.unit, obs.end)
        self._update()

    def _update(self) -> None:
        cfg = self.config
        raw = self.histogram.percentile(cfg.target_percentile)
        minimum = cfg.min_cpu_cores if self.resource == "cpu" else cfg.min_memory_bytes
        self._limit = with_minimum(with_margin(raw, cfg.margin), minimum) / self.unit

    def on_overrun(self, time: float, limit: float) -> None:
        """An OOM (memory only): record the bumped request as this window's peak."""
        if self.resource != "memory":
            return
        cfg = self.config
        bumped = oom_bump(limit * self.unit, cfg.oom_min_bump_bytes, cfg.oom_bump_ratio)
        self._add_memory_peak(bumped, time)
        self._update()

    def explain(self) -> dict[str, str | float | None]:
        return {
            "recommender": self.name,
            "statistic": f"p{self.config.target_percentile * 100:g} of decaying histogram",
            "half_life_s": self.config.half_life_s,
            "window_s": self.config.memory_window_s if self.resource == "memory" else None,
            "margin": self.config.margin,
            "model": None,
        }
