"""Bucket schemes, decaying histograms and per-job 5-minute aggregation (Autopilot 3.2.1).

Two bucket conventions live here, because the two recommender families need them:

- ``BucketScheme`` (Autopilot): bucket ``k`` holds values in ``(b[k-1], b[k]]``
  and is represented by its upper bound ``b[k]``. The paper writes the
  half-open ``[b[k-1], b[k])``; we close the buckets on the right so that a
  limit equal to a bucket bound never counts a sample of that bucket as an
  overrun (``o(L)`` in equation 4 counts ``b[j] > L``), and so that the
  Figure 2 example (load 1 for 9 units, 10 for 1 unit) has its p90 at
  exactly 10. Values above the last bound fall in the last bucket.
- ``VpaBuckets`` (Kubernetes VPA): bucket ``i`` starts at ``start(i)`` and
  holds ``[start(i), start(i+1))``; a percentile returns the *end* of its
  bucket, except in the last bucket, which has no end.

Time is always an argument (seconds, the event time), never read from a clock.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
from numpy.typing import NDArray

from lavad.models.limits.open_windows import OpenWindows

FloatArray = NDArray[np.float64]

INTERVAL_S: Final = 300.0
HOUR_S: Final = 3600.0
CPU_HALF_LIFE_S: Final = 12 * HOUR_S
MEMORY_HALF_LIFE_S: Final = 48 * HOUR_S
# Rescale the decay reference when weights grow past 2**MAX_DECAY_EXPONENT, as
# VPA does, so a long-lived job never overflows a float.
MAX_DECAY_EXPONENT: Final = 100.0


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class BucketScheme:
    """Fixed bucket upper bounds ``b[0] < b[1] < ...`` (Autopilot's ~400 buckets)."""

    bounds: tuple[float, ...]
    _array: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.bounds) < 2:
            raise ValueError(f"bounds must hold at least 2 values, got {len(self.bounds)}")
        arr = np.asarray(self.bounds, dtype=np.float64)
        if not np.all(np.isfinite(arr)) or np.any(np.diff(arr) <= 0) or arr[0] < 0:
            raise ValueError("bounds must be finite, >= 0 and strictly increasing")
        object.__setattr__(self, "_array", arr)

    @classmethod
    def linear(cls, max_value: float, size: float) -> BucketScheme:
        """Bounds ``size, 2 size, ...`` up to at least ``max_value``."""
        _positive("max_value", max_value)
        _positive("size", size)
        n = math.ceil(max_value / size - 1e-9)
        return cls(tuple(size * (i + 1) for i in range(max(n, 2))))

    @classmethod
    def exponential(cls, max_value: float, first: float, ratio: float) -> BucketScheme:
        """Bounds ``first * (ratio**(k+1) - 1) / (ratio - 1)``: each bucket ``ratio`` x the last."""
        _positive("max_value", max_value)
        _positive("first", first)
        if not (math.isfinite(ratio) and ratio > 1.0):
            raise ValueError(f"ratio must be > 1, got {ratio!r}")
        bounds: list[float] = []
        k = 1
        while not bounds or bounds[-1] < max_value:
            bounds.append(first * (ratio**k - 1.0) / (ratio - 1.0))
            k += 1
        return cls(tuple(bounds))

    @classmethod
    def default(cls) -> BucketScheme:
        """~290 buckets from 0.25 % to 400 % of the request, 1 % apart in ratio."""
        return cls.exponential(max_value=4.0, first=0.0025, ratio=1.01)

    @property
    def b(self) -> FloatArray:
        """The upper bounds as an array (do not modify)."""
        return self._array

    def __len__(self) -> int:
        return len(self.bounds)

    def find(self, values: FloatArray | Sequence[float]) -> NDArray[np.intp]:
        """Bucket index of each value: the first ``k`` with ``value <= b[k]`` (last if none)."""
        idx = np.searchsorted(self._array, np.asarray(values, dtype=np.float64), side="left")
        return np.minimum(idx, len(self.bounds) - 1)

    def bucket(self, value: float) -> int:
        """``find`` of one value, without numpy's cost per call (the same side)."""
        return min(bisect.bisect_left(self.bounds, value), len(self.bounds) - 1)

    def counts(self, values: FloatArray | Sequence[float]) -> FloatArray:
        """The histogram ``s[t]`` of the given samples: how many fall in each bucket."""
        return np.bincount(self.find(values), minlength=len(self.bounds)).astype(np.float64)


def weighted_percentile(bounds: FloatArray, weights: FloatArray, q: float) -> float:
    """The smallest bound whose cumulative weight reaches ``q`` of the total (0 if empty)."""
    return cumulative_percentile(bounds, cumulative_weights(weights), q)


# A histogram's total weight and its cumulative weights: what its percentiles
# read, taken once for every percentile of the same histogram.
Cumulative = tuple[float, FloatArray]


def cumulative_weights(weights: FloatArray) -> Cumulative:
    return float(weights.sum()), np.cumsum(weights)


