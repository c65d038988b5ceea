"""The VPA baseline against the expected values of the upstream VPA unit tests.

Ported from kubernetes/autoscaler, vertical-pod-autoscaler/pkg/recommender:
util/histogram_test.go, util/decaying_histogram_test.go,
util/histogram_options_test.go, logic/estimator_test.go and
model/container_test.go (OOM bump). Each test names the upstream test whose
inputs and expected values it reuses.
"""

from __future__ import annotations

import pytest

from lavad.models.limits import Observation, VpaConfig, VpaHistogram, VpaRecommender
from lavad.models.limits.vpa import (
    MIB,
    VpaBuckets,
    cpu_buckets,
    memory_buckets,
    oom_bump,
    with_margin,
    with_minimum,
)

WEIGHT_EPS = 1e-15
HOUR = 3600.0
START = 1234567890.0  # upstream's arbitrary start time
TEST_OPTIONS = VpaBuckets.linear(10.0, 1.0, WEIGHT_EPS)


def rel(value: float) -> object:
    return pytest.approx(value, rel=1e-15)


# ---------------------------------------------------- histogram_options_test.go


def test_linear_histogram_options() -> None:  # TestLinearHistogramOptions
    o = VpaBuckets.linear(5.0, 0.3, 0.001)
    assert o.num_buckets == 18
    assert o.start(0) == 0.0
    assert o.start(17) == 5.1
    assert [o.find(v) for v in (-1.0, 0.0, 1.3, 100.0)] == [0, 0, 4, 17]


def test_exponential_histogram_options() -> None:  # TestExponentialHistogramOptions
    o = VpaBuckets.exponential(500.0, 40.0, 1.5, 0.001)
    assert o.num_buckets == 6
    assert [o.start(i) for i in range(6)] == [0.0, 40.0, 100.0, 190.0, 325.0, 527.5]
    assert [o.find(v) for v in (-1.0, 39.99, 40.0, 100.0, 900.0)] == [0, 0, 1, 2, 5]


# ------------------------------------------------------------ histogram_test.go


def test_percentiles_empty_histogram() -> None:  # TestPercentilesEmptyHistogram
    h = VpaHistogram(TEST_OPTIONS)
    assert [h.percentile(p) for p in (-0.5, 0.0, 0.5, 1.0, 1.5)] == [0.0] * 5


def test_percentiles() -> None:  # TestPercentiles
    h = VpaHistogram(TEST_OPTIONS)
    for i in range(1, 5):
        h.add(float(i), float(i), 0.0)
    expected = [2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5]
    for k, want in enumerate(expected):
        assert h.percentile(k / 10) == rel(want)


def test_percentile_out_of_bounds() -> None:  # TestPercentileOutOfBounds
    h = VpaHistogram(VpaBuckets.linear(1.0, 0.1, WEIGHT_EPS))
    h.add(0.1, 0.1, 0.0)
    h.add(0.2, 0.2, 0.0)
    assert h.percentile(-0.1) == rel(0.2)
    assert h.percentile(1.1) == rel(0.3)
    h.add(0.0, 0.1, 0.0)
    h.add(1.0, 0.2, 0.0)
    assert h.percentile(-0.1) == rel(0.1)
    assert h.percentile(1.1) == rel(1.0)


def test_empty_histogram() -> None:  # TestEmptyHistogram
    h = VpaHistogram(VpaBuckets.linear(1.0, 0.1, WEIGHT_EPS))
    assert h.is_empty()
    h.add(0.1, WEIGHT_EPS * 2.5, 0.0)
    assert not h.is_empty()
    h.subtract(0.1, WEIGHT_EPS, 0.0)
    assert not h.is_empty()
    h.subtract(0.1, WEIGHT_EPS, 0.0)
    assert h.is_empty()


def test_non_empty_on_epsilon_addition() -> None:  # TestNonEmptyOnEpsilonAddition
    h = VpaHistogram(VpaBuckets.linear(1.0, 0.1, WEIGHT_EPS))
    h.add(9.9, WEIGHT_EPS * 3, 0.0)
    assert not h.is_empty()
    h.add(0.1, WEIGHT_EPS * 0.3, 0.0)
    assert not h.is_empty()
    h.add(999.9, WEIGHT_EPS * 0.3, 0.0)
    assert not h.is_empty()


def test_histogram_merge() -> None:  # TestHistogramMerge
    h1 = VpaHistogram(TEST_OPTIONS)
    h1.add(1, 1, 0.0)
    h1.add(2, 1, 0.0)
    h2 = VpaHistogram(TEST_OPTIONS)
    h2.add(2, 1, 0.0)
    h2.add(3, 1, 0.0)
    expected = VpaHistogram(TEST_OPTIONS)
    for v in (1, 2, 2, 3):
        expected.add(v, 1, 0.0)
    h1.merge(h2)
    assert h1.weight.tolist() == expected.weight.tolist()
    assert (h1.min_bucket, h1.max_bucket) == (expected.min_bucket, expected.max_bucket)


# --------------------------------------------------- decaying_histogram_test.go


def decaying() -> VpaHistogram:
    return VpaHistogram(TEST_OPTIONS, half_life_s=HOUR)


def test_percentiles_empty_decaying_histogram() -> None:  # TestPercentilesEmptyDecayingHistogram
    h = decaying()
    assert [h.percentile(p) for p in (-0.5, 0.0, 0.5, 1.0, 1.5)] == [0.0] * 5


