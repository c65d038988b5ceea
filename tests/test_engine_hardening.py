"""Hardening in the core: absurd times, refusals beside decisions, evictions, pools, ids.

Each test here failed on the engine before the issue: a record with time
1e20 hung it (the poison pill), a refused event raised and dropped what the
timers had decided, a host.down evicted silently, pools were unbounded, and
decision ids of different decisions could be equal.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.core.cluster import ClusterState
from lavad.core.engine import Engine, EngineConfig, PoolSetup
from lavad.core.input_bounds import InputBounds, PoolNames
from lavad.core.metrics.pool import MetricsConfig, PoolMetrics
from lavad.core.migrations.config import MigrationsConfig
from lavad.core.placement.registry import validate_policy_args
from lavad.streams import ids
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord, encode
from lavad.streams.schema import (
    Decision,
    HostDown,
    HostDrain,
    HostUp,
    Migration,
    Placement,
    VmExit,
    VmPlaced,
    VmRequest,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SLICE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"
DAY = 86_400.0


def _engine(policy: str = "bestfit", **config: object) -> Engine:
    return Engine(
        EngineConfig(
            policy=policy,
            policy_args=validate_policy_args(policy, {"tie_break": "first"}),
            pools=PoolSetup(),
            **config,  # type: ignore[arg-type]
        )
    )


def _up(engine: Engine, host: str, t: float = 0.0, pool: str = "p", cores: float = 16.0) -> None:
    handled = engine.handle(
        HostUp(time=t, pool=pool, host_id=host, cores=cores, memory_gib=4 * cores), t
    )
    assert handled.rejection is None


# ------------------------------------------------------------------ time


def test_the_poison_pill_replay_finishes_and_dead_letters_the_absurd_record(
    tmp_path: Path,
) -> None:
    """The bundled slice with a schema-valid request at time 1e20 in the middle and at the end.

    Before the issue the pool metrics took one sample per hour up to 1e20 and
    the replay never ended; the child process is bounded by the test's timeout.
    """
    events = [
        item for item in open_trace(SLICE, seed=0).events() if not isinstance(item, BadRecord)
    ]
    half = len(events) // 2
    pill = VmRequest(time=1e20, pool="default", vm_id="pill", cores=1.0, memory_gib=1.0)
    # The second pill ends the file: with no events after it the reader lets it
    # through (the one in the middle it refuses itself, ahead of those after
    # it), so the engine's own bound is what refuses it.
    last = dataclasses.replace(pill, vm_id="last-pill")
    lines = [
        *(encode(e) for e in events[:half]),
        encode(pill),
        *(encode(e) for e in events[half:]),
        encode(last),
    ]
    trace = tmp_path / "poisoned.jsonl"
    trace.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "decisions.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lavad.daemon.cli import main; main()",
            "replay",
            str(trace),
            "--policy",
            "las",
            "--out",
            str(out),
            "--metrics-json",
            str(tmp_path / "metrics.json"),
        ],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    dead = [
        orjson.loads(line)
        for line in (tmp_path / "decisions.las.deadletters.jsonl").read_bytes().splitlines()
    ]
    (letter,) = [d for d in dead if "input.max_time" in d["reason"]]
    assert letter["source"] == "time"
    assert b'"last-pill"' in letter["raw_preview"].encode()
    (middle,) = [d for d in dead if "out of order" in d["reason"]]
    assert b'"pill"' in middle["raw_preview"].encode()
    decided = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert not [d for d in decided if d.get("vm_id") in ("pill", "last-pill")]
    assert max(d["time"] for d in decided) < 1e10
    # And nothing else was lost to them: every request of the slice was placed.
    requests = sum(isinstance(e, VmRequest) for e in events)
    assert sum(d["kind"] == "placement" for d in decided) == requests


def test_a_quiet_gap_of_any_length_costs_two_samples() -> None:
    """Metrics over a gap of 1e12 s: bounded work, and the weights count every hour."""
    code = """
