"""An owner's frailty on a lifetime model, and any model recalibrated: by hand, what they read."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support import PROJECT_ROOT
from test_lifetime_no_oracle_leak import _replay
from typer.testing import CliRunner

from lavad.core.placement.lifetime import LIFETIME_MODELS, LifetimeSettings
from lavad.daemon.cli import app
from lavad.daemon.live import state_codec
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.calibrated import CalibratedLifeTables
from lavad.models.lifetime.calibration import SurvivalCalibrator
from lavad.models.lifetime.features import DECLARED_CATEGORICAL, LEVELS
from lavad.models.lifetime.frailty import FrailtyLifeTables, posterior_theta
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.mixture import MixtureLifeTables
from lavad.models.lifetime.protocol import RunningVMs

KEYS_T = (("t", "1c"), ("1c", 0, 1), ("1c",), ("all",), ())
KEYS_U = (("u", "1c"), ("1c", 0, 1), ("1c",), ("all",), ())
NO_VMS = np.zeros((0, LEVELS), dtype=np.int64)


def _small_bins() -> LifetimeBins:
    # edges 0, 100, 1000, 10000 s and the open bin
    return LifetimeBins.log_spaced(first_s=100.0, horizon_s=10_000.0, count=3)


def _fitted(per_owner: bool, half_life_s: float | None = None) -> FrailtyLifeTables:
    """Base tables fitted at 2000 from owner t's VMs: S(100) = 3/4, S(1000) = 1/2."""
    model = FrailtyLifeTables(
        GroupedLifeTables(_small_bins(), min_observations=1),
        half_life_s=half_life_s,
        per_owner=per_owner,
    )
    rows = model.rows_for(KEYS_T)
    model.rows_for(KEYS_U)
    # Four VMs: one dies at 50, one at 500, two are evicted at 2000. Bin
    # [0, 100): 1 death of 4 at risk; [100, 1000): 1 of 3.
    model.observe_exit(rows, 50.0, now=50.0)
    model.observe_exit(rows, 500.0, now=1500.0)
    model.observe_censored(rows, 2000.0, now=2000.0)
    model.observe_censored(rows, 2000.0, now=2000.0)
    # The first refit counts nothing (no tables before it) and fits the base.
    model.refit(RunningVMs(NO_VMS, np.zeros(0)), now=2000.0)
    base = model.base.m0[model.base.choose(rows)]
    assert base[1] == pytest.approx(3 / 4) and base[2] == pytest.approx(1 / 2)
    assert model.theta[rows[0]].tolist() == [1.0]
    return model


def _first_interval(model: FrailtyLifeTables) -> tuple[int, ...]:
    rows = model.rows_for(KEYS_T)
    # Until 3000: VM A, created at 2000, dies at 2050; VM B, created at
    # 2100, runs (uptime 900 at 3000).
    model.observe_exit(rows, 50.0, now=2050.0)
    model.refit(RunningVMs(np.array([rows]), np.array([900.0])), now=3000.0)
    return rows


# Expected hazard, with mass uniform within a bin under the base tables of 2000:
# VM A exposed over (0, 50]: S(50) = 1 - (1/4)(50/100) = 7/8, H = ln(8/7).
# VM B over (0, 900]: S(900) = 3/4 - (1/4)(800/900) = 19/36, H = ln(36/19).
E_HAND = math.log(8 / 7) + math.log(36 / 19)  # = ln(288/133), about 0.7726


