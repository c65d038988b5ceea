"""Horizontal scaling (Autopilot 3.3) on hand-worked sequences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lavad.evaluation.limits_cli import app
from lavad.evaluation.limits_horizontal import evaluate_horizontal, replay_app
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


def test_recorded_counts_by_hand_on_a_small_deployment() -> None:
    """An app at 2 instances, 4 from t = 3000 s, 2 again from 6000 s; target 1.0, horizon
    15 min, downscaling deferred 10 min, halving in an hour, no small-change deferral.

    t = 3000: the window runs the 2 it had (2 short), then the scaler grows to 4 at once
    (room: 1.0 x 2 initialising). t = 6000-6600: the horizon's max is still 4; t = 6900 the
    deferral ends and slow decay takes 4 -> floor(4 x 2^(-1/12)) = 3, then 2 at 7200. Over:
    2 x 4 windows (6000-6900) + 1 (7200) = 9 instance-windows."""
    config = HorizontalConfig(
        target_utilization=1.0,
        horizon_s=900.0,
        downscale_delay_s=600.0,
        halving_s=3600.0,
        small_change=0.0,
        max_initializing=1.0,
        init_s=300.0,
    )
    recorded, recommended = replay_app([(0.0, 2), (3000.0, 4), (6000.0, 2)], 9000.0, config)
    grid = np.arange(0.0, 9300.0, 300.0)
    assert len(recorded) == len(grid)
    expected = np.where(grid < 3300, 2, np.where(grid < 7200, 4, np.where(grid < 7500, 3, 2)))
    np.testing.assert_array_equal(recommended, expected)
    assert int(np.maximum(recommended - recorded, 0).sum()) == 9
    assert int(np.maximum(recorded - recommended, 0).sum()) == 2


@pytest.mark.shared_data
def test_horizontal_evaluation_on_the_dlrm_apps(shared_data: Path) -> None:
    """Autopilot's defaults against the 156 DLRM apps' recorded instance counts."""
    score = evaluate_horizontal(shared_data / "alibaba-dlrm")
    assert score.apps == 156
    assert 0 <= score.shortfall < score.over_provisioning < 0.2
    # Stabilisation: far fewer changes than the recorded counts make.
    assert score.recommended_changes_per_app_day < score.recorded_changes_per_app_day / 5


def test_the_command_names_a_trace_without_deployments_once(tmp_path: Path) -> None:
    # The bundled OpenB slice's pods name no deployment.
    openb = Path(__file__).resolve().parents[1] / "data" / "alibaba-openb-slice"
    result = CliRunner().invoke(app, ["horizontal", str(openb)], env={"COLUMNS": "400"})
    assert result.exit_code != 0
    text = " ".join(result.output.split())
    assert f"{openb}: no VM request names a deployment" in text
    assert text.count(str(openb)) == 1
