"""GPA with an honest tail: the Cornish-Fisher percentile of a host sum, the overflow margin."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gpa_support import cpu_sample, place_and_book
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Policy
from lavad.core.placement.gpa import UsageHooks, quantile_factor
from lavad.core.placement.registry import PolicyConfigError, build_policy, validate_policy_args
from lavad.evaluation.gpa_tail import EmpiricalFitTest, TailFitTest, task_cumulants
from lavad.evaluation.stochastic_packing import GpaFitTest, pack
from lavad.models.usage.hosts import HostUsage, UsagePrior
from lavad.models.usage.margin import HostWindow, MarginSettings, OverflowMargin, TailCalibration
from lavad.models.usage.moments import CPU, UsageMoments
from lavad.models.usage.tail import (
    CANTELLI,
    CORNISH_FISHER,
    NORMAL,
    cantelli_factor,
    cornish_fisher_factor,
    effective_variance,
    tail_factor,
)

# ------------------------------------------------------- Cornish-Fisher tail


def test_cornish_fisher_by_hand_on_three_exponential_vms() -> None:
    """Three Exp(1) VMs: the sum is Gamma(3, 1), skewed; its 99th percentile by hand.

    Each VM has cumulants k2 = 1, k3 = 2, k4 = 6; the sum's are 3, 6, 18, so
    g = 6 / 3^1.5 = 1.1547 and e = 18 / 9 = 2. With z = 2.3263 (rho 0.01):

        z_cf = 2.3263 + 4.4118 g / 6 + 5.6103 e / 24 - 13.5470 g^2 / 36
             = 2.3263 + 0.8490 + 0.4675 - 0.5017 = 3.1411,

    a percentile of 3 + 3.1411 sqrt(3) = 8.4406, against the normal
    approximation's 3 + 2.3263 sqrt(3) = 7.0293.
    """
    z = quantile_factor(0.01)
    assert z == pytest.approx(2.3263, abs=1e-4)
    factor = float(cornish_fisher_factor(z, 0.01, 3.0, 6.0, 18.0))
    assert factor == pytest.approx(3.1411, abs=2e-4)
    by_hand = 3.0 + factor * math.sqrt(3.0)
    assert by_hand == pytest.approx(8.4406, abs=1e-3)
    # A seeded Monte Carlo percentile of the sum itself.
    draws = np.random.default_rng(20).exponential(size=(400_000, 3)).sum(axis=1)
    monte_carlo = float(np.percentile(draws, 99.0))
    assert by_hand == pytest.approx(monte_carlo, rel=0.02)
    normal = 3.0 + z * math.sqrt(3.0)
    assert normal < 0.87 * monte_carlo  # the normal approximation is 16% short


def test_the_host_sums_give_the_same_correction_from_samples() -> None:
    """The same three VMs through the daemon's own estimators: moments, host sums, tail."""
    rng = np.random.default_rng(3)
    usage = HostUsage(UsageMoments(), UsagePrior(min_samples=1))
    for vm in ("a", "b", "c"):
        usage.place(vm, 0, (1.0, 1.0))
    for step, row in enumerate(rng.exponential(size=(20_000, 3)).tolist()):
        for vm, value in zip(("a", "b", "c"), row, strict=True):
            usage.observe(cpu_sample(vm, 300.0 * (step + 1), value))
    k2 = float(usage.variance_sum[CPU, 0])
    k3, k4 = float(usage.third_sum[CPU, 0]), float(usage.fourth_sum[CPU, 0])
    # Sampling error of 60,000 draws: about 2% on k2, 6% on k3, 14% on k4.
    assert (k2, k3) == pytest.approx((3.0, 6.0), rel=0.15)
    assert k4 == pytest.approx(18.0, rel=0.4)
    z = quantile_factor(0.01)
    percentile = float(usage.mean_sum[CPU, 0]) + float(
        tail_factor(CORNISH_FISHER, z, 0.01, k2, k3, k4)
    ) * math.sqrt(k2)
    assert percentile == pytest.approx(8.4059, rel=0.03)  # Gamma(3)'s 99th percentile