def test_simple_decay() -> None:  # TestSimpleDecay
    h = decaying()
    h.add(2, 1000, START)
    h.add(1, 1, START + 20 * HOUR)
    assert h.percentile(0.999) == rel(2)
    assert h.percentile(1.0) == rel(3)


def test_longterm_decay() -> None:  # TestLongtermDecay
    h = decaying()
    h.add(2, 1, START)
    h.add(1, 1, START + 101 * HOUR)
    assert h.percentile(1.0) == rel(2)


def test_decaying_histogram_percentiles() -> None:  # TestDecayingHistogramPercentiles
    h = decaying()
    for i in range(1, 5):
        h.add(float(i), float(i), START + (i - 1) * HOUR)
    for p, want in [
        (0.00, 2),
        (0.02, 2),
        (0.03, 3),
        (0.10, 3),
        (0.11, 4),
        (0.34, 4),
        (0.35, 5),
        (1.00, 5),
    ]:
        assert h.percentile(p) == rel(want)


def test_no_decay() -> None:  # TestNoDecay
    h = decaying()
    for i in range(1, 5):
        h.add(float(i), float(i), START)
    for p, want in [(0.0, 2), (0.2, 3), (0.1, 2), (0.3, 3), (0.4, 4), (0.5, 4), (0.6, 4)]:
        assert h.percentile(p) == rel(want)
    for p in (0.7, 0.8, 0.9, 1.0):
        assert h.percentile(p) == rel(5)


# -------------------------------------------------------------- estimator_test.go


def test_percentile_estimator() -> None:  # TestPercentileEstimator
    cpu = VpaHistogram(cpu_buckets())
    for v in (1.0, 2.0, 3.0):
        cpu.add(v, 1.0, 0.0)
    memory = VpaHistogram(memory_buckets())
    for v in (1e9, 2e9, 3e9):
        memory.add(v, 1.0, 0.0)
    assert cpu.percentile(0.2) == pytest.approx(1.0, rel=0.05)
    assert memory.percentile(0.5) == pytest.approx(2e9, rel=0.05)


def test_margin_estimator() -> None:  # TestMarginEstimator
    assert with_margin(3.14, 0.1) == 3.14 * 1.1
    assert with_margin(3.14e9, 0.1) == 3.14e9 * 1.1


def test_min_resources_estimator() -> None:  # TestMinResourcesEstimator
    assert with_minimum(3.14, 0.2) == 3.14
    assert with_minimum(4e8, 2e7) == 4e8


# -------------------------------------------------------------- container_test.go


def test_record_oom_increased_by_bump_up() -> None:  # TestRecordOOMIncreasedByBumpUp
    assert oom_bump(1000 * MIB, 100 * MIB, 1.2) == 1200 * MIB
    rec = VpaRecommender("memory", VpaConfig(memory_unit_bytes=1.0, min_memory_bytes=0.0))
    rec.on_overrun(0.0, 1000 * MIB)
    # One sample of 1200 MiB, weight 1, at the end of the 24 h aggregation window.
    assert rec.histogram.total == pytest.approx(2.0 ** (86400.0 / rec.config.half_life_s))
    assert rec.histogram.buckets.find(1200 * MIB) == rec.histogram.min_bucket
    assert rec.histogram.min_bucket == rec.histogram.max_bucket


def test_record_oom_dont_run_away() -> None:  # TestRecordOOMDontRunAway
    rec = VpaRecommender("memory", VpaConfig(memory_unit_bytes=1.0, min_memory_bytes=0.0))
    rec.on_overrun(0.0, 1000 * MIB)
    before = rec.histogram.weight.copy()
    rec.on_overrun(0.0, 999 * MIB)  # a smaller OOM in the same window adds nothing
    assert rec.histogram.weight.tolist() == before.tolist()


def test_record_oom_increased_by_min() -> None:  # the +100 MiB floor for small requests
    assert oom_bump(1 * MIB, 100 * MIB, 1.2) == 101 * MIB


# ------------------------------------------------------ the recommender, worked


def test_vpa_defaults_on_a_worked_example() -> None:
    cfg = VpaConfig()
    assert (cfg.target_percentile, cfg.margin, cfg.half_life_s) == (0.9, 0.15, 86400.0)
    rec = VpaRecommender("cpu")  # 1 unit = 1 core
    for t in range(10):
        rec.observe(Observation(300.0 * (t + 1), (0.5,), 0.5, 0.5))
    # p90 of ten 0.5-core samples: the end of 0.5's bucket in 0.01 x 1.05^k buckets.
    buckets = rec.histogram.buckets
    end = buckets.start(buckets.find(0.5) + 1)
    assert 0.5 < end <= 0.5 * 1.05 + 0.01
    assert rec.limit == pytest.approx(end * 1.15)
    tiny = VpaRecommender("cpu")
    tiny.observe(Observation(300.0, (0.001,), 0.001, 0.001))
    assert tiny.limit == pytest.approx(0.025)  # 25 millicores floor


def test_vpa_memory_keeps_one_peak_per_day() -> None:
    rec = VpaRecommender("memory", VpaConfig(memory_unit_bytes=1e9, min_memory_bytes=0.0))
    rec.observe(Observation(300.0, (0.5,), 0.5, 0.5))
    rec.observe(Observation(600.0, (0.8,), 0.8, 0.8))  # replaces 0.5 in the same window
    assert rec.histogram.total == pytest.approx(2.0 ** ((300.0 + 86400.0) / 86400.0))
    rec.observe(Observation(300.0 + 86400.0, (0.3,), 0.3, 0.3))  # next window: a new peak
    assert rec.histogram.total > 2.0 ** ((300.0 + 86400.0) / 86400.0)
