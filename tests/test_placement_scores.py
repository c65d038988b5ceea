"""Best Fit and First Fit in tables whose comments work the score out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest, Unfit
from lavad.core.placement.registry import build_policy, validate_policy_args


def _cluster(
    hosts: list[tuple[float, float, float]], used: list[tuple[float, float]]
) -> ClusterState:
    """Hosts as (cores, memory GiB, gpus); ``used`` books one VM of that size per host."""
    cluster = ClusterState()
    for i, (cores, memory, gpus) in enumerate(hosts):
        cluster.add_host(f"h{i}", (cores, memory, 0.0, gpus))
    for i, (cores, memory) in enumerate(used):
        if cores or memory:
            cluster.book(f"resident{i}", i, (cores, memory, 0.0, 0.0), "", 0.0)
    return cluster


def _request(cores: float, memory: float, gpus: float = 0.0) -> PlacementRequest:
    return PlacementRequest("new", (cores, memory, 0.0, gpus), "", None, 0.0)


def _policy(name: str, **args: object):  # type: ignore[no-untyped-def]
    return build_policy(name, validate_policy_args(name, args), np.random.default_rng(0))


EIGHT_BY_32 = [(8.0, 32.0, 0.0)] * 3
# h0 empty: free (8, 32); h1 holds (4, 24): free (4, 8); h2 holds (6, 2): free (2, 30).
USED = [(0.0, 0.0), (4.0, 24.0), (6.0, 2.0)]

BESTFIT_TABLE = [
    pytest.param(
        (2.0, 8.0),
        1,
        0.25,
        # h0: (8-2)/8 + (32-8)/32 = 0.75 + 0.75   = 1.5
        # h1: (4-2)/8 + (8-8)/32  = 0.25 + 0      = 0.25   <- least left free
        # h2: (2-2)/8 + (30-8)/32 = 0    + 0.6875 = 0.6875
        id="tightest-host",
    ),
    pytest.param(
        (4.0, 4.0),
        1,
        0.125,
        # h0: 4/8 + 28/32 = 1.375;  h1: 0/8 + 4/32 = 0.125;  h2: 2 cores < 4, filtered
        id="cpu-filter",
    ),
    pytest.param(
        (3.0, 20.0),
        0,
        1.0,
        # h1: 8 GiB < 20 and h2: 2 cores < 3 are filtered; h0: 5/8 + 12/32 = 1.0
        id="only-empty-host-fits",
    ),
    pytest.param(
        (2.0, 30.0),
        2,
        0.0,
        # h0: 6/8 + 2/32 = 0.8125;  h2: 0/8 + 0/32 = 0 (a perfect fit);  h1 filtered
        id="perfect-fit",
    ),
]


@pytest.mark.parametrize(("demand", "host", "score"), BESTFIT_TABLE)
def test_bestfit_table(demand: tuple[float, float], host: int, score: float) -> None:
    result = _policy("bestfit").place(_cluster(EIGHT_BY_32, USED), _request(*demand))
    assert isinstance(result, Placed)
    assert result.host == host
    assert result.scores["bestfit"] == pytest.approx(score)


def test_bestfit_normalises_by_each_hosts_capacity() -> None:
    # h0 (8, 32) free (4, 16) after a (4, 16) resident; h1 (16, 64) empty.
    # Request (2, 8):  h0: 2/8 + 8/32 = 0.5;  h1: 14/16 + 56/64 = 1.75  -> h0
    cluster = _cluster([(8.0, 32.0, 0.0), (16.0, 64.0, 0.0)], [(4.0, 16.0), (0.0, 0.0)])
    result = _policy("bestfit").place(cluster, _request(2.0, 8.0))
    assert isinstance(result, Placed)
    assert (result.host, result.scores["bestfit"]) == (0, pytest.approx(0.5))


def test_bestfit_keeps_cpu_requests_off_idle_gpus() -> None:
    # Same CPU and memory on both; h1 also has 4 idle GPUs, which count as left free:
    # h0: 6/8 + 24/32 = 1.5;  h1: 1.5 + 4/4 = 2.5  -> h0
    cluster = _cluster([(8.0, 32.0, 0.0), (8.0, 32.0, 4.0)], [])
    result = _policy("bestfit").place(cluster, _request(2.0, 8.0))
    assert isinstance(result, Placed)
    assert result.host == 0


def test_bestfit_weights_shift_the_choice() -> None:
    # With memory weighted 0, only cores count: h2 (0 cores left) beats h1 (2 left).
    #   h1: (4-2)/8 = 0.25;  h2: (2-2)/8 = 0
    policy = _policy("bestfit", weights={"memory_gib": 0.0})
    result = policy.place(_cluster(EIGHT_BY_32, USED), _request(2.0, 8.0))
    assert isinstance(result, Placed)
    assert (result.host, result.scores["bestfit"]) == (2, 0.0)


FIRSTFIT_TABLE = [
    # free cores per host: h0 = 1, h1 = 4, h2 = 8 (after residents of 7, 4, 0 cores)
    pytest.param(1.0, 0, id="first-host-fits"),
    pytest.param(2.0, 1, id="skips-full-host"),
    pytest.param(5.0, 2, id="only-last-fits"),
]


@pytest.mark.parametrize(("cores", "host"), FIRSTFIT_TABLE)
def test_firstfit_table(cores: float, host: int) -> None:
    cluster = _cluster(EIGHT_BY_32, [(7.0, 1.0), (4.0, 1.0), (0.0, 0.0)])
    result = _policy("firstfit").place(cluster, _request(cores, 1.0))
    assert isinstance(result, Placed)
    # First Fit's score is the host number itself.
    assert (result.host, result.scores["firstfit"]) == (host, float(host))


# The lifetime policies' compiled scans explain a refusal as Best Fit's pipeline does.
COMPILED_POLICIES = ["bestfit", "las", "lava"]


@pytest.mark.parametrize("name", COMPILED_POLICIES)
def test_unfit_now_may_retry(name: str) -> None:
    # Every host holds 7 of its 8 cores: 6 cores fit nowhere now, but would
    # fit any host once it empties, so the refusal may be retried.
    cluster = _cluster(EIGHT_BY_32, [(7.0, 1.0), (7.0, 1.0), (7.0, 1.0)])
    result = _policy(name).place(cluster, _request(6.0, 1.0))
    assert isinstance(result, Unfit)
    assert result.retryable
    assert result.rejected_by["fit"] == 3
    assert result.reason == "0/3 hosts fit: 3 by fit"


@pytest.mark.parametrize("name", COMPILED_POLICIES)
def test_unfit_larger_than_any_host_is_final(name: str) -> None:
    result = _policy(name).place(_cluster(EIGHT_BY_32, []), _request(9.0, 1.0))
    assert isinstance(result, Unfit)
    assert not result.retryable
    assert "larger than any host" in result.reason


def test_draining_hosts_receive_nothing() -> None:
    cluster = _cluster(EIGHT_BY_32, USED)
    cluster.drain_host("h1")
    result = _policy("bestfit").place(cluster, _request(2.0, 8.0))
    # h1 would win (0.25) but drains; next best is h2 with 0.6875.
    assert isinstance(result, Placed)
    assert result.host == 2


def test_anti_affinity_caps_a_deployment_per_host() -> None:
    cluster = _cluster([(8.0, 32.0, 0.0)] * 2, [])
    cluster.book("a", 0, (1.0, 1.0, 0.0, 0.0), "dep", 0.0)
    request = PlacementRequest("b", (1.0, 1.0, 0.0, 0.0), "dep", 1, 0.0)
    # Best Fit alone would pick h0 (tighter); max_per_host=1 forbids it.
    result = _policy("bestfit").place(cluster, request)
    assert isinstance(result, Placed)
    assert result.host == 1


def test_ties_are_broken_by_the_seed() -> None:
    hosts = [(8.0, 32.0, 0.0)] * 16
    picks = set()
    for seed in range(20):
        policy = build_policy(
            "bestfit", validate_policy_args("bestfit", {}), np.random.default_rng(seed)
        )
        first = policy.place(_cluster(hosts, []), _request(1.0, 1.0))
        again = build_policy(
            "bestfit", validate_policy_args("bestfit", {}), np.random.default_rng(seed)
        ).place(_cluster(hosts, []), _request(1.0, 1.0))
        assert isinstance(first, Placed)
        assert isinstance(again, Placed)
        assert first.host == again.host
        picks.add(first.host)
    assert len(picks) > 1, "all 16 empty hosts tie; different seeds should spread the choice"
