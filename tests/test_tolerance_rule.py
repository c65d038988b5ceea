"""The cost tolerance a pool sets from the CPU it strands (``placement/tolerance_rule.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import pool_with_free

from lavad.core.cluster import ClusterState
from lavad.core.placement.lifetime_policy import LifetimePolicy
from lavad.core.placement.registry import (
    PolicyConfigError,
    build_policy,
    validate_policy_args,
)
from lavad.core.placement.tolerance_rule import SAMPLE_EVERY_S, SAMPLES, StrandingTolerance
from lavad.daemon.live.state_codec import dumps, loads

# Hosts of 32 cores and 128 GiB; every request of the mix asks (4, 16).
CAPACITY = (32.0, 128.0, 0.0, 0.0)
SHAPE = (4.0, 16.0, 0.0, 0.0)
# LAS sums one bucket index per pair: 32 VM quantiles by 8 host quantiles.
PAIRS = 32 * 8


def _policy(**args: Any) -> LifetimePolicy:
    policy = build_policy(
        "las",
        validate_policy_args("las", {"fine_cost_tolerance": 0.125, **args}),
        np.random.default_rng(0),
    )
    assert isinstance(policy, LifetimePolicy)
    return policy


def _rule(policy: LifetimePolicy) -> StrandingTolerance:
    rule = policy.tolerance_rule
    assert rule is not None
    for _ in range(3):
        rule.mix.add(SHAPE)
    return rule


def _cluster(free: list[tuple[float, float]]) -> ClusterState:
    """Hosts of ``CAPACITY`` with ``free`` cores and GiB left."""
    return pool_with_free(free, CAPACITY)


def test_the_stranded_cpu_worked_by_hand_sets_the_tolerance() -> None:
    # h0 has 2 cores and 100 GiB free: no (4, 16) fits, so its 2 cores strand.
    # h1 has (8, 32) free: two (4, 16) fill it, nothing is left.
    # Stranded: 2 of the pool's 64 cores, 3.125%.
    cluster = _cluster([(2.0, 100.0), (8.0, 32.0)])
    below = _policy(fine_below_stranded_cpu_pct=3.2)
    rule = _rule(below)
    rule.update(cluster, 0.0)
    assert list(rule.samples) == [pytest.approx(3.125)]
    # 3.125 < 3.2: the fine tolerance, 0.125 buckets per pair.
    assert below.las.tie_tolerance == pytest.approx(0.125 * PAIRS)
    above = _policy(fine_below_stranded_cpu_pct=3.1)
    rule = _rule(above)
    rule.update(cluster, 0.0)
    # 3.125 >= 3.1: the default's 0.25 per pair.
    assert above.las.tie_tolerance == pytest.approx(0.25 * PAIRS)


@pytest.mark.parametrize(
    ("over", "tolerance"),
    [
        # h0 strands its 2 cores as above; h1 takes two (4, 16) and h2, empty,
        # eight, so neither strands. Over the schedulable hosts: 2 of 96 cores,
        # 2.08%, under the bar of 2.5: the fine 0.125.
        ("schedulable", 0.125),
        # Over the hosts in use the empty h2 leaves the count: 2 of 64 cores,
        # 3.125%, over the bar: the default's 0.25.
        ("in_use", 0.25),
    ],
)
def test_an_empty_host_thins_the_stranding_unless_the_rule_reads_hosts_in_use(
    over: str, tolerance: float
) -> None:
    cluster = _cluster([(2.0, 100.0), (8.0, 32.0), (32.0, 128.0)])
    assert list(cluster.vm_count[:3]) == [1, 1, 0]
    policy = _policy(fine_below_stranded_cpu_pct=2.5, fine_stranding_over=over)
    rule = _rule(policy)
    rule.update(cluster, 0.0)
    assert policy.las.tie_tolerance == pytest.approx(tolerance * PAIRS)


def test_a_pool_with_no_vm_running_takes_no_sample_over_hosts_in_use() -> None:
    # Nothing in use strands nothing of the pool's work: the hour leaves the
    # day's samples as they were rather than pull their mean down.
    cluster = _cluster([(32.0, 128.0), (32.0, 128.0)])
    policy = _policy()  # the default reads the hosts in use
    rule = _rule(policy)
    rule.update(cluster, 0.0)
    assert list(rule.samples) == []
    assert policy.las.tie_tolerance == pytest.approx(0.125 * PAIRS)
    # Over the schedulable hosts the same pool is sampled: 0% stranded.
    rule = _rule(_policy(fine_stranding_over="schedulable"))
    rule.update(cluster, 0.0)
    assert list(rule.samples) == [0.0]


def test_it_starts_fine_and_waits_for_a_mix() -> None:
    policy = _policy()
    rule = policy.tolerance_rule
    assert rule is not None
    assert policy.las.tie_tolerance == pytest.approx(0.125 * PAIRS)
    # No request seen: nothing to measure stranding against, no sample.
    rule.update(_cluster([(2.0, 100.0)]), 0.0)
    assert not rule.samples


def test_one_sample_an_hour_however_far_time_jumps() -> None:
    policy = _policy(fine_below_stranded_cpu_pct=1.0)
    rule = _rule(policy)
    stranding = _cluster([(2.0, 100.0), (8.0, 32.0)])
    rule.update(stranding, 0.0)
    rule.update(stranding, SAMPLE_EVERY_S - 1.0)
    assert len(rule.samples) == 1
    # A jump of thirty thousand years is one sample, not one per hour skipped.
    rule.update(stranding, 1e12)
    assert len(rule.samples) == 2
    assert rule.next_sample == 1e12 + SAMPLE_EVERY_S


def test_the_mean_of_a_day_of_samples_decides() -> None:
    policy = _policy(fine_below_stranded_cpu_pct=1.0)
    rule = _rule(policy)
    stranding = _cluster([(2.0, 100.0), (8.0, 32.0)])  # 3.125%
    packed = _cluster([(8.0, 32.0), (8.0, 32.0)])  # 0%
    now = 0.0
    rule.update(stranding, now)
    assert policy.las.tie_tolerance == pytest.approx(0.25 * PAIRS)
    # Two hours at 0%: the mean is 3.125 / 3 = 1.04%, still at or above 1%.
    for _ in range(2):
        now += SAMPLE_EVERY_S
        rule.update(packed, now)
    assert policy.las.tie_tolerance == pytest.approx(0.25 * PAIRS)
    # A third: 3.125 / 4 = 0.78% < 1%, the fine tolerance.
    now += SAMPLE_EVERY_S
    rule.update(packed, now)
    assert policy.las.tie_tolerance == pytest.approx(0.125 * PAIRS)
    # A day later the stranding hour has left the window.
    for _ in range(SAMPLES):
        now += SAMPLE_EVERY_S
        rule.update(packed, now)
    assert 3.125 not in rule.samples
    assert len(rule.samples) == SAMPLES


def test_the_rule_survives_a_snapshot() -> None:
    policy = _policy(fine_below_stranded_cpu_pct=1.0)
    rule = _rule(policy)
    rule.update(_cluster([(2.0, 100.0), (8.0, 32.0)]), 0.0)
    restored = loads(dumps(policy))
    assert isinstance(restored, LifetimePolicy)
    assert restored.tolerance_rule is not None
    assert list(restored.tolerance_rule.samples) == list(rule.samples)
    assert restored.tolerance_rule.samples.maxlen == SAMPLES
    assert restored.tolerance_rule.next_sample == rule.next_sample
    # The rule and the scorer it sets are still one object graph.
    assert restored.tolerance_rule.las is restored.las
    assert restored.las.tie_tolerance == policy.las.tie_tolerance


@pytest.mark.parametrize(
    ("name", "args", "rule"),
    [
        # The defaults: 0.125 below 0.1% of the CPU stranded, else 0.25.
        ("las", {}, True),
        ("lava", {}, True),
        # Where it cannot apply it steps aside: no guard, no request mix ...
        ("las", {"waste_guard": False}, False),
        ("lava", {"stranding_cost": True}, False),
        # ... or a cost tolerance no wider than the fine one (the paper's LAS).
        ("las", {"cost_tolerance": 0.0}, False),
        ("lava", {"cost_tolerance": 0.125}, False),
        ("las", {"fine_cost_tolerance": None}, False),
        ("la-binary", {}, False),
    ],
)
def test_the_rule_is_on_by_default_where_it_applies(
    name: str, args: dict[str, Any], rule: bool
) -> None:
    policy = build_policy(name, validate_policy_args(name, args), np.random.default_rng(0))
    assert (getattr(policy, "tolerance_rule", None) is not None) == rule


@pytest.mark.parametrize(
    ("name", "args", "reason"),
    [
        ("las", {"fine_cost_tolerance": 0.5}, "must be below cost_tolerance"),
        ("lava", {"fine_cost_tolerance": 0.25}, "must be below cost_tolerance"),
        ("las", {"fine_cost_tolerance": 0.1, "waste_guard": False}, "needs the waste guard"),
        ("las", {"fine_below_stranded_cpu_pct": 0.2, "waste_guard": False}, "needs fine_cost"),
        ("las", {"fine_below_stranded_cpu_pct": 0.2, "fine_cost_tolerance": None}, "needs fine"),
        ("las", {"fine_below_stranded_cpu_pct": 0}, "greater than 0"),
        ("lava", {"fine_stranding_over": "in_use", "waste_guard": False}, "needs fine_cost"),
        ("la-binary", {"fine_cost_tolerance": 0.0}, "la-binary|needs the waste guard"),
    ],
)
def test_a_rule_that_cannot_apply_is_refused_at_start(
    name: str, args: dict[str, Any], reason: str
) -> None:
    with pytest.raises(PolicyConfigError, match=reason):
        validate_policy_args(name, args)


@pytest.mark.parametrize("name", ["las", "lava"])
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("fine_cost_tolerance", -1.0),
        ("fine_cost_tolerance", 1e308),
        ("fine_cost_tolerance", float("inf")),
        ("fine_cost_tolerance", float("nan")),
        ("fine_cost_tolerance", "fine"),
        ("fine_below_stranded_cpu_pct", -0.1),
        ("fine_below_stranded_cpu_pct", 1e308),
        ("fine_below_stranded_cpu_pct", float("inf")),
        ("fine_below_stranded_cpu_pct", float("nan")),
        ("fine_below_stranded_cpu_pct", "low"),
        ("fine_stranding_over", "everywhere"),
        ("fine_stranding_over", 1),
    ],
)
def test_an_absurd_value_is_refused_at_start_naming_the_key(
    name: str, key: str, value: object
) -> None:
    with pytest.raises(PolicyConfigError, match=key):
        validate_policy_args(name, {key: value})
