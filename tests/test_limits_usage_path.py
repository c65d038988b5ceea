"""The usage path's shortcuts decide as the plain computations did, to the bit.

- ``OpenWindows`` keeps the ends in a heap so that a sample no longer looks at every
  job's open window: on the bundled Google slice's real usage samples, the windows
  the job aggregator and the replica windows close after every sample are those the
  old rule closed (every key at or before the time, sorted).
- A window's mean usage is ``np.mean``'s, sign of zero included.
- A moving window's signal learns a window of one or two values in scalars: its
  sums are those of the dense histogram's numpy arithmetic.
- Windows sharing a signal take its cumulative histogram once per window.
"""

from __future__ import annotations

import math
import random
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from lavad.evaluation.limits import load_jobs
from lavad.models.limits import window as window_module
from lavad.models.limits.histogram import (
    BucketScheme,
    DecayedCounts,
    JobAggregator,
    Observation,
    numpy_mean,
)
from lavad.models.limits.open_windows import OpenWindows
from lavad.models.limits.replicas import DeploymentWindows
from lavad.models.limits.window import MovingWindowRecommender, WindowConfig, WindowSignal
from lavad.streams.adapters import open_trace
from lavad.streams.schema import UsageSample

SLICE = Path(__file__).resolve().parents[1] / "data" / "google-2011-gcd-limits-slice"


def _samples() -> list[UsageSample]:
    samples = [e for e in open_trace(SLICE, seed=0).events() if isinstance(e, UsageSample)]
    assert len(samples) > 1000
    return samples


class _PassOverEveryWindow:
    """The old rule: at each close, every open key at or before ``now``, sorted."""

    def __init__(self) -> None:
        self.keys: set[tuple[float, str]] = set()

    def add(self, name: str, time: float) -> None:
        self.keys.add((math.ceil(time / 300.0) * 300.0, name))

    def close(self, now: float) -> list[tuple[float, str]]:
        done = sorted(key for key in self.keys if key[0] <= now)
        self.keys.difference_update(done)
        return done


def test_the_aggregators_close_what_a_pass_over_every_window_closed() -> None:
    jobs, deployments, reference = JobAggregator(), DeploymentWindows(), _PassOverEveryWindow()
    closes = 0
    for sample in _samples():
        # Each sample closes what ended before it, as the engine asks.
        now = math.nextafter(sample.time, -math.inf)
        expected = reference.close(now)
        assert [(obs.end, job) for job, obs, _ in jobs.close(now) if obs] == expected
        assert [(end, name) for end, name, _, _ in deployments.close(now)] == expected
        closes += len(expected)
        jobs.add(sample.vm_id, sample.vm_id, sample.time, (sample.cpu.mean, sample.cpu.peak))
        deployments.add(sample.vm_id, sample.vm_id, sample.time, sample.cpu.mean)
        reference.add(sample.vm_id, sample.time)
    assert closes > 1000
    rest = reference.close(math.inf)
    assert [(obs.end, job) for job, obs, _ in jobs.close(math.inf) if obs] == rest


def test_a_restored_heap_that_does_not_name_the_ends_held_is_refused() -> None:
    windows: OpenWindows[list[int]] = OpenWindows()
    for end in (900.0, 300.0, 600.0):
        windows.get(end, "job", list)
    windows.check_restored()
    assert len(windows) == 3
    windows._ends.pop()  # an end that would never close
    with pytest.raises(ValueError, match="does not match"):
        windows.check_restored()
    unordered: OpenWindows[list[int]] = OpenWindows()
    for end in (300.0, 600.0):
        unordered.get(end, "job", list)
    unordered._ends.reverse()
    with pytest.raises(ValueError, match="not a heap"):
        unordered.check_restored()
    unordered._ends[0] = math.nan
    with pytest.raises(ValueError, match="not finite"):
        unordered.check_restored()


