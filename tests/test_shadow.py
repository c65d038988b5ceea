"""Shadow mode in replay: both sides of a First Fit stream against plain replays, on the slice."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from shadow_support import (
    AZURE_SLICE,
    engine_config,
    firstfit_stream,
    fixed_pool_settings,
    metrics,
    slice_end_time,
)

from lavad.core.engine import PoolRuntime
from lavad.daemon.live.snapshots import PartitionSnapshot, SnapshotStore
from lavad.daemon.replay import replay
from lavad.daemon.shadow.compare import empty_hosts_difference, mean_with_ci, t975
from lavad.daemon.shadow.engine import (
    ADVICE_PREFIX,
    FollowedPool,
    ShadowPool,
    shadow_engine,
    shadow_of,
    without_advice,
)
from lavad.daemon.shadow.replay import ShadowResult, shadow_replay
from lavad.streams.adapters import open_trace
from lavad.streams.codec import encode
from lavad.streams.schema import (
    Decision,
    Event,
    HostUp,
    Placement,
    VmExit,
    VmPlaced,
    VmRequest,
)


@pytest.fixture(scope="module")
def lava_shadow() -> tuple[ShadowResult, list[bytes], list[Event]]:
    """A First Fit stream of the whole slice through shadow mode with LAVA."""
    settings = fixed_pool_settings()
    stream = firstfit_stream(settings)
    sink = io.BytesIO()
    result = shadow_replay(
        iter(stream),
        engine_config(settings, "lava"),
        end_time=slice_end_time(),
        decisions_out=sink,
        common_pool=False,
    )
    return result, sink.getvalue().splitlines(), stream


def test_the_stream_is_first_fits_placements(
    lava_shadow: tuple[ShadowResult, list[bytes], list[Event]],
) -> None:
    _, _, stream = lava_shadow
    placed = [e for e in stream if isinstance(e, VmPlaced)]
    requests = [e for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest)]
    assert len(placed) == len(requests)  # the 440 hosts take every request
    # First Fit: the first request goes to the lowest-numbered host.
    assert placed[0].host_id == "default/h00000"
    assert {p.vm_id for p in placed} == {r.vm_id for r in requests}
    assert not any(isinstance(e, VmRequest) for e in stream)


def test_lavad_side_equals_a_plain_lava_replay(
    lava_shadow: tuple[ShadowResult, list[bytes], list[Event]],
) -> None:
    result, advice, _ = lava_shadow
    settings = fixed_pool_settings()
    sink = io.BytesIO()
    plain = replay(
        open_trace(AZURE_SLICE, seed=0).events(),
        engine_config(settings, "lava"),
        end_time=slice_end_time(),
        decisions_out=sink,
    )
    assert metrics(result.lavad.pools["default"]) == metrics(plain.pools["default"])
    assert result.lavad.decisions == plain.decisions
    expected = [orjson.loads(line) for line in sink.getvalue().splitlines()]
    got = [orjson.loads(line) for line in advice]
    assert len(got) == len(expected) > 40_000
    assert all(d["decision_id"].startswith(ADVICE_PREFIX) for d in got)
    assert all(d["explanation"]["advice"] is True for d in got)
    assert [without_advice(d) for d in got] == expected


def test_actual_side_equals_a_plain_firstfit_replay(
    lava_shadow: tuple[ShadowResult, list[bytes], list[Event]],
) -> None:
    result, _, _ = lava_shadow
    plain = replay(
        open_trace(AZURE_SLICE, seed=0).events(),
        engine_config(fixed_pool_settings(), "firstfit"),
        end_time=slice_end_time(),
    )
    assert metrics(result.actual.pools["default"]) == metrics(plain.pools["default"])
    assert result.actual.series == plain.series


def test_agreement_and_difference_are_measured(
    lava_shadow: tuple[ShadowResult, list[bytes], list[Event]],
) -> None:
    result, _, stream = lava_shadow
    agreement = result.agreement["default"]
    assert agreement["compared"] == sum(isinstance(e, VmPlaced) for e in stream)
    assert 0 < agreement["same_host"] < agreement["compared"]
    assert agreement["class_compared"] == agreement["compared"]
    assert agreement["same_host"] <= agreement["same_class"] < agreement["compared"]
    diff = result.difference["default"]
    actual = result.actual.pools["default"]
    assert diff["samples"] == len(diff["series"]) > 5
    # The sampled difference tracks the time-weighted one.
    lavad = result.lavad.pools["default"]["empty_hosts_pct"]
    assert diff["mean_pp"] == pytest.approx(lavad - actual["empty_hosts_pct"], abs=0.5)


def _small_stream() -> list[Event]:
    def placed(t: float, vm: str, host: str) -> VmPlaced:
        return VmPlaced(t, "p", vm, host, cores=8.0, memory_gib=16.0)

    return [
        HostUp(0.0, "p", "p/a", cores=16.0, memory_gib=64.0),
        HostUp(0.0, "p", "p/b", cores=16.0, memory_gib=64.0),
        placed(10.0, "vm1", "p/b"),
        # Requested, then placed a little later by the existing scheduler.
        VmRequest(20.0, "p", "vm2", cores=8.0, memory_gib=16.0),
        placed(25.0, "vm2", "p/a"),
        # Requested and never placed: a failure of the existing scheduler.
        VmRequest(30.0, "p", "vm3", cores=8.0, memory_gib=16.0),
        VmExit(40.0, "p", "vm3"),
        VmExit(50.0, "p", "vm1"),
    ]


def _small_config() -> Any:
    settings = fixed_pool_settings(hosts=0)
    settings = settings.model_copy(
        update={"hosts": settings.hosts.model_copy(update={"source": "trace"})}
    )
    return settings.engine_config("bestfit", trace_has_hosts=True)


def test_requests_the_existing_scheduler_never_placed_are_its_failures() -> None:
    engine = shadow_engine(_small_config())
    out: list[Placement] = []
    for event in _small_stream():
        handled = engine.handle(event, event.time)
        assert handled.rejection is None
        out.extend(d for d in handled.decisions if isinstance(d, Placement))
    sides = shadow_of(engine).sides(engine, 60.0)["p"]
    actual, lavad = sides["actual"], sides["lavad"]
    assert actual["requests"] == lavad["requests"] == 3
    assert actual["placed"] == 2 and actual["placement_failures"] == 1
    assert lavad["placed"] == 3 and lavad["placement_failures"] == 0
    assert sides["agreement"]["compared"] == 2
    assert sides["agreement"]["lavad_only"] == 1  # vm3: lavad placed it, the actual never did
    # Each VM got one advice, none a placement id.
    assert [d.vm_id for d in out] == ["vm1", "vm2", "vm3"]
    assert all(d.decision_id.startswith("advice/placement/") for d in out)
    assert out[0].explanation["actual_host_id"] == "p/b"
    pool = engine.pools["p"]
    assert isinstance(pool, ShadowPool) and isinstance(pool.actual, FollowedPool)
    assert pool.actual.counters["exit_never_placed"] == 1
    assert not pool.advised and not pool.actual.awaited


def test_an_event_the_actual_cluster_refuses_is_refused_for_both_sides() -> None:
    engine = shadow_engine(_small_config())
    for event in _small_stream()[:3]:
        engine.handle(event, event.time)
    handled = engine.handle(
        VmPlaced(11.0, "p", "vm9", "p/nowhere", cores=1.0, memory_gib=1.0), 11.0
    )
    assert handled.rejection is not None and "unknown host" in handled.rejection.reason
    assert handled.decisions == []
    assert "vm9" not in engine.pools["p"].cluster.vms
    assert "vm9" not in engine.pools["p"].refused


def test_a_defect_on_the_actual_side_quarantines_the_pool_on_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shell reads lavad's side: a pool the actual side quarantined must show there."""
    engine = shadow_engine(dataclasses.replace(_small_config(), on_defect="quarantine"))
    follower = shadow_of(engine).follower

    def failing(pool: PoolRuntime, event: VmPlaced, now: float) -> list[Decision]:
        raise KeyError("injected on the actual side")

    stream = _small_stream()
    for event in stream[:3]:
        assert engine.handle(event, event.time).rejection is None
    monkeypatch.setitem(follower._handlers, VmPlaced, failing)
    handled = engine.handle(stream[4], stream[4].time)  # vm2 placed by the scheduler
    assert handled.rejection is not None and handled.rejection.stage == "defect"
    assert "KeyError: 'injected on the actual side'" in handled.rejection.reason
    quarantine = follower.pools["p"].quarantine
    assert quarantine is not None and engine.pools["p"].quarantine == quarantine
    assert engine.take_defects() == [("p", quarantine)]
    later = engine.handle(stream[5], stream[5].time).rejection
    assert later is not None and later.stage == "quarantined"


