"""Per-VM regime-change detection: the CUSUM by hand, never on a constant VM, and live."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpa_support import cpu_sample
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.core.engine import Engine, EngineConfig, PoolSetup
from lavad.core.migrations.config import MigrationsConfig
from lavad.core.migrations.relief import ReliefConfig
from lavad.core.placement.gpa import UsageHooks
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.config_file import ConfigError
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.settings import load_settings
from lavad.models.usage.drift import CusumDrift, DriftConfig
from lavad.models.usage.margin import TailCalibration
from lavad.models.usage.moments import CPU, UsageMoments
from lavad.streams.schema import Decision, HostUp, Migration, VmPlaced


def _moments() -> UsageMoments:
    moments = UsageMoments()
    moments.enable_drift(DriftConfig(detector="cusum"))
    return moments


def test_a_step_is_forgotten_at_the_twelfth_window_of_the_new_regime() -> None:
    """60 windows alternating 0.01 / 0.03 (mean 0.02, sigma 0.0101), then 0.30 for good.

    z = 0.28 / 0.0101 = 27.8, clipped to 3 + 5/12: each window adds 5/12 to
    the upper sum, which reaches the threshold 5 at the 12th window, not the
    11th (4.58). The reference stays the moments before the step, so the new
    readings pulling the mean up do not hide it. The moments then restart
    from the last 12 readings, all 0.30: mean 0.30, no spread.
    """
    moments = _moments()
    for k in range(60):
        moments.observe_sample(cpu_sample("a", 300.0 * (k + 1), 0.01 if k % 2 else 0.03))
    for k in range(11):
        moments.observe_sample(cpu_sample("a", 300.0 * (61 + k), 0.30))
        assert moments.take_drifted() == []
    assert moments.drift is not None
    assert moments.drift.up[0] == pytest.approx(11 * 5 / 12)
    moments.observe_sample(cpu_sample("a", 300.0 * 72, 0.30))
    assert moments.take_drifted() == ["a"]
    estimate = moments.estimate("a", CPU)
    assert estimate is not None
    assert estimate.samples == 12
    assert estimate.mean == pytest.approx(0.30)
    assert estimate.variance == pytest.approx(0.0, abs=1e-12)
    # Warm-up again: the next 35 readings (12 + 35 < 48) are never tested.
    for k in range(35):
        moments.observe_sample(cpu_sample("a", 300.0 * (73 + k), 0.01))
    assert moments.take_drifted() == []


def test_a_burst_shorter_than_the_persistence_never_resets() -> None:
    """11 extreme windows add 11 x 5/12 = 4.58 < 5; a window back at the mean takes the
    allowance, 3, off, so two such windows forget the burst (4.58 - 6 < 0) and bursts of
    11 separated by two normal windows never add up. One normal window would not do:
    the next burst would start from 1.58 and reach 5 at its 9th window."""
    moments = _moments()
    for k in range(60):
        moments.observe_sample(cpu_sample("a", 300.0 * (k + 1), 0.01 if k % 2 else 0.03))
    time = 300.0 * 61
    for _ in range(5):
        for _ in range(11):
            moments.observe_sample(cpu_sample("a", time, 0.9))
            time += 300.0
        for _ in range(2):
            moments.observe_sample(cpu_sample("a", time, 0.02))
            time += 300.0
    assert moments.take_drifted() == []
    assert moments.resets == 0


def test_the_vectorised_update_decides_as_the_scalar_one() -> None:
    """The evaluation's column update and the daemon's per-sample update, on noisy steps."""
    config = DriftConfig(detector="cusum", warmup=10, reseed=5)
    rng = np.random.default_rng(3)
    series = np.concatenate([rng.normal(0.2, 0.02, 200), rng.normal(0.5, 0.05, 100)])
    one, many = CusumDrift(config, 1), CusumDrift(config, 1)
    slot = np.zeros(1, dtype=np.int64)
    alarms: list[bool] = []
    for k, value in enumerate(series[1:], start=1):
        past = series[max(0, k - 50) : k]
        mean, sigma = float(past.mean()), float(past.std(ddof=1)) if len(past) > 1 else 0.0
        scalar = one.update_one(0, float(value), mean, sigma, k)
        vector = many.update(
            slot, np.array([value]), np.array([mean]), np.array([sigma]), np.array([k])
        )
        assert scalar == bool(vector[0])
        alarms.append(scalar)
    assert any(alarms[199:]) and not any(alarms[:150])


@settings(max_examples=60, deadline=None)
@given(
    value=st.floats(min_value=0.0, max_value=1.5, allow_nan=False),
    windows=st.integers(min_value=1, max_value=400),
    gap=st.floats(min_value=1.0, max_value=3600.0),
)
def test_a_vm_whose_usage_never_changes_is_never_reset(
    value: float, windows: int, gap: float
) -> None:
    moments = _moments()
    for k in range(windows):
        moments.observe_sample(cpu_sample("a", gap * (k + 1), value))
    assert moments.take_drifted() == []
    assert moments.resets == 0
    estimate = moments.estimate("a", CPU)
    assert estimate is not None and estimate.samples == windows


def test_bad_drift_settings_are_refused_with_their_key(tmp_path: Path) -> None:
    config = tmp_path / "lavad.toml"
    for body, key in (
        ('detector = "adwin"', "detector"),
        ("persistence = 0", "persistence"),
        ("warmup = 10\nreseed = 12", "reseed"),
        ("threshold = -1", "threshold"),
    ):
        config.write_text(f"[migrations.relief.drift]\n{body}\n")
        with pytest.raises(ConfigError, match=key):
            load_settings(config)
    config.write_text('[migrations.relief.drift]\ndetector = "cusum"\npersistence = 6\n')
    drift = load_settings(config).migrations.relief.drift
    assert drift.enabled and drift.persistence == 6


# ---------------------------------------------------------------- the engine


def _drift_engine(detector: str, *, margin: bool = False, spare_host: bool = True) -> Engine:
    args = {"rho": 0.05, "min_samples": 4, "margin": margin, "tie_break": "first"}
    if margin:
        args["margin_min_windows"] = 5
    relief = ReliefConfig(enabled=True, drift=DriftConfig(detector=detector))  # type: ignore[arg-type]
    engine = Engine(
        EngineConfig(
            policy="gpa",
            policy_args=validate_policy_args("gpa", args),
            pools=PoolSetup(),
            migrations=MigrationsConfig(relief=relief),
        )
    )
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=5.0, memory_gib=128.0), 0.0)
    if spare_host:
        engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=16.0, memory_gib=128.0), 0.0)
    for vm_id in ("a", "b"):
        placed = VmPlaced(time=0.0, pool="p", vm_id=vm_id, host_id="h0", cores=4.0, memory_gib=8.0)
        engine.handle(placed, 0.0)
    return engine


def _feed(engine: Engine, windows: range) -> list[Decision]:
    decisions: list[Decision] = []
    for k in windows:
        time = 300.0 * (k + 1)
        a = 0.2 + 0.01 * (k % 3) if k < 60 else (0.6 if k % 2 else 1.0)
        b = 0.2 + 0.01 * ((k + 1) % 3) if k < 60 else 0.24
        decisions += engine.handle(cpu_sample("a", time, a), time).decisions
        decisions += engine.handle(cpu_sample("b", time, b), time).decisions
    return decisions


def _drift_run(detector: str) -> list[Decision]:
    """h0 (5 cores) holds a and b (4 cores each, placed by another scheduler); h1 is empty.

    Both use about 0.2 for 60 windows; then a alternates 0.6 / 1.0 and b
    stays at 0.24: h0 carries 3.36-4.96 cores, never above its 5, so the
    binomial rule never sees an overflow. With drift on, both VMs' moments
    restart at the 12th window of their new regime (b's step, 0.035 over a
    sigma of 0.0082, is one too) and h0 reads mean 3.2 + 0.96 = 4.16 cores,
    sigma 0.2 x 4 x sqrt(12/11) = 0.84: 4.16 + 1.645 x 0.84 = 5.54 > 5, the
    fit test fails, and a (the larger excess) leaves for h1 before any
    overflow. Plain GPA (no learned margin): with the margin on, a pool whose
    only scored host is h0 learns the same change from h0's realised excess,
    widens its margin to the cap (20) and then no host accepts a.
    """
    return _feed(_drift_engine(detector), range(90))


def test_a_host_whose_vm_changed_regime_is_relieved_before_any_overflow() -> None:
    on = _drift_run("cusum")
    plans = [d for d in on if isinstance(d, Migration) and d.action == "plan"]
    assert plans and plans[0].drain == "relief" and plans[0].host_id == "h0"
    # After the 12th window of a's new regime (k = 71, t = 21,600 s), at the next look.
    assert 21_600.0 <= plans[0].time <= 21_600.0 + 300.0
    assert all(d.drain == "relief" for d in on if isinstance(d, Migration))
    assert [entry["vm_id"] for entry in plans[0].plan] == ["a"]
    assert on == _drift_run("cusum")
    off = _drift_run("off")
    assert not [d for d in off if isinstance(d, Migration)]


def _hooks(engine: Engine) -> UsageHooks:
    hooks = engine.pools["p"].policy.hooks
    assert isinstance(hooks, UsageHooks)
    return hooks


def _tail(engine: Engine) -> TailCalibration:
    tail = _hooks(engine).tail
    assert tail is not None
    return tail


def test_a_wide_margin_still_relieves_onto_an_empty_host() -> None:
    """The same run with the learned margin on: h0 is the pool's only scored host,
    and the windows of a's new regime before the detector sees it (k = 60 on),
    scored against h0's promise of 3.2 cores with an excess of tenths of a core,
    widen the margin to its cap (20) within two windows. Through it even a alone
    fails the fit test on the empty h1 (a's new mean 3.2 cores and sd 0.84: 3.2 +
    20 x 1.645 x 0.84 = 30.8 > 16). The relief still moves a, at the same look,
    to h1: an empty host that holds a's 4 requested cores."""
    engine = _drift_engine("cusum", margin=True)
    on = _feed(engine, range(90))
    assert _tail(engine).margin == 20.0
    plans = [d for d in on if isinstance(d, Migration) and d.action == "plan"]
    assert plans and plans[0].host_id == "h0" and [e["vm_id"] for e in plans[0].plan] == ["a"]
    assert 21_600.0 <= plans[0].time <= 21_600.0 + 300.0
    moves = [d for d in on if isinstance(d, Migration) and d.action == "migrate"]
    assert [(m.vm_id, m.target_host_id) for m in moves] == [("a", "h1")]
    assert engine.pools["p"].migrations.counters.get("relief_without_target", 0) == 0