def test_no_skew_is_the_normal_and_the_correction_stays_within_cantelli() -> None:
    z = quantile_factor(0.05)
    assert float(cornish_fisher_factor(z, 0.05, 2.0, 0.0, 0.0)) == pytest.approx(z)
    assert float(tail_factor(NORMAL, z, 0.05, 2.0, 50.0, 0.0)) == z
    # A wild skewness: the g^2 term would turn the percentile below the mean; the expansion
    # is no quantile function there, so the skewness term alone, capped by Cantelli's bound
    # (which holds for any distribution).
    assert float(cornish_fisher_factor(z, 0.05, 1.0, 1e3, 0.0)) == cantelli_factor(0.05)
    # Rare spikes (a huge kurtosis) put the 95th percentile at the mean.
    assert float(cornish_fisher_factor(z, 0.05, 1.0, 0.0, 1e6)) == 0.0
    assert float(cornish_fisher_factor(z, 0.05, 0.0, 5.0, 5.0)) == pytest.approx(z)


def test_tail_fit_test_normal_without_margin_is_plain_gpa() -> None:
    history = np.random.default_rng(5).gamma(0.5, 0.2, size=(40, 60))
    mean, variance, third, fourth = task_cumulants(history)
    plain = pack(GpaFitTest(mean, variance, 0.05), 1.0, best_fit=True)
    same = pack(TailFitTest((mean, variance, third, fourth), 0.05, NORMAL), 1.0, best_fit=True)
    assert same.bins == plain.bins
    skewed = pack(
        TailFitTest((mean, variance, third, fourth), 0.05, CORNISH_FISHER), 1.0, best_fit=True
    )
    wider = pack(
        TailFitTest((mean, variance, third, fourth), 0.05, NORMAL, 2.0), 1.0, best_fit=True
    )
    # Right-skewed usage: the corrected percentile is higher, so never fewer machines.
    assert skewed.machines >= plain.machines
    assert wider.machines > plain.machines
    empirical = pack(EmpiricalFitTest(history, 0.05), 1.0, best_fit=True)
    assert empirical.machines >= 1


# ---------------------------------------------------------- overflow margin

ratio_lists = st.lists(
    st.floats(min_value=-5.0, max_value=50.0, allow_nan=False), min_size=1, max_size=8
)


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(ratio_lists, max_size=30),
    rho=st.sampled_from([0.1, 0.05, 0.01]),
    high=st.floats(min_value=0.0, max_value=100.0),
    count=st.integers(min_value=1, max_value=8),
)
def test_margin_widens_after_overflows_and_narrows_when_none_come(
    history: list[list[float]], rho: float, high: float, count: int
) -> None:
    """Whatever came before: a window of overflows never narrows the margin, one without never
    widens it, and enough windows without bring it back to the floor."""
    margin = OverflowMargin(rho, half_life=500.0)
    for window in history:
        margin.observe(window)
    before = margin.value
    over = before + high + 1e-6
    widened = OverflowMargin(
        rho, 500.0, value=before, edges=margin.edges.copy(), weights=margin.weights.copy()
    )
    assert widened.observe([over] * count) == count
    assert widened.value >= before
    calm = OverflowMargin(
        rho, 500.0, value=before, edges=margin.edges.copy(), weights=margin.weights.copy()
    )
    assert calm.observe([before * 0.5] * count) == 0
    assert calm.value <= before
    # At most 30 x 8 + 8 ratios above; 1,000 calm windows of 20 outweigh them 100:1 by then.
    for _ in range(1_000):
        calm.observe([0.5] * 20)
    assert calm.value == calm.floor


@settings(max_examples=80, deadline=None)
@given(
    windows=st.lists(ratio_lists, max_size=40),
    rho=st.sampled_from([0.1, 0.05, 0.01]),
)
def test_the_margin_is_a_conformal_bound_or_cap(windows: list[list[float]], rho: float) -> None:
    """With n scores (no decay to speak of): below (1 - rho) / rho the margin is cap and no
    bound; at or above it, at most rho (n + 1) - 1 scores exceed a margin under cap."""
    margin = OverflowMargin(rho, half_life=1e12)
    for window in windows:
        margin.observe(window)
    scores = [ratio for window in windows for ratio in window]
    n = len(scores)
    assert margin.evidence == pytest.approx(n, abs=1e-6)
    assert margin.conformal == (n >= round((1.0 - rho) / rho))
    if not margin.conformal:
        assert margin.value == margin.cap
    elif margin.value < margin.cap:
        assert sum(ratio > margin.value for ratio in scores) <= rho * (n + 1) - 1 + 1e-6