def test_after_a_defect_on_each_side_lavads_side_holds_the_actual_sides_husk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Snapshots write lavad's side with the actual side attached: after both sides'
    defects, what is attached must be the actual side's husk, not its failed state."""
    engine = shadow_engine(dataclasses.replace(_small_config(), on_defect="quarantine"))
    follower = shadow_of(engine).follower
    stream = _small_stream()
    for event in stream[:3]:
        assert engine.handle(event, event.time).rejection is None

    def failing(*_: object) -> list[Decision]:
        raise KeyError("injected")

    # lavad's side fails first (a request), then the actual side (the scheduler's placement).
    monkeypatch.setitem(engine._handlers, VmRequest, failing)
    monkeypatch.setitem(follower._handlers, VmPlaced, failing)
    for event in stream[3:5]:
        handled = engine.handle(event, event.time)
        assert handled.rejection is not None and handled.rejection.stage == "defect"
    pool, actual = engine.pools["p"], follower.pools["p"]
    assert isinstance(pool, ShadowPool) and pool.quarantine is not None
    assert actual.quarantine is not None and not actual.cluster.vms
    assert pool.actual is actual


def test_a_pool_the_actual_side_cannot_open_is_refused_on_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = shadow_engine(dataclasses.replace(_small_config(), on_defect="quarantine"))
    follower = shadow_of(engine).follower

    def failing(pool: PoolRuntime) -> PoolRuntime:
        raise MemoryError("injected while opening the actual side")

    monkeypatch.setattr(follower.strategy, "open_pool", failing)
    stream = _small_stream()
    handled = engine.handle(stream[0], stream[0].time)
    assert handled.rejection is not None and handled.rejection.stage == "defect"
    assert "MemoryError: injected while opening the actual side" in handled.rejection.reason
    assert "p" not in engine.pools and "p" not in follower.pools
    ((pool, quarantine),) = engine.take_defects()
    assert pool == "p" and engine.quarantined() == {"p": quarantine}
    later = engine.handle(stream[1], stream[1].time).rejection
    assert later is not None and later.stage == "quarantined"


