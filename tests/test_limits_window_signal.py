"""Moving windows that share one signal decide as windows that each learn their own.

ml's three CPU windows (p95, p98, max) share a ``WindowSignal``: the histogram, the
average and the peaks of a job's windows are the same for the three, so one learns
them for all. On the bundled Google slice's real jobs, every window's limit and raw
statistic at every step equal those of the same window learning alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lavad.evaluation.limits import load_jobs
from lavad.models.limits.histogram import BucketScheme, Observation
from lavad.models.limits.window import MovingWindowRecommender, WindowConfig, WindowSignal

SLICE = Path(__file__).resolve().parents[1] / "data" / "google-2011-gcd-limits-slice"
STATISTICS = ("p95", "p98", "max", "avg", "p60_half_max")
HALF_LIFE_S = 12 * 3600.0


def _observations() -> list[list[Observation]]:
    jobs = []
    for job in load_jobs(SLICE):
        windows = []
        series = (job.end.tolist(), job.cpu_mean.tolist(), job.cpu_peak.tolist())
        for t, mean, top in zip(*series, strict=True):
            values = (mean, top) if top > mean else (mean,)
            windows.append(Observation(t, values, top, mean))
        jobs.append(windows)
    return jobs


def test_windows_sharing_a_signal_decide_as_windows_alone() -> None:
    jobs = _observations()
    assert len(jobs) >= 2 and all(len(windows) > 100 for windows in jobs)
    configs = [WindowConfig(stat, HALF_LIFE_S) for stat in STATISTICS]
    for windows in jobs:
        signal = WindowSignal(BucketScheme.default(), HALF_LIFE_S, configs[0].peak_samples)
        shared = [MovingWindowRecommender(config, signal=signal) for config in configs]
        alone = [MovingWindowRecommender(config) for config in configs]
        for obs in windows:
            for one, other in zip(shared, alone, strict=True):
                one.observe(obs)
                other.observe(obs)
                assert (one.limit, one.explain()) == (other.limit, other.explain())
        assert signal.windows == len(windows)


def test_a_window_that_sees_other_windows_than_its_sharers_is_refused() -> None:
    signal = WindowSignal(BucketScheme.default(), HALF_LIFE_S, 288)
    first, second = (
        MovingWindowRecommender(WindowConfig(stat, HALF_LIFE_S), signal=signal)
        for stat in ("p95", "max")
    )
    first.observe(Observation(300.0, (0.5,), 0.5, 0.5))
    with pytest.raises(ValueError, match="must see the same windows"):
        second.observe(Observation(600.0, (0.5,), 0.5, 0.5))


def test_a_signal_of_another_half_life_or_scheme_is_refused() -> None:
    signal = WindowSignal(BucketScheme.default(), HALF_LIFE_S, 288)
    with pytest.raises(ValueError, match="half_life_s"):
        MovingWindowRecommender(WindowConfig("p95", 2 * HALF_LIFE_S), signal=signal)
    with pytest.raises(ValueError, match="scheme"):
        MovingWindowRecommender(
            WindowConfig("p95", HALF_LIFE_S), BucketScheme.linear(2.0, 0.25), signal=signal
        )