def cumulative_percentile(bounds: FloatArray, cumulative: Cumulative, q: float) -> float:
    """``weighted_percentile`` of the weights ``cumulative`` was taken of."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    total, cum = cumulative
    if total <= 0.0:
        return 0.0
    # A relative tolerance so that 0.9 x total is reached by a cumulative sum
    # that equals it up to rounding (Figure 2's time-based p90 is exactly 9/10).
    k = int(np.searchsorted(cum, q * total * (1.0 - 1e-12), side="left"))
    return float(bounds[min(k, len(bounds) - 1)])


class DecayedCounts:
    """``sum_tau w[tau] s[t - tau]`` with ``w[tau] = 2**(-tau / half_life)`` (equations 1, 3).

    Stored against a reference time, as ``sum 2**((t_i - ref) / half_life) s_i``;
    dividing by ``2**((now - ref) / half_life)`` gives the decayed counts at
    ``now``. Percentiles do not depend on that common factor, so they need no
    division at all.
    """

    def __init__(self, size: int, half_life_s: float) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size!r}")
        self.half_life_s = _positive("half_life_s", half_life_s)
        self.acc = np.zeros(size, dtype=np.float64)
        self.ref: float | None = None

    def _factor(self, time: float) -> float:
        if self.ref is None:
            self.ref = time
        exponent = (time - self.ref) / self.half_life_s
        if exponent > MAX_DECAY_EXPONENT:
            self.acc *= 2.0 ** (-exponent)
            self.ref = time
            exponent = 0.0
        return float(2.0**exponent)

    def add(self, counts: FloatArray, time: float) -> None:
        """Add one interval's histogram, observed at ``time`` (seconds)."""
        self.acc += self._factor(time) * counts

    def add_at(self, counts: Mapping[int, float], time: float) -> None:
        """``add`` of a histogram given as its nonzero entries by index: the same sums,
        since an entry of 0 adds an exact 0.0, without a pass over every entry."""
        factor = self._factor(time)
        acc = self.acc
        for index, count in counts.items():
            acc[index] += factor * count

    def at(self, now: float) -> FloatArray:
        """The decayed counts as seen at ``now`` (a new array)."""
        if self.ref is None:
            return np.zeros_like(self.acc)
        factor = float(2.0 ** (-(now - self.ref) / self.half_life_s))
        result: FloatArray = self.acc * factor
        return result


# Below this many values numpy sums an array of float64 one value after the
# other from 0.0; from it on, in eight interleaved sums (its pairwise sum).
_NUMPY_SEQUENTIAL_BELOW: Final = 8


def numpy_mean(values: Sequence[float]) -> float:
    """``float(np.mean(values))``, bit for bit, without numpy's cost on a short list.

    A window's mean usage is a mean of each task's few samples (two, mean and
    peak, in the Google and Bitbrains traces): ``np.mean`` would take a tenth
    of a usage replay's time, as a numpy call per task. Below eight values numpy
    adds them in order from 0.0, as this does; from eight on this is
    ``np.mean`` itself. A test holds the two equal, sign of zero included.
    """
    count = len(values)
    if count >= _NUMPY_SEQUENTIAL_BELOW or count == 0:
        return float(np.mean(values))
    total = 0.0
    for value in values:
        total += value
    return total / count


@dataclass(frozen=True, slots=True)
class Observation:
    """One job's one resource over one 5-minute window: ``s[t]`` as its raw samples.

    ``values`` are the samples the histogram counts (CPU: every usage sample of
    every task; memory: each task's peak). ``peak`` is the largest usage any
    task reached in the window: what an overrun is measured against. ``usage``
    is the job's mean usage per task, for slack.
    """

    end: float
    values: tuple[float, ...]
    peak: float
    usage: float

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("values must hold at least one sample")
        if any(not math.isfinite(v) or v < 0 for v in self.values):
            raise ValueError(f"values must be finite and >= 0, got {self.values!r}")


@dataclass
class _Window:
    cpu: list[float] = field(default_factory=list)
    cpu_peak: dict[str, float] = field(default_factory=dict)
    cpu_mean: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    mem_peak: dict[str, float] = field(default_factory=dict)
    mem_mean: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


class JobAggregator:
    """Per-job 5-minute aggregation of a per-task usage stream (section 3.2.1).

    ``add(job, task, time, cpu_samples, memory_peak)`` files a task's samples
    under the window holding ``time``; ``close(now)`` returns, in (end, job)
    order, the observations of every window that ended at or before ``now``.
    CPU observations carry every raw sample of every task (the job histogram
    is the sum of the task histograms); memory observations carry one value
    per task, its peak. A task with no memory reading adds nothing to memory.
    """

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = _positive("interval_s", interval_s)
        self._open: OpenWindows[_Window] = OpenWindows()

    def add(
        self,
        job: str,
        task: str,
        time: float,
        cpu_samples: Iterable[float],
        memory_peak: float | None = None,
    ) -> None:
        """File samples taken in ``[time - interval, time)``; the window ends at ``ceil(time)``."""
        end = math.ceil(time / self.interval_s) * self.interval_s
        window = self._open.get(end, job, _Window)
        samples = [float(v) for v in cpu_samples]
        if samples:
            window.cpu.extend(samples)
            window.cpu_peak[task] = max(window.cpu_peak.get(task, 0.0), *samples)
            window.cpu_mean[task].extend(samples)
        if memory_peak is not None:
            window.mem_peak[task] = max(window.mem_peak.get(task, 0.0), float(memory_peak))
            window.mem_mean[task].append(float(memory_peak))

    def close(self, now: float) -> list[tuple[str, Observation | None, Observation | None]]:
        """(job, cpu, memory) of every window that ended at or before ``now``."""
        result: list[tuple[str, Observation | None, Observation | None]] = []
        for end, job, w in self._open.close(now):
            cpu = None
            if w.cpu:
                usage = numpy_mean([numpy_mean(v) for v in w.cpu_mean.values()])
                cpu = Observation(end, tuple(w.cpu), max(w.cpu_peak.values()), usage)
            mem = None
            if w.mem_peak:
                peaks = tuple(w.mem_peak.values())
                usage = numpy_mean([numpy_mean(v) for v in w.mem_mean.values()])
                mem = Observation(end, peaks, max(peaks), usage)
            result.append((job, cpu, mem))
        return result