def test_a_snapshot_restores_both_sides(tmp_path: Path) -> None:
    settings = fixed_pool_settings()
    config = engine_config(settings, "lava")
    stream = firstfit_stream(settings, limit=12_000)
    whole = shadow_engine(config)
    expected = [encode(d) for e in stream for d in whole.handle(e, e.time).decisions]

    first = shadow_engine(config)
    got = [encode(d) for e in stream[:6_000] for d in first.handle(e, e.time).decisions]
    store = SnapshotStore(tmp_path, "g")
    store.save(PartitionSnapshot(0, first.fingerprint, {}, dict(first.pools)))
    second = shadow_engine(config)
    snapshot = store.load(0, second.fingerprint)
    assert snapshot is not None
    second.adopt_pools(snapshot.pools)
    got += [encode(d) for e in stream[6_000:] for d in second.handle(e, e.time).decisions]
    assert got == expected
    end = stream[-1].time
    assert shadow_of(second).sides(second, end) == shadow_of(whole).sides(whole, end)


def test_a_plain_engines_snapshot_is_not_a_shadow_one() -> None:
    config = engine_config(fixed_pool_settings(), "lava")
    from lavad.core.engine import Engine  # noqa: PLC0415

    assert shadow_engine(config).fingerprint != Engine(config).fingerprint


def test_batch_means_interval_by_hand() -> None:
    assert t975(1) == 12.706 and t975(9) == 2.262 and t975(100) == 1.96
    values = [float(i % 4) for i in range(40)]  # batches of 4: each mean 1.5
    stats = mean_with_ci(values, batches=10)
    assert stats["mean"] == 1.5 and stats["ci95"] == [1.5, 1.5]
    ramp = [float(i) for i in range(20)]  # 10 batches of 2: means 0.5, 2.5, ..., 18.5
    stats = mean_with_ci(ramp, batches=10)
    means = [0.5 + 2 * k for k in range(10)]
    half = 2.262 * math.sqrt(sum((m - 9.5) ** 2 for m in means) / 9) / math.sqrt(10)
    assert stats["ci95"] == pytest.approx([9.5 - half, 9.5 + half])
    assert mean_with_ci(ramp[:15], batches=10)["ci95"] is None  # batches of 1


def test_difference_pairs_the_same_ticks() -> None:
    class P:
        def __init__(self, time: float, empty: float) -> None:
            self.time, self.empty_hosts_pct = time, empty

    actual = [P(0.0, 10.0), P(3600.0, 20.0), P(7200.0, 30.0)]
    lavad = [P(0.0, 12.0), P(3600.0, 21.0), P(10_800.0, 50.0)]
    diff = empty_hosts_difference(actual, lavad, 0.0, 7200.0)
    assert diff["series"] == [
        {"time": 0.0, "difference_pp": 2.0},
        {"time": 3600.0, "difference_pp": 1.0},
    ]
    assert diff["mean_pp"] == 1.5


