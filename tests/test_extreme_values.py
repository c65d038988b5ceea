"""What the edge accepts, at its bounds, the engine decides on: no error, no NaN.

Schema-valid records used to stop the engine: a usage of 1e300 times the
request overflowed the limits' histogram and the usage moments, and a host
of 5e-324 GiB had an infinite inverse capacity, so Best Fit scored it NaN and
chose no host. The edge now bounds quantities and usage
(``schema.MAX_AMOUNT``, ``MAX_USAGE``, ``MAX_INTERVAL_S``) and a host's
capacity is 0 or at least ``cluster.MIN_CAPACITY`` (else the event is
refused). Here streams of every event kind, their numbers drawn from the
extremes the edge lets through, go through each policy with the default
configuration (limits and usage models on), as the live intake feeds them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lavad.core.cluster import MIN_CAPACITY, ClusterError, ClusterState
from lavad.core.engine import Engine
from lavad.daemon.settings import load_settings
from lavad.streams.codec import SchemaError, decode_event, encode
from lavad.streams.schema import (
    MAX_AMOUNT,
    MAX_INTERVAL_S,
    MAX_USAGE,
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
    HostDown,
    HostDrain,
    HostUp,
    UsageSample,
    UsageStats,
    VmExit,
    VmPlaced,
    VmRequest,
)

CONFIG = Path(__file__).resolve().parents[1] / "config" / "lavad.toml"
TINY = 5e-324  # the least positive float: its inverse is infinite

AMOUNTS = st.sampled_from([TINY, MIN_CAPACITY, 0.5, 1.0, 48.0, MAX_AMOUNT])
SIZES = st.sampled_from([0.0, TINY, MIN_CAPACITY, 1.0, 192.0, MAX_AMOUNT])
USAGE = st.sampled_from([0.0, TINY, 0.5, 1.0, MAX_USAGE])
STEPS = st.sampled_from([0.0, 1.0, 300.0, 3_600.0, 86_400.0])
VMS = st.sampled_from(["v0", "v1", "v2", "v3"])
HOSTS = st.sampled_from(["h0", "h1", "h2"])
DEPLOYMENTS = st.sampled_from(["d0", "d1"])


@st.composite
def _stats(draw: st.DrawFn) -> UsageStats:
    samples = draw(st.lists(USAGE, max_size=3))
    return UsageStats(mean=draw(USAGE), peak=draw(USAGE), samples=tuple(samples))


def _event(time: float) -> st.SearchStrategy[Event]:
    at = {"time": st.just(time), "pool": st.just("p")}
    scale = st.sampled_from([DeploymentScaleOut, DeploymentScaleIn])
    return st.one_of(
        st.builds(
            VmRequest,
            **at,
            vm_id=VMS,
            cores=AMOUNTS,
            memory_gib=SIZES,
            gpus=SIZES,
            tenant=st.sampled_from(["", "t"]),
            deployment=st.sampled_from(["", "d0"]),
            max_per_host=st.sampled_from([None, 1]),
        ),
        st.builds(VmExit, **at, vm_id=VMS),
        st.builds(VmPlaced, **at, vm_id=VMS, host_id=HOSTS, cores=AMOUNTS, memory_gib=SIZES),
        st.builds(HostUp, **at, host_id=HOSTS, cores=AMOUNTS, memory_gib=AMOUNTS, gpus=SIZES),
        st.builds(HostDown, **at, host_id=HOSTS),
        st.builds(HostDrain, **at, host_id=HOSTS),
        st.builds(DeploymentArrival, **at, deployment_id=DEPLOYMENTS, cores=SIZES),
        scale.flatmap(lambda kind: st.builds(kind, **at, deployment_id=DEPLOYMENTS, cores=AMOUNTS)),
        st.builds(
            UsageSample,
            **at,
            vm_id=VMS,
            interval_s=st.sampled_from([TINY, 1.0, 300.0, MAX_INTERVAL_S]),
            cpu=_stats(),
            memory=st.one_of(st.none(), _stats()),
        ),
    )


@st.composite
def _stream(draw: st.DrawFn) -> list[Event]:
    time = 0.0
    events: list[Event] = []
    for _ in range(draw(st.integers(1, 60))):
        time += draw(STEPS)
        events.append(draw(_event(time)))
    return events


def _nan_in(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_nan_in(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_nan_in(v) for v in value)
    return False


@pytest.mark.parametrize("policy", ["bestfit", "las", "lava", "gpa", "waste"])
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(stream=_stream())
def test_the_extremes_the_edge_accepts_are_decided_on(policy: str, stream: list[Event]) -> None:
    accepted = []
    for event in stream:
        try:
            accepted.append(decode_event(encode(event)))  # what the live intake would pass
        except SchemaError:
            continue
    engine = Engine(load_settings(CONFIG).engine_config(policy, trace_has_hosts=False))
    for event in accepted:
        decisions = [*engine.advance(event.time), *engine.handle(event, event.time).decisions]
        for decision in decisions:
            assert not _nan_in(dataclasses.asdict(decision)), decision
    engine.summary(accepted[-1].time if accepted else 0.0)


@pytest.mark.parametrize("capacity", [TINY, 1e-300, MIN_CAPACITY / 2, 2 * MAX_AMOUNT, math.nan])
def test_a_host_capacity_outside_the_bounds_is_refused(capacity: float) -> None:
    cluster = ClusterState()
    with pytest.raises(ClusterError, match="must be 0 or within"):
        cluster.add_host("h", (48.0, capacity, 0.0, 0.0))
    # Refused before anything changed.
    assert cluster.n_hosts == 0 and cluster.host_index == {}


def test_a_host_too_small_to_score_is_dead_lettered_and_the_pool_goes_on() -> None:
    engine = Engine(load_settings(CONFIG).engine_config("bestfit", trace_has_hosts=True))
    tiny = HostUp(time=0.0, pool="p", host_id="h0", cores=48.0, memory_gib=TINY)
    rejection = engine.handle(tiny, 0.0).rejection
    assert rejection is not None and rejection.stage == "engine"
    assert "memory_gib 5e-324" in rejection.reason
    up = HostUp(time=0.0, pool="p", host_id="h1", cores=48.0, memory_gib=MIN_CAPACITY)
    assert engine.handle(up, 0.0).rejection is None
    request = VmRequest(time=1.0, pool="p", vm_id="v", cores=1.0, memory_gib=MIN_CAPACITY)
    (placement,) = engine.handle(request, 1.0).decisions
    assert placement.host_id == "h1"  # type: ignore[union-attr]