def test_an_owners_frailty_by_hand_vm_by_vm() -> None:
    model = _fitted(per_owner=False)
    rows = _first_interval(model)
    owner = rows[0]
    # O = 1 death (VM A), E as above; a = 1: theta = (1 + 1) / (1 + 0.7726) = 1.128.
    assert model.observed[owner].tolist() == [pytest.approx(1.0)]
    assert model.expected[owner].tolist() == [pytest.approx(E_HAND)]
    theta = 2.0 / (1.0 + E_HAND)
    assert model.theta[owner].tolist() == [pytest.approx(theta)]
    assert theta == pytest.approx(1.1283, abs=1e-4)
    # Its VMs are predicted with the base's survival through each bin raised
    # to theta: S'(100) = (3/4)^theta, S'(1000) = (3/4 * 2/3)^theta.
    combo = model.choose(rows)
    base = model.base.m0[model.base.choose(rows)]
    assert model.m0[combo, 1] == pytest.approx(base[1] ** theta)
    assert model.m0[combo, 2] == pytest.approx(base[2] ** theta)
    assert model.m0[combo, 0] == pytest.approx(1.0)


def test_an_owners_vms_in_one_interval_count_as_one_outcome() -> None:
    model = _fitted(per_owner=True)
    rows = _first_interval(model)
    # Two VMs of owner t in the interval, each weighing 1/2: O = 1/2,
    # E = 0.7726 / 2; theta = (1 + 0.5) / (1 + 0.3863) = 1.082.
    assert model.theta[rows[0]].tolist() == [pytest.approx(1.5 / (1.0 + E_HAND / 2))]


def test_without_evidence_theta_is_one_and_the_base_predicts() -> None:
    assert posterior_theta(np.zeros(3), np.zeros(3), 1.0).tolist() == [1.0, 1.0, 1.0]
    model = _fitted(per_owner=False)
    _first_interval(model)
    # Owner u had no VM: no multiplier of its own; its row is the base's.
    other = model.rows_for(KEYS_U)
    assert not model.has_evidence[other[0]]
    combo = model.choose(other)
    np.testing.assert_allclose(
        model.mass[combo], model.base.mass[model.base.choose(other)], rtol=0, atol=1e-15
    )


def test_evidence_decays_with_the_half_life() -> None:
    model = _fitted(per_owner=False, half_life_s=1000.0)
    rows = _first_interval(model)
    # A refit 1000 s later with no VM: O and E halve (nothing new counted).
    model.refit(RunningVMs(NO_VMS, np.zeros(0)), now=4000.0)
    assert model.observed[rows[0]].tolist() == [pytest.approx(0.5)]
    assert model.theta[rows[0]].tolist() == [pytest.approx(1.5 / (1.0 + E_HAND / 2))]


def test_a_banded_frailty_counts_each_band_apart() -> None:
    model = FrailtyLifeTables(
        GroupedLifeTables(_small_bins(), min_observations=1),
        half_life_s=None,
        band_edges_s=(100.0,),
        per_owner=False,
    )
    rows = model.rows_for(KEYS_T)
    model.observe_exit(rows, 50.0, now=50.0)
    model.observe_exit(rows, 500.0, now=1500.0)
    model.observe_censored(rows, 2000.0, now=2000.0)
    model.observe_censored(rows, 2000.0, now=2000.0)
    model.refit(RunningVMs(NO_VMS, np.zeros(0)), now=2000.0)
    _first_interval(model)
    owner = rows[0]
    # Band 0 is bin [0, 100): VM A's death and exposure ln(8/7), and VM B's
    # (0, 100], ln(4/3); band 1 VM B's (100, 900]: ln((3/4) / (19/36)) = ln(27/19).
    assert model.observed[owner].tolist() == [pytest.approx(1.0), 0.0]
    assert model.expected[owner].tolist() == [
        pytest.approx(math.log(8 / 7) + math.log(4 / 3)),
        pytest.approx(math.log(27 / 19)),
    ]
    theta = model.theta[owner]
    combo = model.choose(rows)
    # With the base as refitted at 3000: S'(100) = S(100)^theta_0 and
    # S'(1000) = S'(100) (S(1000) / S(100))^theta_1.
    base = model.base.m0[model.base.choose(rows)]
    assert model.m0[combo, 1] == pytest.approx(base[1] ** theta[0])
    assert model.m0[combo, 2] == pytest.approx(
        base[1] ** theta[0] * (base[2] / base[1]) ** theta[1]
    )