def test_lavad_replay_with_shadow_enabled_prints_both_sides(tmp_path: Path) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from lavad.daemon.cli import app  # noqa: PLC0415

    stream = tmp_path / "firstfit.jsonl"
    stream.write_bytes(
        b"".join(encode(e) + b"\n" for e in firstfit_stream(fixed_pool_settings(), 6_000))
    )
    metrics_json = tmp_path / "shadow.json"
    result = CliRunner().invoke(
        app,
        ["replay", str(stream), "--policy", "bestfit", "--metrics-json", str(metrics_json),
         "--config", str(Path(__file__).resolve().parents[1] / "config" / "lavad.toml")],
        env={
            "COLUMNS": "220",
            "LAVAD_SHADOW__ENABLED": "true",
            "LAVAD_HOSTS__SOURCE": "shape",
            "LAVAD_HOSTS__COUNT": "440",
            "LAVAD_HOSTS__GROW_ON_DEMAND": "false",
            "LAVAD_METRICS__WARMUP_S": "0",
        },
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "actual (vm.placed)" in result.output and "lavad (bestfit)" in result.output
    assert "VMs placed by both sides" in result.output
    document = orjson.loads(metrics_json.read_bytes())
    assert document["mode"] == "shadow"
    assert set(document["sides"]) == {"actual", "lavad"}
    assert document["agreement"]["default"]["same_class_rate"] is None  # Best Fit: no classes


def test_the_tool_announces_hosts_opened_on_demand_and_keeps_unplaced_requests() -> None:
    from lavad.daemon.shadow.placed import PlacedCounts, placed_events  # noqa: PLC0415

    settings = fixed_pool_settings(hosts=1)
    settings = settings.model_copy(
        update={"hosts": settings.hosts.model_copy(update={"cores": 16.0, "memory_gib": 64.0})}
    )
    growing = settings.model_copy(
        update={"hosts": settings.hosts.model_copy(update={"grow_on_demand": True})}
    )
    requests = [
        VmRequest(1.0, "p", "vm1", cores=12.0, memory_gib=8.0),
        VmRequest(2.0, "p", "vm2", cores=12.0, memory_gib=8.0),  # no room on the one host
        VmRequest(3.0, "p", "big", cores=64.0, memory_gib=8.0),  # larger than any host
    ]
    counts = PlacedCounts()
    fixed = list(placed_events(requests, engine_config(settings, "firstfit"), counts))
    assert [type(e).__name__ for e in fixed] == ["VmPlaced", "VmRequest", "VmRequest"]
    assert counts.written == {"vm.placed": 1, "vm.request": 2}
    grown = list(placed_events(requests, engine_config(growing, "firstfit")))
    assert [type(e).__name__ for e in grown] == ["VmPlaced", "HostUp", "VmPlaced", "VmRequest"]
    host_up, placed = grown[1], grown[2]
    assert isinstance(host_up, HostUp) and isinstance(placed, VmPlaced)
    assert host_up.host_id == placed.host_id == "p/auto00000"
    assert (host_up.cores, host_up.memory_gib) == (16.0, 64.0)


@pytest.mark.shared_data
def test_timer_decisions_on_an_events_time_come_out_in_one_order(shared_data: Path) -> None:
    """The live intake calls handle only (and advance at a batch's end); a replay advances
    first. A LAVA deadline falling exactly on an event's time (Azure V1 times are on a
    300 s grid, its class bounds x 1.1 too) came out after that event's placement live and
    before it in a replay: found by the dev split's shadow run over Kafka."""
    import itertools  # noqa: PLC0415

    from lavad.core.engine import Engine  # noqa: PLC0415
    from lavad.streams.codec import BadRecord  # noqa: PLC0415

    config = engine_config(fixed_pool_settings(hosts=950), "lava")
    trace = open_trace(shared_data / "azure-v1-vms", seed=0)
    events = [e for e in itertools.islice(trace.events(), 70_000) if not isinstance(e, BadRecord)]
    sink = io.BytesIO()
    replay(iter(events), config, decisions_out=sink)
    engine = Engine(config)
    live: list[bytes] = []
    for start in range(0, len(events), 2_000):
        batch = events[start : start + 2_000]
        for event in batch:
            live.extend(encode(d) for d in engine.handle(event, event.time).decisions)
        live.extend(encode(d) for d in engine.advance(batch[-1].time))
    replayed = sink.getvalue().splitlines()
    assert len(replayed) > 40_000
    assert live == replayed
