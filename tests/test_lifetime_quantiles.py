"""Quantiles of T_r | T_u and the expected LAS cost over them, worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import PlacementRequest
from lavad.core.placement.lifetime import (
    LasTemporalCost,
    LifetimeSettings,
    LifetimeTracker,
    cost_thresholds,
    expected_cost_counts,
    temporal_cost,
)
from lavad.core.placement.registry import PolicyConfigError, validate_policy_args
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.survival import (
    Tables,
    creation_quantiles,
    life_table,
    median_remaining,
    midpoint_levels,
    remaining_quantiles,
    suffix_sums,
)

HOUR = 3600.0
MINUTE = 60.0

# Two bins [0, 100) and [100, 200) and the open bin beyond 200 s, whose
# representative lifetime is 400 s.
BINS = LifetimeBins(np.array([0.0, 100.0, 200.0]), np.array([50.0, 141.4, 400.0]))

QUANTILE_CASES = [
    # mass per bin, uptime, levels, expected remaining lifetimes
    # Half the mass in each closed bin, uniform inside: level 0.25 is half-way
    # through bin 0 (50 s), 0.5 its end (100 s), 0.75 half-way through bin 1.
    ([0.5, 0.5, 0.0], 0.0, [0.25, 0.5, 0.75], [50.0, 100.0, 150.0]),
    # At uptime 50 half of bin 0 is ahead (0.25 over [50, 100)) and bin 1
    # (0.5): 0.75 ahead. Level 0.25 needs 0.1875: 0.75 of [50, 100) is
    # 87.5, remaining 37.5. Level 0.5 needs 0.375: 0.125 into bin 1 of 0.5,
    # a quarter of it, 125, remaining 75. Level 0.75 needs 0.5625: 0.3125
    # into bin 1, 162.5, remaining 112.5.
    ([0.5, 0.5, 0.0], 50.0, [0.25, 0.5, 0.75], [37.5, 75.0, 112.5]),
    # Half the mass beyond the horizon: level 0.75 falls in the open bin,
    # a point at its representative lifetime, 400.
    ([0.5, 0.0, 0.5], 0.0, [0.25, 0.75], [50.0, 400.0]),
    # Uptime 300 is past all the mass (the open bin holds none): the Lindy
    # rule gives the uptime again at every level.
    ([0.5, 0.5, 0.0], 300.0, [0.25, 0.75], [300.0, 300.0]),
]


@pytest.mark.parametrize(("mass", "uptime", "levels", "expected"), QUANTILE_CASES)
def test_remaining_quantiles_by_hand(
    mass: list[float], uptime: float, levels: list[float], expected: list[float]
) -> None:
    table = np.array([mass])
    m0, m1 = suffix_sums(table, BINS)
    got = remaining_quantiles(
        Tables(BINS, table, m0, m1), np.array([0]), np.array([uptime]), np.array(levels)
    )
    np.testing.assert_allclose(got[0], expected)


def test_level_one_half_is_the_median() -> None:
    bins = LifetimeBins.log_spaced()
    rng = np.random.default_rng(3)
    table = rng.dirichlet(np.ones(bins.count), size=5)
    tables = Tables(bins, table, *suffix_sums(table, bins))
    rows = np.arange(5)
    uptimes = np.array([0.0, 200.0, 4000.0, 1e5, 3e6])
    half = remaining_quantiles(tables, rows, uptimes, np.array([0.5]))[:, 0]
    np.testing.assert_allclose(half, median_remaining(tables, rows, uptimes))


def test_midpoint_levels() -> None:
    # Each of 4 quantiles stands for a quarter: the middles of the quarters.
    np.testing.assert_allclose(midpoint_levels(4), [0.125, 0.375, 0.625, 0.875])
    with pytest.raises(ValueError, match="at least one"):
        midpoint_levels(0)


def test_expected_cost_by_hand() -> None:
    # A VM that lives 20 min or 5 h, with probability 1/2 each; hosts with
    # 0, 1 h, 4.5 h and 10 h of remaining life. The 20-min outcome costs 0
    # everywhere (it ends within 30 min). The 5-h one overshoots the hosts by
    # 5 h (bucket [4h, 6h), index 6), 4 h (6), 30 min (1) and nothing (0):
    # Q x E[cost] = [6, 6, 1, 0]. The mean (2 h 40 min) overshoots by 2 h 40
    # ([2h, 3h): 4), 1 h 40 ([90m, 2h): 3), nothing, nothing: 4, 3, 0, 0,
    # a tie between the last two hosts that the distribution breaks.
    thresholds = cost_thresholds(np.array([20 * MINUTE, 5 * HOUR]))
    hosts = np.array([0.0, 1.0, 4.5, 10.0]) * HOUR
    assert expected_cost_counts(thresholds, hosts).tolist() == [6.0, 6.0, 1.0, 0.0]
    mean = (20 * MINUTE + 5 * HOUR) / 2
    assert temporal_cost(mean - hosts).tolist() == [4.0, 3.0, 0.0, 0.0]


def test_expected_cost_counts_sum_the_temporal_costs() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        quantiles = rng.exponential(rng.uniform(600, 2e5), size=rng.integers(1, 20))
        hosts = np.concatenate([[0.0], rng.exponential(5e4, size=30)])
        summed = temporal_cost(quantiles[None, :] - hosts[:, None]).sum(axis=1)
        counts = expected_cost_counts(cost_thresholds(quantiles), hosts)
        np.testing.assert_array_equal(counts, summed)


def _tracker_with_history(settings: LifetimeSettings) -> tuple[ClusterState, LifetimeTracker]:
    cluster = ClusterState()
    for h in range(4):
        cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
    tracker = LifetimeTracker(settings)
    # 40 VMs on host 0 living 10 min to about 11 h, so the pool table has a spread.
    for i in range(40):
        record = cluster.book(f"old{i}", 0, (0.1, 0.1, 0.0, 0.0), "", 0.0)
        tracker.on_booked(cluster, record, 0.0, None)
    for i in range(40):
        lifetime = 600.0 * 1.1**i
        record = cluster.release(f"old{i}")
        tracker.on_released(cluster, record, lifetime, exited=True)
    # Hosts 1-3 hold one VM each, predicted to exit at 1 h, 3 h and 8 h.
    for host, exit_h in ((1, 1.0), (2, 3.0), (3, 8.0)):
        record = cluster.book(f"v{host}", host, (1.0, 1.0, 0.0, 0.0), "", 0.0)
        tracker.on_booked(cluster, record, 0.0, None)
        slot = tracker._slot[f"v{host}"]
        tracker.slots.predicted_exit[slot] = tracker.hosts.exit[host] = exit_h * HOUR
    return cluster, tracker


def test_one_quantile_scores_as_the_median_point() -> None:
    # With Q = 1 the only level is 1/2, so quantile scoring is the bucket of
    # the median: the same costs as point scoring with estimate = median.
    now = 1e5
    request = PlacementRequest("new", (1.0, 1.0, 0.0, 0.0), "", None, now)
    costs = []
    for scoring, estimate in (("quantiles", "mean"), ("mean", "median")):
        settings = LifetimeSettings(
            refit_interval_s=1e9,
            min_observations=1,
            scoring=scoring,  # type: ignore[arg-type]
            estimate=estimate,  # type: ignore[arg-type]
            quantiles=1,
        )
        cluster, tracker = _tracker_with_history(settings)
        for slot in range(len(tracker.slots.host)):
            if tracker.slots.alive[slot]:
                tracker.slots.predicted_exit[slot] += now
        tracker.hosts.exit[1:4] += now
        out = np.zeros(4)
        LasTemporalCost(tracker).score(cluster, request, out, np.zeros(4))
        costs.append(out.tolist())
    assert costs[0] == costs[1]


@pytest.mark.parametrize(
    ("args", "key"),
    [({"scoring": "best"}, "policies.las.scoring"), ({"quantiles": 0}, "policies.las.quantiles")],
)
def test_registry_validates_scoring(args: dict[str, object], key: str) -> None:
    with pytest.raises(PolicyConfigError) as caught:
        validate_policy_args("las", args)
    assert caught.value.key == key
    assert validate_policy_args("lava", {"scoring": "quantiles", "quantiles": 8})


def test_compiled_creation_quantiles_are_numpys_bit_for_bit() -> None:
    # The tracker's quantiles at creation come from the compiled loop; the
    # decisions must not move, so every number must be the numpy one.
    bins = LifetimeBins.log_spaced()
    rng = np.random.default_rng(1)
    width = bins.count
    deaths = rng.poisson(rng.uniform(0, 5, size=(200, width))).astype(float)
    deaths[::7, 20:] = 0.0  # tails left to the Pareto rule
    deaths[::11] = 0.0
    censored = rng.poisson(rng.uniform(0, 2, size=(200, width))).astype(float)
    censored[::13] = 0.0  # rows with no observation at all: uniform
    mass = life_table(deaths, censored, bins.pareto_tail_hazard)
    m0, m1 = suffix_sums(mass, bins)
    for count in (1, 8, 32):
        levels = midpoint_levels(count)
        for row in range(len(mass)):
            tables = Tables(bins, mass, m0, m1)
            expected = remaining_quantiles(tables, np.array([row]), np.array([0.0]), levels)[0]
            assert np.array_equal(creation_quantiles(tables, row, levels), expected)
