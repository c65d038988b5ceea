"""The usage stream through the engine (limits, gpa), on the bundled real Google slice."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support import PROJECT_ROOT

from lavad.core.engine import Engine
from lavad.core.limits.service import LimitsConfig
from lavad.core.placement.gpa import UsageHooks
from lavad.daemon.config_file import ConfigError
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.schema import Decision, Limit, UsageSample, VmRequest

GOOGLE_SLICE = PROJECT_ROOT / "data" / "google-2011-gcd-limits-slice"
CONFIG = PROJECT_ROOT / "config" / "lavad.toml"


def _usage() -> list[UsageSample]:
    events = open_trace(GOOGLE_SLICE, seed=0).events()
    return [e for e in events if not isinstance(e, BadRecord) and isinstance(e, UsageSample)]


def _run(recommender: str, events: list[UsageSample]) -> tuple[Engine, list[Decision]]:
    settings = load_settings(CONFIG)
    config = replace(
        settings.engine_config(trace_has_hosts=False), limits=LimitsConfig(recommender, 0.05)
    )
    engine = Engine(config)
    decisions: list[Decision] = []
    for event in events:
        decisions.extend(engine.handle(event, event.time).decisions)
    return engine, decisions


@pytest.mark.parametrize("recommender", ["ml", "vpa", "window-p95"])
def test_usage_becomes_limit_decisions(recommender: str) -> None:
    events = _usage()
    _, decisions = _run(recommender, events)
    assert decisions and all(isinstance(d, Limit) for d in decisions)
    limits = [d for d in decisions if isinstance(d, Limit)]
    assert {d.vm_id for d in limits} == {e.vm_id for e in events}
    assert {d.resource for d in limits} == {"cpu", "memory"}
    assert {d.policy for d in limits} == {recommender}
    # Each decision's previous limit is the one published before it, and a
    # change smaller than the 5% tolerance is never published.
    last: dict[tuple[str, str], float] = {}
    for d in limits:
        key = (d.vm_id, d.resource)
        assert d.previous == last.get(key)
        if d.previous is not None:
            assert abs(d.limit - d.previous) > 0.05 * d.previous
        last[key] = d.limit
    # Decided on closed 5-minute windows, in time order.
    times = [d.time for d in limits]
    assert times == sorted(times)
    assert all(t % 300 == 0 for t in times)


def test_limit_decisions_are_deterministic_and_survive_a_snapshot() -> None:
    events = _usage()
    half = len(events) // 2
    _, whole = _run("ml", events)
    engine, first = _run("ml", events[:half])
    # The live daemon writes pools into snapshots with state_codec: a restored pool decides on.
    restored = loads(dumps(engine.pools))
    engine.pools = restored
    rest = [d for e in events[half:] for d in engine.handle(e, e.time).decisions]
    assert first + rest == whole


def test_off_counts_usage_without_deciding() -> None:
    events = _usage()
    engine, decisions = _run("off", events)
    assert decisions == []
    assert engine.pools["default"].counters["unconsumed.usage"] == len(events)


def test_unknown_recommender_fails_at_start_up_with_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[limits]\nrecommender = "oracle"\n')
    with pytest.raises(ConfigError, match=r"limits\.recommender"):
        load_settings(bad)


def test_gpa_policy_learns_from_the_usage_stream_in_the_engine() -> None:
    """With gpa, usage samples reach the policy's usage model (and the limits) via the engine."""
    events = _usage()
    settings = load_settings(CONFIG)
    config = settings.engine_config("gpa", trace_has_hosts=False)
    engine = Engine(config)
    for vm_id in sorted({e.vm_id for e in events}):
        engine.handle(
            VmRequest(time=0.0, pool="default", vm_id=vm_id, cores=1.0, memory_gib=1.0), 0.0
        )
    decisions = [d for e in events for d in engine.handle(e, e.time).decisions]
    pool = engine.pools["default"]
    hooks = pool.policy.hooks
    assert isinstance(hooks, UsageHooks)
    assert all(vm_id in hooks.usage.moments for vm_id in {e.vm_id for e in events})
    assert pool.counters["unconsumed.usage"] == 0
    assert any(isinstance(d, Limit) for d in decisions)


def test_a_flood_of_new_job_names_stays_bounded_and_is_counted() -> None:
    """5,000 VM ids nobody placed, one usage sample each, into a pool capped at 50 jobs:
    the recommenders kept stay at the cap and every one past it is an eviction. The real
    jobs of the slice, sampled last, are still there."""
    settings = load_settings(CONFIG)
    config = replace(
        settings.engine_config(trace_has_hosts=False),
        limits=LimitsConfig("vpa", 0.05, max_jobs=50),
    )
    engine = Engine(config)
    real = _usage()
    first = real[0]
    flood = [
        replace(first, vm_id=f"flood-{k}", time=first.time + 300.0 * (k // 100))
        for k in range(5_000)
    ]
    for event in [*flood, *(replace(e, time=e.time + flood[-1].time) for e in real)]:
        engine.handle(event, event.time)
    pool = engine.pools[first.pool]
    assert pool.limits is not None
    tracker = pool.limits.tracker
    assert tracker.jobs == 50
    assert len({job for job, _ in tracker.recommenders}) <= 50
    assert tracker.evicted >= 5_000 - 50
    kept = {job for job, _ in tracker.recommenders}
    assert {e.vm_id for e in real} <= kept