def _same_float(a: float, b: float) -> bool:
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def test_the_short_mean_is_numpys_bit_for_bit() -> None:
    # The slice's own per-task values (mean and peak, as the engine files them).
    real = [[s.cpu.mean, s.cpu.peak] for s in _samples()]
    for values in real:
        assert _same_float(numpy_mean(values), float(np.mean(values)))
    # Drawn lists of every length around numpy's switch to its pairwise sum (8),
    # with magnitudes far apart (where the order of the additions shows) and zeros
    # of both signs.
    rng = random.Random(7)
    special = [0.0, -0.0, 5e-324, 1e-300, 1.0, 3.0, 1e16, 0.1]
    for length in range(1, 13):
        for _ in range(3000):
            if rng.random() < 0.5:
                values = [rng.random() * 10.0 ** rng.randint(-8, 8) for _ in range(length)]
            else:
                values = [rng.choice(special) for _ in range(length)]
            assert _same_float(numpy_mean(values), float(np.mean(values))), values


def test_windows_sharing_a_signal_take_one_cumulative_histogram_per_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[int] = []
    original = window_module.cumulative_weights

    def counted(weights: np.ndarray) -> tuple[float, np.ndarray]:
        taken.append(1)
        return original(weights)

    monkeypatch.setattr(window_module, "cumulative_weights", counted)
    [job, *_] = load_jobs(SLICE)
    signal = WindowSignal(BucketScheme.default(), 43_200.0, 288)
    statistics = ("p95", "p98", "p60_half_max")
    shared = [
        MovingWindowRecommender(WindowConfig(stat, 43_200.0), signal=signal) for stat in statistics
    ]
    alone = [MovingWindowRecommender(WindowConfig(stat, 43_200.0)) for stat in statistics]
    series = (job.end.tolist(), job.cpu_mean.tolist(), job.cpu_peak.tolist())
    for end, mean, peak in zip(*series, strict=True):
        obs = Observation(end, (mean, peak) if peak > mean else (mean,), peak, mean)
        before = len(taken)
        for window in shared:
            window.observe(obs)
        # Three percentiles of one histogram: its cumulative weights once.
        assert len(taken) == before + 1
        for together, own in zip(shared, alone, strict=True):
            own.observe(obs)
            assert together.limit == own.limit


def test_a_signal_learns_a_mean_and_a_peak_as_the_dense_histogram_did() -> None:
    scheme = BucketScheme.default()
    b = scheme.b
    for job in load_jobs(SLICE):
        signal = WindowSignal(scheme, 43_200.0, 288)
        counts, average = DecayedCounts(len(scheme), 43_200.0), DecayedCounts(2, 43_200.0)
        peaks: deque[float] = deque(maxlen=288)
        series = (job.end.tolist(), job.cpu_mean.tolist(), job.cpu_peak.tolist())
        for seen, (end, mean, peak) in enumerate(zip(*series, strict=True), start=1):
            values = (mean, peak) if peak > mean else (mean,)
            signal.learn(Observation(end, values, peak, mean), seen)
            # The dense computation, as the signal made it for every window.
            dense = scheme.counts(values)
            counts.add(dense, end)
            average.add(np.array([float((b * dense).sum() / dense.sum()), 1.0]), end)
            assert np.array_equal(signal.counts.acc, counts.acc)
            assert np.array_equal(signal.average_pair.acc, average.acc)
            peaks.append(float(b[int(np.flatnonzero(dense)[-1])]))
            assert signal.peaks.max() == max(peaks)


def test_absurd_ends_cost_only_the_windows_held() -> None:
    # Ends far apart (a time jump, a time far behind) hold one heap entry each: a
    # close at any time, infinity included, goes over what is held, never over the
    # intervals between.
    windows: OpenWindows[list[int]] = OpenWindows()
    for end in (-1e308, 300.0, 1e308, 300.0):
        windows.get(end, "job", list)
    assert len(windows) == 3
    assert [end for end, _, _ in windows.close(-1e300)] == [-1e308]
    assert windows.close(299.0) == []
    assert [end for end, _, _ in windows.close(math.inf)] == [300.0, 1e308]
    assert len(windows) == 0 and windows.close(math.inf) == []
