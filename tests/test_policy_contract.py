"""The contract every registered placement policy must pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lavad.core.cluster import FIT_TOLERANCE, ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest
from lavad.core.placement.registry import REGISTRY, build_policy, validate_policy_args
from lavad.models.lifetime.features import ORACLE_FEATURE
from lavad.streams.schema import VmRequest

SHAPES = [(1.0, 0.75), (1.0, 1.75), (2.0, 3.5), (4.0, 7.0), (8.0, 56.0), (16.0, 112.0)]


def _request(
    i: int, demand: tuple[float, float, float, float], lifetime: float
) -> PlacementRequest:
    """Request ``i`` at time ``i``, carrying a true lifetime (oracle policies read it)."""
    event = VmRequest(
        time=float(i),
        pool="p",
        vm_id=f"v{i}",
        cores=demand[0],
        memory_gib=demand[1],
        gpus=demand[3],
        features={ORACLE_FEATURE: lifetime},
    )
    return PlacementRequest(f"v{i}", demand, "", None, float(i), event)


def _run(policy_name: str, seed: int) -> tuple[list[int | None], ClusterState]:
    cluster = ClusterState()
    for h in range(12):
        cluster.add_host(f"h{h}", (16.0, 128.0, 0.0, 0.0))
    policy = build_policy(
        policy_name, validate_policy_args(policy_name, {}), np.random.default_rng(seed)
    )
    hooks = policy.hooks
    draws = np.random.default_rng(99).integers(len(SHAPES), size=150)
    hosts: list[int | None] = []
    for i, k in enumerate(draws):
        cores, memory = SHAPES[int(k)]
        request = _request(i, (cores, memory, 0.0, 0.0), lifetime=3.0)
        now = request.now
        if hooks is not None and now >= hooks.next_deadline:
            hooks.advance(cluster, now)
        free_before = cluster.free.copy()
        asked = (request.vm_id, request.demand, request.deployment, request.max_per_host)
        features = dict(request.event.features) if request.event else None
        result = policy.place(cluster, request)
        # place() only decides: neither the cluster nor the request changes.
        assert np.array_equal(free_before, cluster.free)
        assert asked == (request.vm_id, request.demand, request.deployment, request.max_per_host)
        assert features == (request.event.features if request.event else None)
        if isinstance(result, Placed):
            assert cluster.schedulable[result.host]
            assert np.all(
                cluster.free[:2, result.host] >= np.array([cores, memory]) - FIT_TOLERANCE
            )
            record = cluster.book(request.vm_id, result.host, request.demand, "", now)
            if hooks is not None:
                hooks.on_booked(cluster, record, now, request.event)
            hosts.append(result.host)
        else:
            hosts.append(None)
        # Every VM lives 3 s: the oracle's lifetime is the truth.
        if i >= 3 and f"v{i - 3}" in cluster.vms:
            record = cluster.release(f"v{i - 3}")
            if hooks is not None:
                hooks.on_released(cluster, record, now, exited=True)
    return hosts, cluster


@pytest.mark.parametrize("name", sorted(REGISTRY.names))
def test_deterministic_for_a_seed(name: str) -> None:
    first, _ = _run(name, seed=5)
    second, _ = _run(name, seed=5)
    assert first == second


@pytest.mark.parametrize("name", sorted(REGISTRY.names))
def test_arguments_are_validated(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        validate_policy_args(name, {"no_such_argument": 1})


@pytest.mark.parametrize("anti_affinity", [False, True])
@pytest.mark.parametrize("name", sorted(REGISTRY.names))
def test_compiled_kernel_matches_numpy_pipeline(name: str, anti_affinity: bool) -> None:
    """The fused kernel decides exactly as the filter/score pipeline on random states;
    with ``anti_affinity``, batches of five VMs of one deployment at most one or two
    per host, which the kernel takes as hosts unschedulable for the request."""
    rng = np.random.default_rng(11)
    args = validate_policy_args(name, {})
    compiled = build_policy(name, args, np.random.default_rng(4))
    reference = build_policy(name, args, np.random.default_rng(4))
    reference._kernel = None  # the plain numpy pipeline
    cluster = ClusterState()
    for h in range(300):
        # Heterogeneous hosts, a few with GPUs, some draining.
        cluster.add_host(
            f"h{h}",
            (
                float(rng.choice([16, 32, 48])),
                float(rng.choice([64, 256])),
                0.0,
                float(rng.choice([0, 0, 4])),
            ),
        )
    for h in rng.choice(300, size=20, replace=False):
        cluster.drain_host(f"h{h}")
    for i in range(2_000):
        cores, memory = SHAPES[int(rng.integers(len(SHAPES)))]
        gpus = float(rng.choice([0.0, 0.0, 0.0, 0.5, 1.0]))
        request = _request(i, (cores, memory, 0.0, gpus), lifetime=float(rng.exponential(600.0)))
        if anti_affinity:
            limit = (1, 2)[i // 5 % 2]
            request = replace(request, deployment=f"d{i // 5}", max_per_host=limit)
        fast = compiled.place(cluster, request)
        slow = reference.place(cluster, request)
        assert fast == slow, f"request {i}"
        if isinstance(fast, Placed):
            cluster.book(request.vm_id, fast.host, request.demand, request.deployment, float(i))
            if anti_affinity:
                held = cluster.deployment_hosts[request.deployment][fast.host]
                assert held <= limit
        if cluster.vms and rng.random() < 0.45:
            victim = sorted(cluster.vms)[int(rng.integers(len(cluster.vms)))]
            cluster.release(victim)
