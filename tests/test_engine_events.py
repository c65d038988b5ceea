"""Host lifecycle, shadow placements and refusals through the engine."""

from __future__ import annotations

import pytest

from lavad.core.engine import Engine, EngineConfig, PoolSetup
from lavad.core.placement.registry import validate_policy_args
from lavad.streams.schema import (
    DeploymentArrival,
    HostDown,
    HostDrain,
    HostUp,
    Placement,
    VmExit,
    VmPlaced,
    VmRequest,
)


def _engine() -> Engine:
    return Engine(
        EngineConfig(
            policy="bestfit",
            policy_args=validate_policy_args("bestfit", {}),
            pools=PoolSetup(),  # hosts only from host.up events
        )
    )


def _request(engine: Engine, vm_id: str, t: float, cores: float = 4.0) -> Placement:
    (decision,) = engine.handle(
        VmRequest(time=t, pool="p", vm_id=vm_id, cores=cores, memory_gib=8.0), t
    ).decisions
    assert isinstance(decision, Placement)
    return decision


def test_a_pool_without_hosts_refuses_and_may_retry() -> None:
    engine = _engine()
    decision = _request(engine, "a", 0.0)
    assert decision.host_id is None
    assert decision.retryable
    assert decision.reason == "the pool has no hosts"
    # The refused VM's exit is expected, absorbed and counted.
    assert engine.handle(VmExit(time=1.0, pool="p", vm_id="a"), 1.0).decisions == []
    assert engine.pools["p"].counters["exit_of_unplaced_vm"] == 1
    # A retry of the same VM gets its own decision id.
    engine.handle(HostUp(time=2.0, pool="p", host_id="h1", cores=8.0, memory_gib=32.0), 2.0)
    assert _request(engine, "b", 3.0).decision_id == "placement/p/b"
    refused = _request(engine, "c", 4.0, cores=8.0)
    assert refused.host_id is None
    retried = _request(engine, "c", 5.0, cores=2.0)
    assert (retried.decision_id, retried.host_id) == ("placement/p/c/retry1", "h1")


def test_draining_host_gets_nothing_and_down_evicts() -> None:
    engine = _engine()
    for host in ("h1", "h2"):
        engine.handle(HostUp(time=0.0, pool="p", host_id=host, cores=8.0, memory_gib=32.0), 0.0)
    first = _request(engine, "a", 1.0)
    other = "h2" if first.host_id == "h1" else "h1"
    engine.handle(HostDrain(time=2.0, pool="p", host_id=other), 2.0)
    # Only the first host is open now.
    assert _request(engine, "b", 3.0).host_id == first.host_id
    assert _request(engine, "c", 4.0).host_id is None  # the drained host stays closed
    engine.handle(HostDown(time=5.0, pool="p", host_id=first.host_id or ""), 5.0)
    counters = engine.pools["p"].counters
    assert counters["evicted_by_host_down"] == 2
    # Exits of evicted VMs arrive later and are absorbed.
    assert engine.handle(VmExit(time=6.0, pool="p", vm_id="a"), 6.0).decisions == []
    cluster = engine.pools["p"].cluster
    assert cluster.hosts_up == 1
    assert not cluster.vms


def test_shadow_placements_are_booked_as_given() -> None:
    engine = _engine()
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=8.0, memory_gib=32.0), 0.0)
    placed = VmPlaced(time=1.0, pool="p", vm_id="x", host_id="h1", cores=6.0, memory_gib=8.0)
    assert engine.handle(placed, 1.0).decisions == []
    again = VmPlaced(time=2.0, pool="p", vm_id="y", host_id="h1", cores=6.0, memory_gib=8.0)
    engine.handle(again, 2.0)
    cluster = engine.pools["p"].cluster
    # The external scheduler overcommitted the host: booked, and counted.
    assert cluster.free[0, 0] == pytest.approx(-4.0)
    assert engine.pools["p"].counters["shadow_overcommit"] == 1


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (HostDown(time=1.0, pool="p", host_id="nope"), "unknown host 'nope'"),
        (HostDrain(time=1.0, pool="p", host_id="nope"), "unknown host 'nope'"),
        (HostUp(time=1.0, pool="p", host_id="h1", cores=1.0, memory_gib=1.0), "already up"),
        (
            VmPlaced(time=1.0, pool="p", vm_id="v", host_id="nope", cores=1.0, memory_gib=1.0),
            "unknown host 'nope'",
        ),
        (VmExit(time=1.0, pool="p", vm_id="ghost"), "exit of unknown VM 'ghost'"),
    ],
)
def test_contradictions_are_rejected_without_change(event: object, message: str) -> None:
    engine = _engine()
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=8.0, memory_gib=32.0), 0.0)
    before = engine.pools["p"].cluster.version
    handled = engine.handle(event, 1.0)  # type: ignore[arg-type]
    assert handled.decisions == []
    assert handled.rejection is not None
    assert handled.rejection.stage == "engine"
    assert message in handled.rejection.reason
    assert engine.pools["p"].cluster.version == before


def test_shadow_placement_on_a_down_host_is_rejected() -> None:
    engine = _engine()
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=8.0, memory_gib=32.0), 0.0)
    engine.handle(HostDown(time=1.0, pool="p", host_id="h1"), 1.0)
    placed = VmPlaced(time=2.0, pool="p", vm_id="x", host_id="h1", cores=1.0, memory_gib=1.0)
    rejection = engine.handle(placed, 2.0).rejection
    assert rejection is not None
    assert "which is down" in rejection.reason


def test_events_without_a_consumer_are_counted() -> None:
    engine = _engine()
    arrival = DeploymentArrival(time=0.0, pool="p", deployment_id="d", cores=4.0)
    assert engine.handle(arrival, 0.0).decisions == []
    assert engine.pools["p"].counters["unconsumed.deployment.arrival"] == 1
