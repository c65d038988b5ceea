"""Online recalibration of P(T > e) (models/lifetime/calibration.py), worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lavad.core.placement.lifetime import LIFETIME_MODELS, LifetimeSettings
from lavad.daemon.live.state_codec import dumps, loads
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.calibrated import CalibratedLifeTables
from lavad.models.lifetime.calibration import RAW_SHARE, SurvivalCalibrator
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.protocol import RunningVMs
from lavad.models.lifetime.shrunk import ShrunkLifeTables
from lavad.models.lifetime.survival import suffix_sums

INF = math.inf


def _bins() -> LifetimeBins:
    # Edges 0, 300, 3000: bins [0, 300), [300, 3000) and the open one.
    return LifetimeBins.log_spaced(first_s=300.0, horizon_s=3000.0, count=2)


def _calibrator(half_life_s: float | None = None) -> SurvivalCalibrator:
    return SurvivalCalibrator(
        _bins(), half_life_s=half_life_s, prior_strength=2.0, probability_bins=2
    )


def _learned() -> SurvivalCalibrator:
    calibrator = _calibrator()
    # Four VMs predicted P(T > 300) = 0.8 (band 1 of 2) and P(T > 3000) = 0.4 (band 0).
    # 1 died at 100 s: dead at both edges. 2 died at 1,000 s: survived 300, dead at
    # 3000. 3 runs at 500 s: survived 300, 3000 unresolved. 4 runs at 5,000 s: both.
    calibrator.learn(
        np.tile([0.8, 0.4], (4, 1)),
        np.array([-INF, -INF, -INF, -INF]),
        np.array([100.0, 1000.0, 500.0, 5000.0]),
        np.array([100.0, 1000.0, INF, INF]),
    )
    return calibrator


def test_counts_by_hand() -> None:
    calibrator = _learned()
    # Edge 300, band 1: 4 VMs, 3 survived, 4 x 0.8 predicted.
    # Edge 3000, band 0: VMs 1, 2 and 4, 1 survived, 3 x 0.4 predicted.
    assert calibrator.weight.tolist() == [[0.0, 4.0], [3.0, 0.0]]
    assert calibrator.survived.tolist() == [[0.0, 3.0], [1.0, 0.0]]
    assert calibrator.predicted == pytest.approx(np.array([[0.0, 3.2], [1.2, 0.0]]))


def test_the_shift_by_hand() -> None:
    calibrator = _learned()
    # Edge 300: 0.8 + (3 - 3.2) / (4 + 2) = 0.76667; edge 3000: 0.4 + (1 - 1.2) / (3 + 2) = 0.36.
    assert calibrator.calibrate(np.array([0.8, 0.4]))[0] == pytest.approx([0.8 - 0.2 / 6, 0.36])
    # A band without data keeps the model's value, and the curve is made
    # non-increasing: 0.3 at 300 s (band 0, no data), 0.9 at 3000 s -> 0.3.
    assert calibrator.calibrate(np.array([0.3, 0.9]))[0] == pytest.approx([0.3, 0.3])
    # Masses: the calibrated curve mixed with the raw one at RAW_SHARE.
    curve = (1 - RAW_SHARE) * np.array([0.8 - 0.2 / 6, 0.36]) + RAW_SHARE * np.array([0.8, 0.4])
    mass = calibrator.calibrated_mass(np.array([0.8, 0.4]))[0]
    assert mass == pytest.approx([1 - curve[0], curve[0] - curve[1], curve[1]])


def test_counts_halve_each_half_life() -> None:
    calibrator = _calibrator(half_life_s=100.0)
    calibrator.age(0.0)
    calibrator.learn(np.array([[0.8, 0.4]]), np.array([-INF]), np.array([50.0]), np.array([50.0]))
    version = calibrator.map_version
    calibrator.age(200.0)  # two half-lives: a quarter
    assert calibrator.weight[0, 1] == pytest.approx(0.25)
    assert calibrator.predicted[0, 1] == pytest.approx(0.2)
    assert calibrator.map_version > version  # the map moved: rows recalibrate


def test_a_model_learns_from_its_predictions_at_creation() -> None:
    calibrator = _calibrator()
    model = GroupedLifeTables(_bins(), min_observations=1, calibrator=calibrator)
    keys = ("tenant", "shape-hour", "shape", "hour", ())
    model.refit(RunningVMs(np.zeros((0, 5), dtype=np.int64), np.zeros(0)), now=0.0)
    rows = model.rows_for(keys)
    # a and b created at 0: no observation yet, the pool's uniform table,
    # P(T > 300) = 2/3 (band 1), P(T > 3000) = 1/3 (band 0).
    assert model.choose(rows) == rows[-1]
    assert model.m0[rows[-1], 1:3] == pytest.approx([2 / 3, 1 / 3])
    model.observe_exit(rows, 100.0, now=100.0)  # a dies at 100 s
    model.refit(RunningVMs(np.array([rows]), np.array([200.0])), now=200.0)  # b runs at 200 s
    # a resolves both edges as a death, as it was predicted at creation; b
    # passed no edge yet.
    assert calibrator.weight.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert calibrator.predicted == pytest.approx(np.array([[0.0, 2 / 3], [1 / 3, 0.0]]))
    assert calibrator.survived.sum() == 0.0
    # The refit's raw table (a's death, b censored at 200 s, both in bin 0):
    # hazard 1 / (2 - 1/2) = 2/3, S(300) = 1/3; past the data the Pareto
    # hazard 1 - 300/3000 = 0.9, S(3000) = 1/30. Calibrated: edge 300 is in
    # band 0 (no data) and stays 1/3; edge 3000, band 0, shifts by
    # (0 - 1/3) / (1 + 2) = -1/9 and is clipped to 0. Mixed with the raw
    # curve at RAW_SHARE: (1/3, 0.02 / 30).
    chosen = model.choose(rows)
    assert chosen == rows[0]
    assert model.raw_survival[chosen] == pytest.approx([1 / 3, 1 / 30])
    low = RAW_SHARE / 30
    assert model.mass[chosen] == pytest.approx([2 / 3, 1 / 3 - low, low])


def test_no_resolution_without_a_recorded_prediction() -> None:
    calibrator = _calibrator()
    model = GroupedLifeTables(_bins(), min_observations=1, calibrator=calibrator)
    rows = model.rows_for(("t", "sh", "s", "h", ()))
    # Never chosen, so never predicted: its death teaches the calibrator nothing.
    model.observe_exit(rows, 100.0, now=100.0)
    model.refit(RunningVMs(np.zeros((0, 5), dtype=np.int64), np.zeros(0)), now=200.0)
    assert calibrator.weight.sum() == 0.0


def _trained(model: GroupedLifeTables) -> None:
    """A few hours of VMs of two key tuples, lifetimes cycling through minutes to a day."""
    lifetimes = [120.0, 900.0, 4000.0, 30_000.0, 90_000.0]
    running: dict[int, tuple[tuple[int, ...], float, float]] = {}
    for step in range(60):
        now = step * 600.0
        if step % 6 == 0:
            alive = list(running.values())
            model.refit(
                RunningVMs(
                    np.array([r for r, _, _ in alive], dtype=np.int64).reshape(-1, 5),
                    np.array([now - s for _, s, _ in alive]),
                ),
                now=now,
            )
        for vm, (rows, start, lifetime) in list(running.items()):
            if start + lifetime <= now:
                model.observe_exit(rows, now - start, now=now)
                del running[vm]
        rows = model.rows_for((f"t{step % 2}", "sh", "s", "h", ()))
        model.choose(rows)
        running[step] = (rows, now, lifetimes[step % len(lifetimes)])


@pytest.mark.parametrize("kind", ["tables", "shrunk"])
def test_snapshot_round_trip_keeps_learning_alike(kind: str) -> None:
    def build() -> GroupedLifeTables:
        if kind == "tables":
            return GroupedLifeTables(_bins(), 3, calibrator=SurvivalCalibrator(_bins()))
        return ShrunkLifeTables(_bins(), 3, calibrator=SurvivalCalibrator(_bins()))

    model = build()
    _trained(model)
    assert model.calibrator is not None and model.calibrator.weight.sum() > 0
    copy = loads(dumps(model))
    assert isinstance(copy, type(model)) and copy.calibrator is not None
    for twin in (model, copy):
        assert twin.calibrator is not None
        rows = twin.rows_for(("t0", "sh", "s", "h", ()))
        twin.observe_exit(rows, 500.0, now=40_000.0)
        twin.refit(RunningVMs(np.array([rows]), np.array([100.0])), now=40_000.0)
    assert dumps(copy.calibrator) == dumps(model.calibrator)
    assert np.array_equal(copy.mass, model.mass)


def test_bad_settings_fail() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        SurvivalCalibrator(_bins(), half_life_s=0.0)
    with pytest.raises(ValueError, match="probability_bins"):
        SurvivalCalibrator(_bins(), probability_bins=0)


def test_edges_past_the_window_learn_nothing() -> None:
    calibrator = SurvivalCalibrator(_bins(), probability_bins=2, window_s=1000.0)
    # A death at 100 s resolves 300 s only: at 3000 s, past the window, no
    # survivor would ever be found again to weigh against it.
    calibrator.learn(np.array([[0.8, 0.4]]), np.array([-INF]), np.array([100.0]), np.array([100.0]))
    assert calibrator.weight.tolist() == [[0.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("name", ["mixture-calibrated", "mixture-frailty-calibrated"])
def test_the_daemon_can_choose_a_calibrated_model(name: str) -> None:
    model = LIFETIME_MODELS.build(name, None, LifetimeBins.log_spaced(), LifetimeSettings())
    assert isinstance(model, CalibratedLifeTables) and model.calibrator is not None
    # The default model stays uncalibrated; the tables recalibrated are evaluation only.
    plain = LIFETIME_MODELS.build("tables", None, LifetimeBins.log_spaced(), LifetimeSettings())
    assert isinstance(plain, GroupedLifeTables) and plain.calibrator is None
    assert "tables-calibrated" not in LIFETIME_MODELS
    assert "shrunk-calibrated" not in LIFETIME_MODELS


def test_the_compiled_tables_are_the_numpy_ones() -> None:
    bins = LifetimeBins.log_spaced()
    calibrator = SurvivalCalibrator(bins)
    rng = np.random.default_rng(3)
    # Random non-increasing raw curves, and a map learned from them.
    curves = np.sort(rng.uniform(0.0, 1.0, (200, bins.count - 1)), axis=1)[:, ::-1]
    ages = rng.uniform(0.0, 10 * 86_400.0, 200)
    calibrator.learn(curves, np.full(200, -INF), ages, np.where(ages < 86_400.0, ages, INF))
    mass, m0, m1 = calibrator.tables(curves, bins.representative)
    expected = calibrator.calibrated_mass(curves)
    assert mass == pytest.approx(expected, abs=1e-12)
    e0, e1 = suffix_sums(expected, bins)
    assert m0 == pytest.approx(e0, abs=1e-12)
    assert m1 == pytest.approx(e1, rel=1e-12)