def test_a_vm_that_changed_regime_renews_its_hosts_promise() -> None:
    """With no other host a stays on h0. The 11 windows of its new regime scored
    before the detector restarts its moments (k = 60 to 70) are overflows of the
    old promise and hold the margin at its cap: at rho 0.05 the conformal quantile
    drops below them only once rho (W + 1) - 1 >= 11, i.e. W >= 239 windows. From
    the window after the restart h0 is scored against its new sums, so the margin
    comes back once enough windows follow; kept against the old promise every
    window would score the change again and the margin would stay at its cap."""
    engine = _drift_engine("cusum", margin=True, spare_host=False)
    _feed(engine, range(230))
    assert _tail(engine).margin == 20.0
    _feed(engine, range(230, 300))
    assert _tail(engine).margin < 1.5


def test_a_promise_renewal_pending_at_a_snapshot_survives_it() -> None:
    """Snapshot the one-host pool after a's reset (its sample at t = 21,600 s) and
    before the window closes: h0's renewal is still pending, and the restored
    pool renews it as the original does, its margin back at 1.0 by window 300."""
    engine = _drift_engine("cusum", margin=True, spare_host=False)
    _feed(engine, range(72))
    assert _hooks(engine).usage.moments.resets == 1
    twin = _drift_engine("cusum", margin=True, spare_host=False)
    twin.pools["p"] = loads(dumps(engine.pools["p"]))
    assert _feed(engine, range(72, 300)) == _feed(twin, range(72, 300))
    assert _tail(engine).margin == _tail(twin).margin < 1.5


def test_a_pool_mid_excursion_survives_a_snapshot_and_decides_the_same() -> None:
    """Snapshot the pool (state_codec, as the live daemon does) five windows into a's new
    regime, its CUSUM sums half-way; the restored pool resets a and relieves h0 exactly
    as the original."""
    engine = _drift_engine("cusum")
    _feed(engine, range(65))
    twin = _drift_engine("cusum")
    twin.pools["p"] = loads(dumps(engine.pools["p"]))
    original, restored = _feed(engine, range(65, 90)), _feed(twin, range(65, 90))
    assert original == restored
    assert any(isinstance(d, Migration) and d.drain == "relief" for d in original)
