"""Horizontal scaling (Autopilot 3.3) on hand-worked sequences."""

from __future__ import annotations

import pytest

from lavad.models.limits.horizontal import HorizontalConfig, HorizontalScaler

STEP = 300.0


def test_raw_recommendation_is_the_statistic_over_the_target() -> None:
    s = HorizontalScaler(HorizontalConfig(target_utilization=0.5, max_initializing=10.0))
    assert s.observe(STEP, 2.2) == 5  # ceil(2.2 / 0.5)
    assert s.raw == 5


def test_upscaling_is_immediate_but_limited_by_initializing_tasks() -> None:
    cfg = HorizontalConfig(target_utilization=1.0, max_initializing=0.5, small_change=0.0)
    s = HorizontalScaler(cfg, replicas=4)
    assert s.observe(STEP, 10.0) == 6  # at most 0.5 x 4 = 2 initialising
    assert s.observe(2 * STEP, 10.0) == 9  # the first 2 are ready: 0.5 x 6 = 3 more
    assert s.observe(3 * STEP, 10.0) == 10


def test_downscaling_is_deferred_then_slow() -> None:
    cfg = HorizontalConfig(
        target_utilization=1.0,
        horizon_s=STEP,  # the raw recommendation sees only the latest window
        downscale_delay_s=2 * STEP,
        small_change=0.0,
        max_initializing=100.0,
    )
    s = HorizontalScaler(cfg)
    assert s.observe(STEP, 16.0) == 16
    assert s.observe(2 * STEP, 1.0) == 16  # raw 1, but the 16 of the last T_d holds
    # T_d passed: n_s = 1; halve over an hour: 16 x 2**(-1/12) = 15.1 -> 15.
    assert s.observe(3 * STEP, 1.0) == 15
    assert s.observe(4 * STEP, 1.0) == 14  # floor(15 x 0.944) = 14


def test_small_changes_are_deferred() -> None:
    cfg = HorizontalConfig(target_utilization=1.0, small_change=0.1, max_initializing=10.0)
    s = HorizontalScaler(cfg, replicas=20)
    assert s.observe(STEP, 21.0) == 20  # +1 of 20 is 5 %
    assert s.observe(2 * STEP, 25.0) == 25


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="target_utilization"):
        HorizontalConfig(target_utilization=0.0)
    with pytest.raises(ValueError, match="total_usage"):
        HorizontalScaler().observe(STEP, -1.0)
