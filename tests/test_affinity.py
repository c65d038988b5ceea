"""Deployment affinity: its key worked by hand, its place under the waste guard, its settings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import guarded_choice

from lavad.core.cluster import ClusterState, FloatArray
from lavad.core.placement.affinity import DeploymentAffinity
from lavad.core.placement.framework import NumpyScorer, Placed, PlacementRequest
from lavad.core.placement.lifetime_policy import LifetimePolicy
from lavad.core.placement.registry import (
    PolicyConfigError,
    build_policy,
    validate_policy_args,
)
from lavad.core.placement.waste import WasteGuard

CAPACITY = (32.0, 128.0, 0.0, 0.0)
# The guard's mix: three requests of (1, 2) and one of (4, 32), as in test_waste.
MIX = [(1.0, 2.0, 0.0, 0.0)] * 3 + [(4.0, 32.0, 0.0, 0.0)]


def _pool(residents: list[str]) -> ClusterState:
    """One host per entry, each running a VM of (2, 8) of that deployment ("" for none)."""
    cluster = ClusterState()
    for h, deployment in enumerate(residents):
        cluster.add_host(f"h{h}", CAPACITY)
        cluster.book(f"r{h}", h, (2.0, 8.0, 0.0, 0.0), deployment, 0.0)
    return cluster


class _Fixed(NumpyScorer):
    """A preference below the affinity, as LAVA's would be: fixed costs per host."""

    name = "fixed"

    def __init__(self, costs: list[float]) -> None:
        self.costs = np.array(costs)

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        out[: cluster.n_hosts] = self.costs[: cluster.n_hosts]


# Four hosts; deployment "d" runs on hosts 1 and 3, "e" on host 2.
RESIDENTS = ["", "d", "e", "d"]


@pytest.mark.parametrize(
    ("deployment", "below", "expected"),
    [
        # Alone: level 0 on the hosts running "d", 1 elsewhere.
        ("d", None, [1.0, 0.0, 1.0, 0.0]),
        ("e", None, [1.0, 1.0, 0.0, 1.0]),
        # A deployment nothing runs yet, and a request of none: every host level 1.
        ("f", None, [1.0, 1.0, 1.0, 1.0]),
        ("", None, [1.0, 1.0, 1.0, 1.0]),
        # Above a preference of [0, 4, 6, 5]: level * 16 + preference, so
        # host 0 is 16 + 0 = 16, host 1 is 0 + 4 = 4, host 2 is 16 + 6 = 22,
        # host 3 is 0 + 5 = 5: hosts 1 and 3 (the siblings) rank first, and
        # between them the preference decides (host 1).
        ("d", [0.0, 4.0, 6.0, 5.0], [16.0, 4.0, 22.0, 5.0]),
        # No sibling: the preference alone orders the hosts, 16 above it.
        ("", [0.0, 4.0, 6.0, 5.0], [16.0, 20.0, 22.0, 21.0]),
    ],
)
def test_the_affinity_key_by_hand(
    deployment: str, below: list[float] | None, expected: list[float]
) -> None:
    cluster = _pool(RESIDENTS)
    scorer = DeploymentAffinity(None if below is None else _Fixed(below))
    request = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), deployment, None, 1.0)
    out = np.full(6, -1.0)  # longer than the pool: only the first n are written
    scorer.score(cluster, request, out, np.zeros(6))
    assert out[:4].tolist() == expected
    assert out[4:].tolist() == [-1.0, -1.0]


@pytest.mark.parametrize("holding", [16, 17, 30])
def test_a_deployment_on_many_hosts_keys_them_all(holding: int) -> None:
    cluster = _pool(["d"] * holding + ["", "e"])
    out = np.zeros(holding + 2)
    request = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), "d", None, 1.0)
    DeploymentAffinity(_Fixed([3.0] * (holding + 2))).score(cluster, request, out, out.copy())
    assert out.tolist() == [3.0] * holding + [19.0, 19.0]
    DeploymentAffinity().score(cluster, request, out, out.copy())
    assert out.tolist() == [0.0] * holding + [1.0, 1.0]


def test_an_absurd_deployment_name_on_every_host_of_a_large_pool() -> None:
    # A name is only a key (any string: NUL, separators, 100,000 characters);
    # the work is the hosts the deployment runs on, here all 2,000 of them.
    name = "\x00|d/" * 25_000
    cluster = _pool([name] * 1_999 + ["d"])
    out = np.full(2_000, -1.0)
    # One scorer throughout: the levels it keeps unmark all 1,999 hosts when
    # the next name differs by its last character.
    scorer = DeploymentAffinity()
    request = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), name, None, 1.0)
    scorer.score(cluster, request, out, np.zeros(2_000))
    assert out.tolist() == [0.0] * 1_999 + [1.0]
    similar = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), name[:-1], None, 1.0)
    scorer.score(cluster, similar, out, np.zeros(2_000))
    assert out.tolist() == [1.0] * 2_000


