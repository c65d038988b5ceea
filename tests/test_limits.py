"""Autopilot's aggregation, moving-window and ML recommenders against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from lavad.models.limits import (
    BucketScheme,
    DecayedCounts,
    JobAggregator,
    LimitTracker,
    MlConfig,
    MlRecommender,
    MovingWindowRecommender,
    Observation,
    WindowConfig,
    default_statistic,
    weighted_percentile,
)

UNIT = BucketScheme.linear(10.0, 1.0)  # bounds 1, 2, ..., 10: value v sits at bound v


def obs(end: float, *values: float) -> Observation:
    return Observation(end, tuple(values), max(values), float(np.mean(values)))


# ------------------------------------------------------------- histograms


def test_buckets_are_closed_on_the_right() -> None:
    assert UNIT.find([0.0, 1.0, 1.01, 2.0, 10.0, 99.0]).tolist() == [0, 0, 1, 1, 9, 9]
    assert UNIT.counts([1, 1, 10]).tolist() == [2, 0, 0, 0, 0, 0, 0, 0, 0, 1]


def test_exponential_scheme_grows_by_ratio() -> None:
    scheme = BucketScheme.exponential(max_value=10.0, first=1.0, ratio=2.0)
    assert scheme.bounds == (1.0, 3.0, 7.0, 15.0)
    assert 250 < len(BucketScheme.default()) < 450  # "about 400 buckets"


def test_figure_2_load_adjusted_p90_is_10_not_1() -> None:
    # Load 1 for 9 time units, then 10 for one unit.
    counts = UNIT.counts([1.0] * 9 + [10.0])
    assert weighted_percentile(UNIT.b, counts, 0.9) == 1.0  # by time
    assert weighted_percentile(UNIT.b, UNIT.b * counts, 0.9) == 10.0  # by load: h[1]=9, h[10]=100
    rec = MovingWindowRecommender(WindowConfig("p90", margin=0.0), UNIT)
    for t in range(9):
        rec.observe(obs(300.0 * (t + 1), 1.0))
    rec.observe(obs(3000.0, 10.0))
    # Decay over 45 minutes with a 12 h half-life keeps 9 x 1 well below 10% of the load.
    assert rec.raw() == 10.0


def test_decayed_counts_halve_every_half_life() -> None:
    d = DecayedCounts(2, half_life_s=3600.0)
    d.add(np.array([1.0, 0.0]), 0.0)
    d.add(np.array([0.0, 1.0]), 3600.0)
    assert d.at(3600.0).tolist() == [0.5, 1.0]
    assert d.at(7200.0).tolist() == [0.25, 0.5]


def test_decayed_counts_survive_a_long_life() -> None:
    d = DecayedCounts(1, half_life_s=1.0)
    d.add(np.array([1.0]), 0.0)
    d.add(np.array([1.0]), 150.0)  # 2**150 would be past the rescale point
    assert d.at(150.0)[0] == pytest.approx(1.0)
    assert np.isfinite(d.acc).all()


def test_decayed_load_adjusted_percentile_by_hand() -> None:
    rec = MovingWindowRecommender(WindowConfig("p60", half_life_s=3600.0, margin=0.0), UNIT)
    rec.observe(obs(0.0, 10.0))
    rec.observe(obs(3600.0, *[1.0] * 9))
    # h[10] = 10 x 0.5 = 5, h[1] = 1 x 9 = 9: total 14.
    assert rec.percentile(0.5) == 1.0  # 7 <= 9
    assert rec.percentile(0.7) == 10.0  # 9.8 > 9


def test_weighted_average_by_hand() -> None:
    rec = MovingWindowRecommender(WindowConfig("avg", half_life_s=3600.0, margin=0.0), UNIT)
    rec.observe(obs(0.0, 1.0))
    rec.observe(obs(3600.0, 3.0, 3.0))
    assert rec.average() == pytest.approx((0.5 * 1 + 1.0 * 3) / 1.5)


def test_peak_counts_only_the_last_n_windows() -> None:
    rec = MovingWindowRecommender(WindowConfig("max", margin=0.0, hold_s=0.0, peak_samples=2), UNIT)
    for t, v in enumerate([5.0, 2.0, 3.0], start=1):
        rec.observe(obs(300.0 * t, v))
    assert rec.peak() == 3.0


def test_p60_half_max_takes_the_larger() -> None:
    rec = MovingWindowRecommender(WindowConfig("p60_half_max", margin=0.0), UNIT)
    rec.observe(obs(300.0, *[1.0] * 50, 10.0))
    # h[1] = 50, h[10] = 10: p60 of load is 1; half the peak is 5.
    assert rec.percentile(0.6) == 1.0
    assert rec.raw() == 5.0


def test_margin_then_max_over_the_last_hour() -> None:
    rec = MovingWindowRecommender(WindowConfig("max", margin=0.1, peak_samples=1), UNIT)
    rec.observe(obs(300.0, 2.0))
    assert rec.limit == pytest.approx(2.2)
    for t in range(2, 13):  # up to t = 3600: the 2.2 at t = 300 is still within the hour
        rec.observe(obs(300.0 * t, 1.0))
    assert rec.limit == pytest.approx(2.2)
    rec.observe(obs(3900.0, 1.0))
    assert rec.limit == pytest.approx(1.1)


def test_defaults_by_job_class() -> None:
    assert default_statistic("cpu", "batch") == "avg"
    assert default_statistic("cpu", "serving") == "p90"
    assert default_statistic("cpu", "serving_latency_sensitive") == "p95"
    assert default_statistic("memory", oom_tolerance="low") == "p98"
    assert default_statistic("memory", oom_tolerance="minimal") == "max"
    assert default_statistic("memory", oom_tolerance="intermediate") == "p60_half_max"
    assert WindowConfig.for_resource("memory").half_life_s == 48 * 3600
    assert WindowConfig.for_resource("cpu").half_life_s == 12 * 3600


def test_bad_arguments_raise_value_errors_naming_them() -> None:
    with pytest.raises(ValueError, match="statistic"):
        WindowConfig("p99")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="half_life_s"):
        DecayedCounts(2, half_life_s=0.0)
    with pytest.raises(ValueError, match="decays"):
        MlConfig(decays=(0.0,))
    with pytest.raises(ValueError, match="values"):
        Observation(0.0, (), 0.0, 0.0)


# ------------------------------------------------------------ aggregation


def test_aggregator_sums_tasks_cpu_samples_and_keeps_memory_peaks() -> None:
    agg = JobAggregator()
    agg.add("job", "a", 100.0, [0.1, 0.3], memory_peak=0.5)
    agg.add("job", "a", 200.0, [0.2], memory_peak=0.7)
    agg.add("job", "b", 250.0, [0.4], memory_peak=0.2)
    agg.add("job", "a", 400.0, [0.9])  # next window
    assert agg.close(299.0) == []
    [(job, cpu, mem)] = agg.close(300.0)
    assert job == "job" and cpu is not None and mem is not None
    assert sorted(cpu.values) == [0.1, 0.2, 0.3, 0.4]
    assert cpu.peak == 0.4
    assert cpu.usage == pytest.approx((0.2 + 0.4) / 2)  # per task means 0.2 and 0.4
    assert sorted(mem.values) == [0.2, 0.7]  # one peak per task
    assert mem.peak == 0.7
    [(_, cpu2, mem2)] = agg.close(600.0)
    assert cpu2 is not None and cpu2.values == (0.9,) and mem2 is None


# ------------------------------------------------------------------- ML


def test_ml_picks_the_model_with_the_least_decayed_cost() -> None:
    config = MlConfig(
        decays=(0.5,), margins=(0.0, 1.0), w_o=1.0, w_u=0.1, w_delta_l=0.0, w_delta_m=0.0, d=0.5
    )
    rec = MlRecommender(config, UNIT)
    rec.observe(obs(300.0, 2.0))
    # Both models pick L' = 2 (o = 0, u = 0); A: 2, B: 3; no cost yet: the smaller wins.
    assert rec.model_limits().tolist() == [2.0, 3.0]
    assert rec.limit == 2.0
    rec.observe(obs(600.0, 3.0))
    # Eq. 8 on the limits in force: A (2) overran once -> c_A = 0.5 x 1; B (3) held -> 0.
    assert rec.cost.tolist() == [0.5, 0.0]
    # Eqs. 4-6 (d_m = 0.5): o(2) = 0.5, u(3) = 0.025, u(4) = 0.075 -> L' = 3.
    assert rec.model_limits().tolist() == [3.0, 4.0]
    assert rec.chosen is not None and rec.chosen.margin == 1.0
    assert rec.limit == 4.0
    assert rec.explain()["model"] == "d=0.5,M=1"


def test_ml_switching_penalty_keeps_the_model() -> None:
    config = MlConfig(
        decays=(0.5,), margins=(0.0, 1.0), w_o=1.0, w_u=0.1, w_delta_l=0.0, w_delta_m=1.0, d=0.5
    )
    rec = MlRecommender(config, UNIT)
    rec.observe(obs(300.0, 2.0))
    rec.observe(obs(600.0, 3.0))
    # c_A = 0.5 < c_B + w_dm = 1.0: stay with A, whose limit is now 3.
    assert rec.chosen is not None and rec.chosen.margin == 0.0
    assert rec.limit == 3.0


def test_ml_change_penalty_holds_the_limit() -> None:
    config = MlConfig(decays=(1.0,), margins=(0.0,), w_o=1.0, w_u=0.1, w_delta_l=5.0, d=0.5)
    rec = MlRecommender(config, UNIT)
    rec.observe(obs(300.0, 5.0))
    assert rec.limit == 5.0
    rec.observe(obs(600.0, 4.0))
    # Without the penalty L' = 4 (cost 0 vs 0.1 for 5); changing costs 5: keep 5.
    assert rec.limit == 5.0


# -------------------------------------------------------------- decisions


def test_tracker_emits_only_on_change_with_explanation() -> None:
    tracker = LimitTracker(
        lambda resource: MovingWindowRecommender(WindowConfig("max", margin=0.0), UNIT)
    )
    first = tracker.observe("j", "cpu", obs(300.0, 2.0))
    assert first is not None and first.limit == 2.0 and first.previous is None
    assert tracker.observe("j", "cpu", obs(600.0, 1.0)) is None  # max holds 2
    third = tracker.observe("j", "cpu", obs(900.0, 3.0))
    assert third is not None and third.previous == 2.0 and third.limit == 3.0
    assert third.statistic == "max" and third.window_s == 3600.0 and third.margin == 0.0
    assert "cpu limit 3 (was 2) by window-max" in third.explanation()
    again = LimitTracker(
        lambda resource: MovingWindowRecommender(WindowConfig("max", margin=0.0), UNIT)
    )
    again.observe("j", "cpu", obs(300.0, 2.0))
    again.observe("j", "cpu", obs(600.0, 1.0))
    replay = again.observe("j", "cpu", obs(900.0, 3.0))
    assert replay is not None and replay.decision_id == third.decision_id


def test_ml_slack_underrun_and_multiplicative_margin_by_hand() -> None:
    config = MlConfig(
        decays=(1.0,),
        margins=(0.5,),
        w_u=0.3,
        w_delta_l=0.0,
        w_delta_m=0.0,
        d=0.5,
        underrun="slack",
        margin_mode="mul",
    )
    rec = MlRecommender(config, UNIT)
    rec.observe(obs(300.0, 2.0))
    assert rec.limit == 3.0  # L' = 2, times 1.5
    rec.observe(obs(600.0, 1.0))
    # The limit in force (3) left (3 - 1) / 3 of the window unused: c = 0.5 x 0.3 x 2/3.
    assert rec.cost.tolist() == pytest.approx([0.1])
    # d_m = 1: only this window counts; u(L = 1) = 0 and o(1) = 0, so L' = 1.
    assert rec.limit == 1.5
