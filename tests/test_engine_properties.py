"""Engine invariants under arbitrary request/exit sequences (Hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.core.cluster import FIT_TOLERANCE
from lavad.core.engine import Engine, EngineConfig, HostShape, PoolSetup
from lavad.core.metrics.pool import MetricsConfig
from lavad.core.placement.registry import REGISTRY, validate_policy_args
from lavad.models.lifetime.features import ORACLE_FEATURE
from lavad.streams.schema import Placement, Reprediction, VmExit, VmRequest

# Azure V1 flavors (flav_map.txt): cores, GiB. Requests draw from these and
# from arbitrary fractional shapes.
AZURE_SHAPES = [
    (1, 0.75),
    (1, 1.75),
    (2, 3.5),
    (2, 14),
    (4, 7),
    (4, 28),
    (8, 14),
    (8, 56),
    (16, 112),
]

shape = st.one_of(
    st.sampled_from(AZURE_SHAPES),
    st.tuples(st.floats(0.1, 20.0, allow_nan=False), st.floats(0.0, 130.0, allow_nan=False)),
)
# The true lifetime goes to every request: oracle policies read it, the
# others must ignore it.
operation = st.one_of(
    st.tuples(st.just("request"), st.tuples(shape, st.floats(0.0, 1e6))),
    st.tuples(st.just("exit"), st.integers(0, 10_000)),
)


def _engine(policy: str, grow: bool) -> Engine:
    return Engine(
        EngineConfig(
            policy=policy,
            policy_args=validate_policy_args(policy, {}),
            pools=PoolSetup(HostShape(16.0, 128.0), initial_hosts=4, grow_on_demand=grow),
            seed=3,
            metrics=MetricsConfig(warmup_s=0.0, sample_interval_s=50.0),
        )
    )


@pytest.mark.parametrize("policy", sorted(REGISTRY.names))
@pytest.mark.parametrize("grow", [False, True])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(operation, max_size=120))
def test_invariants(policy: str, grow: bool, ops: list[tuple[str, object]]) -> None:
    engine = _engine(policy, grow)
    placed: dict[str, tuple[float, float]] = {}
    for step, (kind, arg) in enumerate(ops):
        now = float(step)
        if kind == "request":
            (cores, memory), lifetime = arg  # type: ignore[misc]
            vm_id = f"vm{step}"
            request = VmRequest(
                time=now,
                pool="p",
                vm_id=vm_id,
                cores=cores,
                memory_gib=memory,
                features={ORACLE_FEATURE: lifetime},
            )
            decisions = engine.handle(request, now).decisions
            # Every request gets exactly one placement decision, about itself;
            # anything else is a reprediction made on the way.
            placements = [d for d in decisions if isinstance(d, Placement)]
            assert all(isinstance(d, Reprediction) for d in decisions if d not in placements)
            assert len(placements) == 1
            decision = placements[0]
            assert decision.vm_id == vm_id
            if decision.host_id is not None:
                placed[vm_id] = (float(cores), float(memory))
            else:
                assert decision.reason
        elif placed:
            vm_id = sorted(placed)[int(arg) % len(placed)]  # type: ignore[call-overload]
            cluster = engine.pools["p"].cluster
            host = cluster.vms[vm_id].host
            before = cluster.free[:, host].copy()
            after_exit = engine.handle(VmExit(time=now, pool="p", vm_id=vm_id), now).decisions
            assert all(isinstance(d, Reprediction) for d in after_exit)
            cores, memory = placed.pop(vm_id)
            # An exit frees exactly what its request took.
            gained = cluster.free[:, host] - before
            assert gained[0] == pytest.approx(cores, abs=1e-9)
            assert gained[1] == pytest.approx(memory, abs=1e-9)
        if "p" in engine.pools:
            cluster = engine.pools["p"].cluster
            n = cluster.n_hosts
            # No host is ever over capacity under the hard fit.
            assert np.all(cluster.free[:, :n] >= -FIT_TOLERANCE)
            assert np.all(cluster.free[:, :n] <= cluster.capacity[:, :n] + FIT_TOLERANCE)
            assert cluster.hosts_empty == int(np.count_nonzero(cluster.vm_count[:n] == 0))
            booked = np.sum([r.demand for r in cluster.vms.values()], axis=0) if cluster.vms else 0
            assert np.allclose(cluster.used_total, booked)


def test_grow_on_demand_opens_hosts_and_reports_them() -> None:
    engine = _engine("bestfit", grow=True)
    for i in range(10):
        engine.handle(
            VmRequest(time=float(i), pool="p", vm_id=f"v{i}", cores=16.0, memory_gib=8.0), float(i)
        )
    summary = engine.summary(20.0)["p"]
    # 4 initial hosts take 4 full-core VMs; 6 more hosts open on demand.
    assert summary["hosts_added_on_demand"] == 6
    assert summary["hosts_used_peak"] == 10
    assert summary["placement_failures"] == 0