def test_margin_settles_at_the_quantile_the_overflows_ask_for() -> None:
    """Ratios ~ Exp(1): the margin holding rho = 0.05 is their 95th percentile, ln 20 = 3.0;
    after a burst of overflows at 10 it is wider, and it comes back when they stop."""
    rng = np.random.default_rng(9)
    margin = OverflowMargin(0.05, half_life=300.0)
    for _ in range(600):
        margin.observe(rng.exponential(size=10).tolist())
    assert margin.value == pytest.approx(math.log(20.0), rel=0.1)
    assert margin.frequency == pytest.approx(0.05, abs=0.02)
    calm = margin.value
    for _ in range(20):
        margin.observe([10.0] * 10)
    assert margin.value > 1.5 * calm
    for _ in range(3_000):
        margin.observe(rng.exponential(size=10).tolist())
    assert margin.value == pytest.approx(calm, rel=0.1)


def test_the_conformal_margin_by_hand_below_at_and_above_the_finite_sample_condition() -> None:
    """rho = 0.1: a conformal (1 - rho) bound needs n >= (1 - rho) / rho = 9 scores.

    n = 8: ceil((8 + 1) 0.9) = 9 > 8, the bound is infinite; the margin is cap and no bound.
    n = 9: ceil(10 x 0.9) = 9, the 9th smallest of 9, the largest score (1.9 here).
    n = 19: ceil(20 x 0.9) = 18, the 18th smallest of 1.1, 1.2, ..., 2.9, which is 2.8
    (one score, 2.9, may sit above: rho (n + 1) - 1 = 1). The margin is the histogram
    bin's upper edge at or above it, at most 3% wider. One window each, so no decay.
    """
    below = OverflowMargin(0.1, cap=20.0)
    below.observe([1.1 + 0.1 * i for i in range(8)])
    assert below.evidence == 8.0 and not below.conformal and below.value == below.cap
    at = OverflowMargin(0.1, cap=20.0)
    at.observe([1.1 + 0.1 * i for i in range(9)])
    assert at.conformal and 1.9 <= at.value <= 1.9 * 1.03
    above = OverflowMargin(0.1, cap=20.0)
    above.observe([1.1 + 0.1 * i for i in range(19)])
    assert above.conformal and 2.8 <= above.value <= 2.8 * 1.03
    # 2.9 stays above the margin: the one score the rho share of n + 1 allows.
    assert above.value < 2.9


def test_a_pool_without_enough_scores_reads_its_hosts_through_cantelli() -> None:
    """rho = 0.05 needs 19 scores. A host with mean sum 10 and sigma 2: Cantelli's bound is
    10 + sqrt(0.95 / 0.05) x 2 = 10 + 4.3589 x 2 = 18.7178, where plain GPA's is
    10 + 1.6449 x 2 = 13.2897. 18 hosts scored: still Cantelli; 36: the learned normal."""
    rho = 0.05
    z = quantile_factor(rho)
    calibration = TailCalibration(rho, MarginSettings(min_windows=50))
    window = [HostWindow(10.0, 10.0, (2.0 * z, 2.0 * z), 32.0) for _ in range(18)]
    calibration.observe(window)
    assert calibration.method == CANTELLI and calibration.margin == 1.0
    variance = effective_variance(
        calibration.method,
        z,
        rho,
        calibration.margin,
        np.array([4.0]),
        np.array([0.0]),
        np.array([0.0]),
    )
    assert 10.0 + z * math.sqrt(float(variance[0])) == pytest.approx(18.7178, abs=1e-4)
    calibration.observe(window)
    # 36 (decayed) scores, every ratio 0 (realised = mean): normal, its margin at the floor.
    assert calibration.margins[NORMAL].conformal
    assert calibration.method == NORMAL and calibration.margin == 1.0
    explained = calibration.explain()
    assert explained["scores_needed"] == pytest.approx(19.0)
    assert explained["methods"][NORMAL]["evidence"] == pytest.approx(36.0, abs=0.1)