def _stream(model: FrailtyLifeTables | CalibratedLifeTables | GroupedLifeTables) -> None:
    """A few hours of VMs of two owners, refitted hourly."""
    rng = np.random.default_rng(3)
    running: list[tuple[tuple[int, ...], float, float]] = []
    now = 0.0
    for hour in range(30):
        now = hour * 3600.0
        still = []
        for rows, start, life in running:
            if start + life <= now:
                model.observe_exit(rows, life, now=start + life)
            else:
                still.append((rows, start, life))
        running = still
        running_rows = np.array([r for r, _, _ in running], dtype=np.int64).reshape(-1, LEVELS)
        uptimes = np.array([now - s for _, s, _ in running])
        chosen = np.array([model.choose(r) for r, _, _ in running], dtype=np.int64)
        model.refit(RunningVMs(running_rows, uptimes, chosen), now=now)
        for k in range(6):
            keys = KEYS_T if k % 2 else KEYS_U
            rows = model.rows_for(keys)
            model.choose(rows)
            scale = 600.0 if (k % 2 and hour > 15) else 20_000.0
            running.append((rows, now + 10.0 * k, float(rng.exponential(scale)) + 1.0))


def test_determinism_and_its_inputs_are_not_changed() -> None:
    models = [
        FrailtyLifeTables(MixtureLifeTables(_small_bins(), min_observations=2)) for _ in range(2)
    ]
    for model in models:
        _stream(model)
    np.testing.assert_array_equal(models[0].mass, models[1].mass)
    np.testing.assert_array_equal(models[0].theta, models[1].theta)
    model = models[0]
    rows = np.array([model.rows_for(KEYS_T)] * 2, dtype=np.int64)
    uptimes = np.array([10.0, 5000.0])
    before = rows.copy(), uptimes.copy()
    model.refit(RunningVMs(rows, uptimes, np.array([0, 0])), now=40 * 3600.0)
    np.testing.assert_array_equal(rows, before[0])
    np.testing.assert_array_equal(uptimes, before[1])
    # Owner t's VMs died sooner from hour 15: its theta is above 1.
    assert model.theta[model.rows_for(KEYS_T)[0]][0] > 1.0


def test_the_snapshot_codec_round_trips_the_frailty() -> None:
    model = FrailtyLifeTables(MixtureLifeTables(_small_bins(), min_observations=2))
    _stream(model)
    rows = model.rows_for(KEYS_T)
    model.observe_exit(rows, 90.0, now=31 * 3600.0)  # pending until the next refit
    copy = state_codec.loads(state_codec.dumps(model))
    assert isinstance(copy, FrailtyLifeTables)
    for m in (model, copy):
        m.observe_exit(rows, 300.0, now=31.5 * 3600.0)
        m.refit(RunningVMs(np.array([rows]), np.array([3000.0])), now=32 * 3600.0)
    np.testing.assert_array_equal(copy.theta, model.theta)
    np.testing.assert_array_equal(copy.mass[copy.choose(rows)], model.mass[model.choose(rows)])


def test_the_snapshot_codec_round_trips_the_recalibrated_stack() -> None:
    """``mixture-frailty-calibrated``: the calibrator, the frailty and the mixture, as data."""
    model = CalibratedLifeTables(
        FrailtyLifeTables(MixtureLifeTables(_small_bins(), min_observations=2)),
        SurvivalCalibrator(_small_bins()),
    )
    _stream(model)
    rows = model.rows_for(KEYS_T)
    copy = state_codec.loads(state_codec.dumps(model))
    assert isinstance(copy, CalibratedLifeTables)
    for m in (model, copy):
        m.observe_exit(rows, 300.0, now=31.5 * 3600.0)
        m.refit(RunningVMs(np.array([rows]), np.array([3000.0])), now=32 * 3600.0)
    assert model.calibrator is not None and copy.calibrator is not None
    assert state_codec.dumps(copy.calibrator) == state_codec.dumps(model.calibrator)
    np.testing.assert_array_equal(copy.mass[copy.choose(rows)], model.mass[model.choose(rows)])