from lavad.core.cluster import ClusterState
from lavad.core.metrics.pool import MetricsConfig, PoolMetrics
import numpy as np
cluster = ClusterState()
cluster.add_host("h", (8.0, 8.0, 0.0, 0.0))
config = MetricsConfig(warmup_s=0.0, sample_interval_s=3600.0)
metrics = PoolMetrics(config, np.random.default_rng(0))
metrics.advance(cluster, 0.0)
metrics.observe_request((1.0, 1.0, 0.0, 0.0), 0.0)
metrics.advance(cluster, 1e12)
print(len(metrics.series), sum(s.weight for s in metrics.stranding))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=60, check=True, text=True
    )
    series, weights = map(int, result.stdout.split())
    assert series == 2  # the first and the last hour of the gap
    # Ticks at 0, 3600, ... below 1e12: ceil(1e12 / 3600) of them, all past the warm-up.
    assert weights == -(-1_000_000_000_000 // 3600)


def test_gap_samples_match_one_sample_per_hour() -> None:
    """On a short gap the two-sample form gives what one sample per hour gave."""
    cluster = ClusterState()
    cluster.add_host("h", (8.0, 8.0, 0.0, 0.0))
    metrics = PoolMetrics(MetricsConfig(warmup_s=7_200.0), np.random.default_rng(0))
    metrics.advance(cluster, 0.0)
    metrics.observe_request((1.0, 1.0, 0.0, 0.0), 0.0)
    metrics.advance(cluster, 10.5 * 3600.0)
    # Hourly ticks 0..10 (11 of them); 2..10 are past the 2 h warm-up: 9 samples.
    assert sum(s.weight for s in metrics.stranding) == 9
    assert [p.time for p in metrics.series] == [0.0, 36_000.0]
    assert metrics._next_tick == 11 * 3600.0


def test_an_event_far_ahead_of_its_pool_is_refused_and_the_pool_goes_on() -> None:
    engine = _engine("las")
    _up(engine, "h0", 100.0)
    ahead = VmRequest(time=100.0 + 31 * DAY, pool="p", vm_id="late", cores=1.0, memory_gib=1.0)
    handled = engine.handle(ahead, ahead.time)
    assert handled.decisions == []
    assert handled.rejection is not None
    assert handled.rejection.stage == "time"
    assert "input.max_ahead_s" in handled.rejection.reason
    assert engine.pools["p"].clock == 100.0
    ok = engine.handle(VmRequest(time=200.0, pool="p", vm_id="a", cores=1.0, memory_gib=1.0), 200.0)
    assert ok.rejection is None
    (placement,) = ok.decisions
    assert isinstance(placement, Placement) and placement.host_id == "h0"


def test_the_first_event_of_a_pool_is_bounded_only_by_max_time() -> None:
    engine = _engine()
    _up(engine, "h0", 1.7e9)  # Unix seconds: plausible
    refused = engine.handle(
        HostUp(time=1.7e12, pool="q", host_id="h", cores=1.0, memory_gib=1.0), 1.7e12
    )
    assert refused.rejection is not None and "milliseconds" in refused.rejection.reason
    assert "q" not in engine.pools


def test_a_late_event_is_handled_at_its_pools_clock_and_a_very_late_one_refused() -> None:
    engine = _engine(input=InputBounds(max_behind_s=60.0))
    _up(engine, "h0", 1_000.0)
    late = engine.handle(
        VmRequest(time=970.0, pool="p", vm_id="a", cores=1.0, memory_gib=1.0), 970.0
    )
    (placement,) = late.decisions
    assert placement.time == 1_000.0  # the pool's clock, not 970
    assert engine.pools["p"].counters["late_events"] == 1
    too_late = engine.handle(VmExit(time=900.0, pool="p", vm_id="a"), 900.0)
    assert too_late.rejection is not None
    assert "100 s behind" in too_late.rejection.reason
    assert "a" in engine.pools["p"].cluster.vms  # the refused exit changed nothing


# ------------------------------------------------------- refusals keep decisions


def test_a_refused_event_keeps_the_migrations_its_timers_started() -> None:
    """A drain, then an exit of an unknown VM after the first migrations end.

    h0 (16 cores) holds five 1-core VMs and drains at t=0: three migrations
    start at once (max_concurrent 3) and end at 1200 s, when the next two
    start. The unknown exit at 1300 s runs those timers first: the two
    migrations it started must come out with the refusal, not be dropped.
    """
    engine = _engine(migrations=MigrationsConfig(order="arrival", lifetimes="model"))
    _up(engine, "h0")
    _up(engine, "h1", cores=64.0)
    for i in range(5):
        placed = VmPlaced(
            time=0.0, pool="p", vm_id=f"v{i}", host_id="h0", cores=1.0, memory_gib=2.0
        )
        assert engine.handle(placed, 0.0).rejection is None
    started = engine.handle(HostDrain(time=0.0, pool="p", host_id="h0"), 0.0).decisions
    assert sum(isinstance(d, Migration) and d.action == "migrate" for d in started) == 3
    handled = engine.handle(VmExit(time=1_300.0, pool="p", vm_id="ghost"), 1_300.0)
    assert handled.rejection is not None and handled.rejection.stage == "engine"
    moved = [d for d in handled.decisions if isinstance(d, Migration) and d.action == "migrate"]
    assert [(d.vm_id, d.time) for d in moved] == [("v3", 1_200.0), ("v4", 1_200.0)]


# ------------------------------------------------------------- evictions


def _two_hosts_with_vms(**config: object) -> tuple[Engine, list[Decision]]:
    engine = _engine(**config)
    _up(engine, "h0")
    _up(engine, "h1")
    placed = []
    for i in range(3):
        request = VmRequest(time=1.0, pool="p", vm_id=f"v{i}", cores=4.0, memory_gib=4.0)
        placed += engine.handle(request, 1.0).decisions
    assert {d.host_id for d in placed if isinstance(d, Placement)} == {"h0"}
    return engine, engine.handle(HostDown(time=5.0, pool="p", host_id="h0"), 5.0).decisions


def test_host_down_publishes_each_eviction() -> None:
    engine, decisions = _two_hosts_with_vms()
    assert [(d.decision_id, d.host_id, d.retryable) for d in decisions] == [  # type: ignore[union-attr]
        ("placement/p/v0/evict1", None, True),
        ("placement/p/v1/evict2", None, True),
        ("placement/p/v2/evict3", None, True),
    ]
    assert all("evicted: host 'h0' went down" in d.reason for d in decisions)  # type: ignore[union-attr]
    assert engine.pools["p"].counters["evicted_by_host_down"] == 3


def test_host_down_can_place_the_evicted_vms_again() -> None:
    engine, decisions = _two_hosts_with_vms(on_host_down="replace")
    replaced = [d for d in decisions if isinstance(d, Placement) and d.host_id is not None]
    assert [(d.decision_id, d.host_id) for d in replaced] == [
        ("placement/p/v0/replace3", "h1"),
        ("placement/p/v1/replace3", "h1"),
        ("placement/p/v2/replace3", "h1"),
    ]
    assert set(engine.pools["p"].cluster.vms) == {"v0", "v1", "v2"}
    # Their exits now release them from h1, as for any placed VM.
    assert engine.handle(VmExit(time=9.0, pool="p", vm_id="v0"), 9.0).rejection is None
    assert "v0" not in engine.pools["p"].cluster.vms


# ---------------------------------------------------------------- pools


def test_pools_outside_the_allow_list_or_past_the_bound_are_refused() -> None:
    engine = _engine(pool_names=PoolNames(allow=("prod-*",), max_pools=2))
    for name in ("prod-a", "prod-b"):
        _up(engine, "h", pool=name)
    stray = engine.handle(
        HostUp(time=0.0, pool="evil", host_id="h", cores=1.0, memory_gib=1.0), 0.0
    )
    assert stray.rejection is not None and stray.rejection.stage == "pool"
    assert "pools.allow" in stray.rejection.reason
    third = engine.handle(
        HostUp(time=0.0, pool="prod-c", host_id="h", cores=1.0, memory_gib=1.0), 0.0
    )
    assert third.rejection is not None and "pools.max_pools = 2" in third.rejection.reason
    assert sorted(engine.pools) == ["prod-a", "prod-b"]


# ------------------------------------------------------------------ ids


def test_the_issues_colliding_ids_differ() -> None:
    assert ids.placement_id("p", "a/b") != ids.placement_id("p/a", "b")
    assert ids.placement_id("p", "x", "retry1") != ids.placement_id("p", "x/retry1")
    assert ids.placement_id("default", "az-12-3") == "placement/default/az-12-3"  # readable


def test_an_engine_gives_the_issues_two_placements_two_ids() -> None:
    engine = _engine()
    for pool in ("p", "p/a"):
        _up(engine, "h", pool=pool)
    first = engine.handle(
        VmRequest(time=1.0, pool="p", vm_id="a/b", cores=1.0, memory_gib=1.0), 1.0
    )
    second = engine.handle(
        VmRequest(time=1.0, pool="p/a", vm_id="b", cores=1.0, memory_gib=1.0), 1.0
    )
    assert first.decisions[0].decision_id != second.decisions[0].decision_id


# Arbitrary text, and strings built from the pieces an escaping could confuse.
NASTY = st.one_of(
    st.text(),
    st.lists(st.sampled_from(["a", "/", "%", "2F", "25", "\x00", "é", "😀", " ", "\ud800"])).map(
        "".join
    ),
)
SUFFIX = st.sampled_from(["", "retry1", "evict1", "replace2"])


@settings(max_examples=400)
@given(a=st.tuples(NASTY, NASTY, SUFFIX), b=st.tuples(NASTY, NASTY, SUFFIX))
def test_placement_ids_are_equal_only_for_equal_tuples(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    assert (ids.placement_id(*a) == ids.placement_id(*b)) == (a == b)
    assert ids.placement_id(*a).isascii()


@settings(max_examples=300)
@given(a=st.tuples(NASTY, NASTY, st.integers(0, 3)), b=st.tuples(NASTY, NASTY, st.integers(0, 3)))
def test_every_kinds_ids_are_equal_only_for_equal_tuples(
    a: tuple[str, str, int], b: tuple[str, str, int]
) -> None:
    same = a == b
    assert (ids.admission_id(*a) == ids.admission_id(*b)) == same
    assert (ids.migration_id(*a) == ids.migration_id(*b)) == same
    assert (
        ids.reprediction_id(a[0], "vm", a[1], a[2]) == ids.reprediction_id(b[0], "vm", b[1], b[2])
    ) == same
    assert (
        ids.limit_id(a[0], a[1], "cpu", str(a[2])) == ids.limit_id(b[0], b[1], "cpu", str(b[2]))
    ) == same


@pytest.mark.parametrize("part", ["/", "%2F", "a/b", "\x00", "é", "x y"])
def test_an_encoded_part_never_holds_a_slash(part: str) -> None:
    assert "/" not in ids.part(part)