def test_calibration_chooses_the_method_needing_least_headroom_and_explains() -> None:
    """Skewed host sums (three Exp VMs per host): Cornish-Fisher predicts the excess the normal
    misses, so its margin stays near 1 while the normal's widens, and it reserves less."""
    rng = np.random.default_rng(4)
    rho = 0.05
    z = quantile_factor(rho)
    calibration = TailCalibration(rho, MarginSettings(min_windows=50))
    excess = (
        z * math.sqrt(3.0),
        float(cornish_fisher_factor(z, rho, 3.0, 6.0, 18.0)) * math.sqrt(3.0),
    )
    # A new pool has no score: no learned margin is a bound yet, so Cantelli's, unscaled.
    assert calibration.method == CANTELLI and calibration.margin == 1.0
    for _ in range(400):
        sums = rng.exponential(size=(20, 3)).sum(axis=1)
        calibration.observe([HostWindow(float(s), 3.0, excess, 10.0) for s in sums])
    normal, corrected = calibration.margins[NORMAL], calibration.margins[CORNISH_FISHER]
    assert normal.value > 1.05 and corrected.value < normal.value
    assert calibration.method == CORNISH_FISHER
    explained = calibration.explain()
    assert explained["method"] == CORNISH_FISHER
    assert explained["margin"] == corrected.value
    assert (
        explained["methods"][NORMAL]["headroom"] > explained["methods"][CORNISH_FISHER]["headroom"]
    )


# ---------------------------------------------------------------- live GPA


def _drifting_pair(margin: bool) -> tuple[Policy, ClusterState, UsageHooks, float]:
    """Two 4-core VMs learnt at 0.2 / 0.3 on one 16-core host (of two), then both at 0.9 for
    30 windows; a third VM at 0.9 / 0.95 has its estimate and waits to be placed."""
    args = {
        "rho": 0.05,
        "min_samples": 4,
        "margin_min_windows": 5,
        "margin": margin,
        "tie_break": "first",
    }
    policy = build_policy("gpa", validate_policy_args("gpa", args), np.random.default_rng(0))
    hooks = policy.hooks
    assert isinstance(hooks, UsageHooks)
    cluster = ClusterState()
    for name in ("h0", "h1"):
        cluster.add_host(name, (16.0, 128.0, 0.0, 0.0))
    for vm in ("a", "b"):
        assert place_and_book(policy, cluster, vm, 0.0) == 0
    time = 0.0
    for k in range(20):
        time = 300.0 * (k + 1)
        for vm in ("a", "b"):
            hooks.observe(cluster, cpu_sample(vm, time, 0.2 if k % 2 else 0.3))
    if hooks.tail is not None:
        # 16 host windows scored (the first 4 are on the prior), fewer than the 19 a conformal
        # bound at rho 0.05 needs: the pool still reads its host through Cantelli's bound.
        assert hooks.tail.method == CANTELLI and hooks.tail.margin == 1.0
        assert not hooks.tail.explain()["methods"][NORMAL]["conformal"]
    for _ in range(30):
        time += 300.0
        for vm in ("a", "b"):
            hooks.observe(cluster, cpu_sample(vm, time, 0.9))
    for k in range(10):
        hooks.observe(cluster, cpu_sample("c", time + 300.0 * k, 0.9 if k % 2 else 0.95))
    return policy, cluster, hooks, time + 3000.0


def test_live_gpa_widens_its_margin_when_a_host_breaks_its_promise() -> None:
    """The host's realised sum passes its promise every window: the pool's margin widens, the
    notices and the summary say so, and a VM plain GPA adds to that host goes to a new one."""
    policy, cluster, hooks, now = _drifting_pair(margin=True)
    assert hooks.tail is not None
    assert hooks.tail.margin > 2.0
    summary = hooks.summary()["cpu_tail"]
    assert summary["margin"] == hooks.tail.margin and summary["windows"] >= 30
    notices = [n for n in hooks.take_notices() if n.reason == "overflow_risk"]
    assert notices and notices[-1].explanation["margin"] > 1.0
    assert place_and_book(policy, cluster, "c", now) == 1
    # Plain GPA, on the very same stream, still trusts the drifted host's sums.
    plain, plain_cluster, _, plain_now = _drifting_pair(margin=False)
    assert place_and_book(plain, plain_cluster, "c", plain_now) == 0


def test_margin_and_covariance_factor_are_not_both_on() -> None:
    with pytest.raises(PolicyConfigError, match="margin and calibrate"):
        validate_policy_args("gpa", {"margin": True, "calibrate": True})
    with pytest.raises(PolicyConfigError, match="tail_methods"):
        validate_policy_args("gpa", {"tail_methods": ["lognormal"]})