def test_bad_settings_fail() -> None:
    base = GroupedLifeTables(_small_bins())
    with pytest.raises(ValueError, match="prior_deaths"):
        FrailtyLifeTables(base, prior_deaths=0.0)
    with pytest.raises(ValueError, match="half_life_s"):
        FrailtyLifeTables(base, half_life_s=-1.0)
    with pytest.raises(ValueError, match="band_edges_s"):
        FrailtyLifeTables(base, band_edges_s=(10.0, 5.0))
    with pytest.raises(ValueError, match="recalibrated"):
        CalibratedLifeTables(
            GroupedLifeTables(_small_bins(), calibrator=SurvivalCalibrator(_small_bins())),
            SurvivalCalibrator(_small_bins()),
        )


def test_the_wrapper_recalibrates_as_the_tables_own_calibrator_does() -> None:
    """The life tables wrapped give what ``tables-calibrated`` gives on the same stream."""
    wrapped = CalibratedLifeTables(
        GroupedLifeTables(_small_bins(), min_observations=2), SurvivalCalibrator(_small_bins())
    )
    own = GroupedLifeTables(
        _small_bins(), min_observations=2, calibrator=SurvivalCalibrator(_small_bins())
    )
    _stream(wrapped)
    _stream(own)
    assert own.calibrator is not None and wrapped.calibrator is not None
    np.testing.assert_allclose(wrapped.calibrator.weight, own.calibrator.weight, atol=1e-12)
    assert wrapped.calibrator.weight.sum() > 0  # it learned something
    for keys in (KEYS_T, KEYS_U):
        rows = wrapped.rows_for(keys)
        np.testing.assert_allclose(
            wrapped.mass[wrapped.choose(rows)], own.mass[own.choose(rows)], atol=1e-12
        )


def test_the_daemon_can_choose_it_recalibrated_on_the_mixture_only() -> None:
    """The frailty alone, or on the mixture unrecalibrated, was best nowhere: evaluation only."""
    built = LIFETIME_MODELS.build(
        "mixture-frailty-calibrated", None, LifetimeBins.log_spaced(), LifetimeSettings()
    )
    assert isinstance(built, CalibratedLifeTables)
    assert isinstance(built.base, FrailtyLifeTables)
    assert "frailty" not in LIFETIME_MODELS and "mixture-frailty" not in LIFETIME_MODELS


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("las", {"model": "mixture-frailty-calibrated"}),
        (
            "lava",
            {"model": "mixture-frailty-calibrated", "categorical": list(DECLARED_CATEGORICAL)},
        ),
    ],
)
def test_no_oracle_field_reaches_the_frailty(name: str, args: dict[str, Any]) -> None:
    """As ``test_lifetime_no_oracle_leak``: a true, scrambled or absent lifetime changes nothing."""
    absent, tracker = _replay(name, args, "absent")
    model = tracker.model
    for oracle in ("true", "scrambled"):
        hosts, other = _replay(name, args, oracle)
        assert hosts == absent
        np.testing.assert_array_equal(other.model.mass, model.mass)
        np.testing.assert_array_equal(other.slots.predicted_exit, tracker.slots.predicted_exit)
    # It learned: groups filled.
    assert model.observations.max() >= 30


@pytest.mark.parametrize(
    ("models", "labels"),
    [
        (
            "frailty,mixture-frailty-calibrated",
            (
                "life tables, each owner's hazard times its frailty",
                "the mixture with owners' frailty, recalibrated online",
            ),
        ),
        ("tables,mixture", ("life tables at four memories, mixed by their log score",)),
    ],
)
def test_the_command_line_reports_the_chosen_models(models: str, labels: tuple[str, ...]) -> None:
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "lifetime",
            str(PROJECT_ROOT / "data" / "azure-v1-vms-slice"),
            "--protocol",
            "online",
            "--no-river",
            "--models",
            models,
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    for label in labels:
        assert label in result.output