# What a pool does between placements: a VM of a deployment (or of none)
# booked on a host, a VM released, a host added, or a request scored.
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("book"), st.sampled_from(["", "d", "e"]), st.integers(0, 40)),
        st.tuples(st.just("release"), st.just(""), st.integers(0, 1_000)),
        st.tuples(st.just("add_host"), st.just(""), st.just(0)),
        st.tuples(st.just("score"), st.sampled_from(["", "d", "d", "e", "f"]), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps=_STEPS)
def test_levels_kept_between_requests_are_those_of_a_fresh_scorer(
    steps: list[tuple[str, str, int]],
) -> None:
    """The levels an affinity keeps from request to request (a deployment's hosts
    joining and leaving, other deployments asked about in between, the pool
    growing past its array) are, at every request, a fresh scorer's."""
    cluster = _pool(["", "d"])
    kept, kept_above = DeploymentAffinity(), DeploymentAffinity(_Fixed([3.0] * 64))
    running: list[str] = ["r0", "r1"]
    for number, (step, deployment, value) in enumerate(steps):
        n = cluster.n_hosts
        if step == "book":
            cluster.book(f"v{number}", value % n, (0.0, 0.0, 0.0, 0.0), deployment, 0.0)
            running.append(f"v{number}")
        elif step == "release" and running:
            cluster.release(running.pop(value % len(running)))
        elif step == "add_host":
            cluster.add_host(f"h{n}", CAPACITY)
        elif step == "score":
            request = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), deployment, None, 1.0)
            fresh = np.zeros(n)
            DeploymentAffinity().score(cluster, request, fresh, np.zeros(n))
            assert kept.levels(cluster, request)[:n].tolist() == fresh.tolist()
            above = np.zeros(n)
            kept_above.score(cluster, request, above, np.zeros(n))
            assert above.tolist() == (fresh * 16.0 + 3.0).tolist()


def test_kept_levels_follow_a_deployment_by_hand() -> None:
    # One scorer across requests, on RESIDENTS ("d" on hosts 1 and 3, "e" on 2).
    cluster = _pool(RESIDENTS)
    scorer = DeploymentAffinity()

    def levels(deployment: str) -> list[float]:
        request = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), deployment, None, 1.0)
        return scorer.levels(cluster, request)[: cluster.n_hosts].tolist()

    assert levels("d") == [1.0, 0.0, 1.0, 0.0]
    cluster.book("s", 0, (1.0, 2.0, 0.0, 0.0), "d", 1.0)  # "d" joins host 0
    assert levels("d") == [0.0, 0.0, 1.0, 0.0]
    cluster.release("r1")  # and leaves host 1
    assert levels("d") == [0.0, 1.0, 1.0, 0.0]
    assert levels("e") == [1.0, 1.0, 0.0, 1.0]  # another deployment: "d"'s hosts back to 1
    assert levels("") == [1.0, 1.0, 1.0, 1.0]
    cluster.add_host("h4", CAPACITY)  # past the kept array's 64 hosts: a new array
    for h in range(5, 70):
        cluster.add_host(f"h{h}", CAPACITY)
    cluster.book("t", 69, (1.0, 2.0, 0.0, 0.0), "d", 1.0)
    assert levels("d") == [0.0, 1.0, 1.0, 0.0] + [1.0] * 65 + [0.0]


def test_the_pool_stamps_each_host_joining_or_leaving_a_deployment() -> None:
    # (stamp, the deployment's stamp before it or 0, host): what the kept levels
    # read to tell "unchanged" and "only this host" from "rebuild".
    cluster = _pool(["", "", ""])
    shape = (1.0, 2.0, 0.0, 0.0)
    changes = cluster.deployment_changes
    cluster.book("a", 0, shape, "d", 1.0)
    assert changes["d"] == (1, 0, 0)  # the first change: 0 before it
    cluster.book("b", 0, shape, "d", 1.0)
    assert changes["d"] == (1, 0, 0)  # host 0 already runs "d": no change
    cluster.book("c", 1, shape, "e", 1.0)
    cluster.book("x", 1, shape, "d", 1.0)
    assert changes == {"d": (3, 1, 1), "e": (2, 0, 1)}  # one stamp count for the pool
    cluster.release("x")
    assert changes["d"] == (4, 3, 1)  # host 1 left "d"
    cluster.release("a")
    assert changes["d"] == (4, 3, 1)  # "b" still runs "d" on host 0
    cluster.release("b")
    assert "d" not in changes and "d" not in cluster.deployment_hosts
    # Back on another host: 0 before it, so a reader that saw stamp 4 rebuilds,
    # and one that saw no "d" (0) adds host 2 alone.
    cluster.book("y", 2, shape, "d", 1.0)
    assert changes["d"] == (5, 0, 2)


