"""The sliding window's maximum against the whole window recomputed at every step.

The sequences are drawn, not recorded: what is checked is the window's bookkeeping
over any order of times (a time jump back, ties, long gaps), which no trace exercises.
The horizontal scaler over the DLRM apps is checked in test_limits_horizontal.py.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from lavad.models.limits.horizontal import HorizontalConfig, HorizontalScaler
from lavad.models.limits.window_max import WindowMax


def _times_and_values(seed: int, n: int) -> tuple[list[float], list[float]]:
    """Times that mostly advance by a window, sometimes jump far ahead or back; values
    from a few levels, so ties are common."""
    rng = np.random.default_rng(seed)
    steps = rng.choice([300.0, 300.0, 300.0, 0.0, 7200.0, -900.0], size=n)
    times = np.cumsum(steps).tolist()
    values = rng.integers(0, 6, size=n).astype(float).tolist()
    return times, values


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("span", [0.0, 900.0, 3600.0])
def test_the_maximum_is_the_whole_windows(seed: int, span: float) -> None:
    times, values = _times_and_values(seed, 2_000)
    window = WindowMax(keep_values=True)
    kept: list[tuple[float, float]] = []  # the window as a list, dropped from its front
    for time, value in zip(times, values, strict=True):
        window.add(time, value)
        window.drop_through(time - span)
        kept.append((time, value))
        while len(kept) > 1 and kept[0][0] <= time - span:
            kept.pop(0)
        assert window.max() == max(v for _, v in kept)
        assert window.values is not None and list(window.values) == [v for _, v in kept]
        assert list(window.times) == [t for t, _ in kept]


class _WholeWindowScaler(HorizontalScaler):
    """The scaler's statistic and deferral from its whole windows, recomputed each step."""

    def __init__(self, config: HorizontalConfig, replicas: int) -> None:
        super().__init__(config, replicas)
        self.usage_list: list[tuple[float, float]] = []
        self.raw_list: list[tuple[float, int]] = []

    def observe(self, time: float, total_usage: float) -> int:
        cfg = self.config
        self.usage_list.append((time, total_usage))
        while len(self.usage_list) > 1 and self.usage_list[0][0] <= time - cfg.horizon_s:
            self.usage_list.pop(0)
        values = np.array([u for _, u in self.usage_list])
        stat = float(values.max() if cfg.statistic == "max" else np.percentile(values, 95))
        raw = max(cfg.min_replicas, math.ceil(stat / cfg.target_utilization - 1e-9))
        self.raw_list.append((time, raw))
        while len(self.raw_list) > 1 and self.raw_list[0][0] <= time - cfg.downscale_delay_s:
            self.raw_list.pop(0)
        replicas = super().observe(time, total_usage)
        assert (self.usage_statistic, self.raw) == (stat, raw)
        assert self.stabilized == max(n for _, n in self.raw_list)
        return replicas


@pytest.mark.parametrize("statistic", ["max", "p95"])
def test_the_scaler_decides_as_from_its_whole_windows(statistic: str) -> None:
    config = HorizontalConfig(
        statistic=statistic,  # type: ignore[arg-type]
        horizon_s=6 * 3600.0,
        downscale_delay_s=2 * 3600.0,
    )
    times, levels = _times_and_values(7, 3_000)
    rng = np.random.default_rng(8)
    usage = (np.asarray(levels) * rng.uniform(0.5, 1.5, size=len(levels))).tolist()
    scaler = _WholeWindowScaler(config, replicas=3)
    counts = [scaler.observe(t, u) for t, u in zip(times, usage, strict=True)]
    assert len(set(counts)) > 3  # the count moved: the deferral and decay were exercised


def test_an_empty_window_has_no_maximum() -> None:
    with pytest.raises(IndexError):
        WindowMax().max()


def test_a_window_made_without_its_values_says_so() -> None:
    with pytest.raises(ValueError, match="keeps no values"):
        WindowMax().kept_values()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("count", [1, 5, 288])
def test_a_window_of_a_number_of_values_keeps_the_newest(seed: int, count: int) -> None:
    times, values = _times_and_values(seed, 1_000)
    window = WindowMax()
    kept: deque[float] = deque(maxlen=count)  # the moving window's own bound, as a deque
    for time, value in zip(times, values, strict=True):
        window.add(time, value)
        window.drop_beyond(count)
        kept.append(value)
        assert window.max() == max(kept) and len(window) == len(kept)


def test_a_window_of_no_values_is_refused() -> None:
    window = WindowMax()
    window.add(0.0, 1.0)
    with pytest.raises(ValueError, match="count must be >= 1"):
        window.drop_beyond(0)


def test_absurd_times_and_counts_cost_only_the_values_held() -> None:
    window = WindowMax(keep_values=True)
    for k in range(100):
        window.add(300.0 * k, float(k % 7))
    window.drop_beyond(10**18)  # keeps all 100: nothing to drop
    assert len(window) == 100 and window.max() == 6.0
    window.add(1e308, 2.0)
    window.drop_through(1e308 - 3600.0)  # a jump past every value: the newest stays
    assert len(window) == 1 and window.max() == 2.0
    window.add(-1e308, 9.0)  # a time far back stays behind the newer one
    window.drop_through(float("inf"))
    assert list(window.kept_values()) == [9.0] and window.max() == 9.0