def test_a_scorer_asked_about_another_pool_reads_that_pools_hosts() -> None:
    # Both pools stamp "d"'s first host as (1, 0, host): the same stamp, other hosts.
    first, second = _pool(["d", ""]), _pool(["", "d"])
    assert first.deployment_changes["d"][:2] == second.deployment_changes["d"][:2] == (1, 0)
    scorer = DeploymentAffinity()
    request = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), "d", None, 1.0)
    assert scorer.levels(first, request)[:2].tolist() == [0.0, 1.0]
    assert scorer.levels(second, request)[:2].tolist() == [1.0, 0.0]
    assert scorer.levels(first, request)[:2].tolist() == [0.0, 1.0]


def test_a_host_that_no_longer_runs_the_deployment_loses_its_level() -> None:
    cluster = _pool(RESIDENTS)
    cluster.release("r1")
    out = np.zeros(4)
    request = PlacementRequest("v", (1.0, 2.0, 0.0, 0.0), "d", None, 1.0)
    DeploymentAffinity().score(cluster, request, out, np.zeros(4))
    assert out.tolist() == [1.0, 1.0, 1.0, 0.0]


@settings(max_examples=80, deadline=None)
@given(
    hosts=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 120), st.booleans()), min_size=2, max_size=10
    ),
    demand=st.sampled_from([(1.0, 2.0), (4.0, 32.0), (2.0, 16.0), (8.0, 14.0)]),
    tolerance=st.sampled_from([0.005, 0.02, 0.1]),
    policy=st.sampled_from(["las", "lava"]),
)
def test_affinity_takes_a_sibling_the_guard_passes_and_never_one_it_refuses(
    hosts: list[tuple[int, int, bool]],
    demand: tuple[float, float],
    tolerance: float,
    policy: str,
) -> None:
    """Under the guard: the host chosen is within the guard's tolerance of the bar
    (the affinity cannot make it strand more), and it runs the deployment whenever
    some host running it fits at the guard's level 0."""
    cluster = ClusterState()
    for h, (cores, memory, sibling) in enumerate(hosts):
        cluster.add_host(f"h{h}", CAPACITY)
        used = (CAPACITY[0] - 2.0 - cores, CAPACITY[1] - 8.0 - memory, 0.0, 0.0)
        cluster.book(f"r{h}", h, used, "d" if sibling else "", 0.0)
    result, best, costs = guarded_choice(cluster, policy, tolerance, demand, "d", MIX)
    if best == np.inf:
        assert not isinstance(result, Placed)
        return
    assert isinstance(result, Placed)
    bar = max(float(costs.min()), 0.0)  # every host runs a VM: all set the bar
    assert costs[result.host] <= bar + tolerance + 1e-12
    siblings = [h for h, (_, _, sibling) in enumerate(hosts) if sibling]
    passed = [h for h in siblings if costs[h] <= bar + tolerance - 1e-9]
    if passed:
        assert result.host in siblings


def test_on_by_default_for_las_and_lava_and_refused_by_la_binary() -> None:
    for name in ("las", "lava"):
        policy = build_policy(name, validate_policy_args(name, {}), np.random.default_rng(0))
        assert isinstance(policy, LifetimePolicy)
        assert isinstance(policy.guard, WasteGuard)
        assert isinstance(policy.guard.below, DeploymentAffinity)
        off = validate_policy_args(name, {"deployment_affinity": False})
        policy = build_policy(name, off, np.random.default_rng(0))
        assert isinstance(policy, LifetimePolicy)
        assert isinstance(policy.guard, WasteGuard)
        assert not isinstance(policy.guard.below, DeploymentAffinity)
    # Without the guard the affinity is the preference above LAS itself.
    bare = validate_policy_args("las", {"waste_guard": False})
    policy = build_policy("las", bare, np.random.default_rng(0))
    assert isinstance(policy, LifetimePolicy)
    assert isinstance(policy.preference, DeploymentAffinity)
    with pytest.raises(PolicyConfigError, match="deployment_affinity"):
        validate_policy_args("la-binary", {"deployment_affinity": True})
