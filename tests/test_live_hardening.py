"""Hardening against a real broker: hostile records never stop the daemon or lose a decision.

* a poison pill (a schema-valid request at time 1e20, or a record that is
  not UTF-8) is dead-lettered while the daemon keeps answering and deciding
  (a child process, so a hang is bounded by the test, not by the test
  runner);
* a record too large to be a dead letter is cut to the bound, and the
  daemon goes on;
* a refused event publishes the decisions its timers made on the way, as a
  replay does (before the issue the live daemon dropped them);
* a defect in one pool quarantines that pool: its records are dead-lettered,
  the other pool decides as a replay does, and the quarantine outlives a
  restart;
* a fuzz of a few hundred generated records of every kind, valid and not:
  the daemon stays ready, every record is decided or dead-lettered, and the
  decisions equal an in-process replay's.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_support import (
    NAMES,
    DaemonProcess,
    DefectAt,
    OpeningFails,
    by_pool,
    create_topics,
    live_settings,
    pool_events,
    produce,
    produce_raw,
    read_topic,
    replay_in_process,
    wait_for,
)

from lavad.core.engine import Engine, EngineConfig, EngineStrategy
from lavad.daemon.live import shell
from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.replay import replay
from lavad.daemon.settings import Settings
from lavad.streams.codec import SchemaError, decode_event, encode
from lavad.streams.kafka.deadletter import header_map
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.schema import Event, HostDrain, HostUp, VmExit, VmPlaced, VmRequest

pytestmark = pytest.mark.kafka


# A schema-valid request at a time no clock reaches, and a request whose VM id
# holds a byte that is not UTF-8 (the decoder once let that error through the
# intake, which stopped the daemon on the record, again at every restart).
FAR_FUTURE_PILL = encode(
    VmRequest(time=1e20, pool="default", vm_id="pill", cores=1.0, memory_gib=1.0)
)
NOT_UTF8_PILL = encode(
    VmRequest(time=1.0, pool="default", vm_id="pill", cores=1.0, memory_gib=1.0)
).replace(b'"pill"', b'"pi\xffll"')


@pytest.mark.parametrize(
    ("pill", "stage", "reason"),
    [
        # Its record was produced now: the live bound on the record's timestamp
        # refuses it before the engine's on the pool's clock (test_engine_hardening).
        (FAR_FUTURE_PILL, "time", "live.max_ahead_of_record_s"),
        (NOT_UTF8_PILL, "decode", "not valid UTF-8"),
    ],
    ids=["far-future", "not-utf8"],
)
async def test_the_poison_pill_is_dead_lettered_and_the_daemon_stays_live(
    broker: EmbeddedBroker, tmp_path: Path, pill: bytes, stage: str, reason: str
) -> None:
    bootstrap = broker.bootstrap_servers
    settings = live_settings(bootstrap, tmp_path / "expected")
    events = pool_events(["default"], 1_500)
    expected = replay_in_process(settings, events)["default"]
    await create_topics(bootstrap)
    half = len(events) // 2
    await produce(bootstrap, events[:half])
    await produce_raw(bootstrap, NAMES.vm_events, [(b"default", pill)])
    await produce(bootstrap, events[half:])
    daemon = DaemonProcess(bootstrap, tmp_path / "snapshots", tmp_path / "daemon.log")
    try:
        await daemon.wait_status("/readyz", 200, 60)
        placements = await read_topic(bootstrap, NAMES.placements, at_least=len(expected))
        # Still answering after it consumed the pill and everything behind it.
        assert await daemon.status("/healthz") == 200
    finally:
        assert daemon.stop() == 0
    assert [record.value for record in placements] == expected
    (dead,) = await read_topic(bootstrap, NAMES.dead_letters, at_least=1, timeout_s=10)
    headers = header_map(dead.headers)
    assert headers["lavad.stage"] == stage
    assert reason in headers["lavad.reason"]
    assert dead.value == pill


async def test_a_record_too_large_for_a_dead_letter_is_cut_to_fit_and_the_daemon_goes_on(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Kafka refuses a record past the dead-letter topic's max.message.bytes on every
    retry, which would stop the daemon's publishing for good; the embedded broker takes
    any size, so what is asserted is the dead letter's size and that nothing stalls."""
    bootstrap = broker.bootstrap_servers
    settings = live_settings(bootstrap, tmp_path / "snapshots")
    events = pool_events(["default"], 200)
    expected = replay_in_process(settings, events)["default"]
    huge = b'{"v":1,"pad":"' + b"x" * 2_000_000 + b'"}'
    await create_topics(bootstrap)
    await produce_raw(bootstrap, NAMES.vm_events, [(b"default", huge)], max_request_size=3 << 20)
    await produce(bootstrap, events)
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await wait_for(lambda: daemon.records_processed >= 1 + len(events), 60, "all records")
        placements = await read_topic(bootstrap, NAMES.placements, at_least=len(expected))
        (dead,) = await read_topic(bootstrap, NAMES.dead_letters, at_least=1, timeout_s=10)
    finally:
        stop.set()
        await task
    assert [record.value for record in placements] == expected
    headers = header_map(dead.headers)
    assert headers["lavad.stage"] == "decode"
    assert "larger than the 1048576-byte limit" in headers["lavad.reason"]
    assert headers["lavad.truncated"] == f"value={len(huge)} key=7"
    assert dead.key == b"default"
    assert huge.startswith(dead.value)
    size = len(dead.key) + len(dead.value) + sum(len(n) + len(c) for n, c in dead.headers)
    assert size <= settings.kafka.dead_letter_max_bytes


def _drain_then_unknown_exit() -> list[Event]:
    """h0 drains with five VMs; an exit of an unknown VM comes after the first three moved."""
    events: list[Event] = [
        HostUp(time=0.0, pool="m", host_id="h0", cores=16.0, memory_gib=64.0),
        HostUp(time=0.0, pool="m", host_id="h1", cores=64.0, memory_gib=256.0),
    ]
    events += [
        VmPlaced(time=0.0, pool="m", vm_id=f"v{i}", host_id="h0", cores=1.0, memory_gib=2.0)
        for i in range(5)
    ]
    events += [
        HostDrain(time=0.0, pool="m", host_id="h0"),
        VmExit(time=1_300.0, pool="m", vm_id="ghost"),
    ]
    return events


async def test_a_refused_event_still_publishes_the_migrations_its_timers_made(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    settings = live_settings(bootstrap, tmp_path)
    events = _drain_then_unknown_exit()
    sink = io.BytesIO()
    replay(events, live_engine_config(settings), decisions_out=sink)
    expected = [
        line for line in sink.getvalue().splitlines() if orjson.loads(line)["kind"] == "migration"
    ]
    moves = [orjson.loads(line) for line in expected if b'"action":"migrate"' in line]
    assert [(m["vm_id"], m["time"]) for m in moves][3:] == [("v3", 1_200.0), ("v4", 1_200.0)]
    await create_topics(bootstrap)
    await produce(bootstrap, events)
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await wait_for(lambda: daemon.records_processed >= len(events), 60, "all events")
        migrations = await read_topic(bootstrap, NAMES.migrations, at_least=len(expected))
        dead = await read_topic(bootstrap, NAMES.dead_letters, at_least=1, timeout_s=10)
    finally:
        stop.set()
        await task
    assert [record.value for record in migrations] == expected
    assert [header_map(record.headers)["lavad.stage"] for record in dead] == ["engine"]


async def _run_until(daemon: LiveDaemon, processed: int) -> None:
    """Run ``daemon`` until it has processed ``processed`` records, then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await wait_for(lambda: daemon.records_processed >= processed, 60, "the records")
    finally:
        stop.set()
        await task


def _east_and_west(
    bootstrap: str, tmp_path: Path
) -> tuple[Settings, EngineConfig, list[Event], list[Event]]:
    """The live settings, their engine's configuration, two pools' events of the bundled
    slice, and east's among them."""
    settings = live_settings(bootstrap, tmp_path / "snapshots")
    events = pool_events(["east", "west"], 600)
    east = [event for event in events if event.pool == "east"]
    return settings, live_engine_config(settings), events, east


async def _run_live_with(
    settings: Settings,
    config: EngineConfig,
    strategy: Callable[[], EngineStrategy],
    events: list[Event],
    monkeypatch: pytest.MonkeyPatch,
) -> LiveDaemon:
    """A live daemon whose engine runs ``strategy()``, through ``events`` (produced
    first), stopped once it processed them all; its gauges refreshed."""

    def engine(config: EngineConfig, given: EngineStrategy | None) -> Engine:
        assert given is None
        return Engine(config, strategy())

    bootstrap = settings.kafka.bootstrap_servers
    await create_topics(bootstrap)
    await produce(bootstrap, events)
    monkeypatch.setattr(shell, "Engine", engine)
    daemon = LiveDaemon(settings, config)
    monkeypatch.undo()
    await _run_until(daemon, len(events))
    daemon.refresh_gauges()
    return daemon


async def test_a_defect_quarantines_its_pool_and_the_quarantine_outlives_a_restart(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = broker.bootstrap_servers
    settings, config, events, east = _east_and_west(bootstrap, tmp_path)
    failing = [event for event in east if isinstance(event, VmRequest)][100]
    after = len(east) - east.index(failing) - 1
    # The replay of the same stream, with the same defect, in process.
    sink, dead_sink = io.BytesIO(), io.BytesIO()
    defective = Engine(config, DefectAt("east", failing.vm_id))
    replay(events, config, decisions_out=sink, dead_letters_out=dead_sink, engine=defective)
    expected = by_pool(sink.getvalue().splitlines())
    assert len(dead_sink.getvalue().splitlines()) == 1 + after

    # The defect also leaves a value the snapshot codec refuses: the quarantined
    # pool's husk is what is snapshotted, so the daemon stops cleanly and restarts.
    daemon = await _run_live_with(
        settings,
        config,
        lambda: DefectAt("east", failing.vm_id, leaves=object()),
        events,
        monkeypatch,
    )
    assert daemon.health() == {"falling_behind": False, "pools_quarantined": True}
    assert daemon.telemetry.registry.get_sample_value("lavad_pools_quarantined") == 1.0
    placements = await read_topic(
        bootstrap, NAMES.placements, at_least=sum(map(len, expected.values()))
    )
    assert by_pool(record.value for record in placements) == expected
    dead = await read_topic(bootstrap, NAMES.dead_letters, at_least=1 + after, timeout_s=10)
    stages = [header_map(record.headers)["lavad.stage"] for record in dead]
    assert stages == ["defect"] + ["quarantined"] * after
    assert dead[0].value == encode(failing)
    assert "RuntimeError: injected defect" in header_map(dead[0].headers)["lavad.reason"]

    # Restarted from its snapshots (no defect now): east stays quarantined, west decides.
    end = events[-1].time
    late = [
        VmRequest(time=end + 1.0, pool="east", vm_id="late-east", cores=1.0, memory_gib=1.0),
        VmRequest(time=end + 1.0, pool="west", vm_id="late-west", cores=1.0, memory_gib=1.0),
    ]
    await produce(bootstrap, late)
    restarted = LiveDaemon(settings, config)
    await _run_until(restarted, len(late))
    assert restarted.health()["pools_quarantined"]
    placed = await read_topic(bootstrap, NAMES.placements, at_least=len(placements) + 1)
    # A read of the whole topic interleaves its partitions in no set order.
    assert len(placed) == len(placements) + 1
    vm_ids = [orjson.loads(record.value)["vm_id"] for record in placed]
    assert [vm_id for vm_id in vm_ids if vm_id.startswith("late-")] == ["late-west"]
    dead = await read_topic(bootstrap, NAMES.dead_letters, at_least=2 + after, timeout_s=10)
    assert header_map(dead[-1].headers)["lavad.stage"] == "quarantined"
    assert dead[-1].value == encode(late[0])


async def test_a_pool_whose_opening_fails_is_refused_live_and_opened_after_a_restart(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = broker.bootstrap_servers
    settings, config, events, east = _east_and_west(bootstrap, tmp_path)
    sink = io.BytesIO()
    failing = Engine(config, OpeningFails("east", 1))
    replay(events, config, decisions_out=sink, dead_letters_out=io.BytesIO(), engine=failing)
    expected = by_pool(sink.getvalue().splitlines())
    assert list(expected) == ["west"]

    daemon = await _run_live_with(
        settings, config, lambda: OpeningFails("east", 1), events, monkeypatch
    )
    assert daemon.health()["pools_quarantined"]
    assert daemon.telemetry.registry.get_sample_value("lavad_pools_quarantined") == 1.0
    # Its refusal goes with its partition: the name stays with it.
    assert "east" in daemon.partitions.pool_partition
    placements = await read_topic(bootstrap, NAMES.placements, at_least=len(expected["west"]))
    assert by_pool(record.value for record in placements) == expected
    dead = await read_topic(bootstrap, NAMES.dead_letters, at_least=len(east), timeout_s=10)
    stages = [header_map(record.headers)["lavad.stage"] for record in dead]
    assert stages == ["defect"] + ["quarantined"] * (len(east) - 1)
    assert "opening the pool" in header_map(dead[0].headers)["lavad.reason"]

    # Restarted (no defect now): nothing of east was snapshotted, so it opens and places.
    late = VmRequest(
        time=events[-1].time + 1.0, pool="east", vm_id="late-east", cores=1.0, memory_gib=1.0
    )
    await produce(bootstrap, [late])
    restarted = LiveDaemon(settings, config)
    await _run_until(restarted, 1)
    assert not restarted.health()["pools_quarantined"]
    placed = await read_topic(bootstrap, NAMES.placements, at_least=len(placements) + 1)
    assert "late-east" in [orjson.loads(record.value)["vm_id"] for record in placed]


# ------------------------------------------------------------------- fuzz

POOLS = ["f0", "f1"]
VMS = [f"v{i}" for i in range(8)]
HOSTS = [f"h{i}" for i in range(3)]

# Ways to spoil a valid record: each is refused at decoding or by the engine.
SPOILERS: list[tuple[str, Any]] = [
    ("cores", True),
    ("cores", "8"),
    ("cores", -1.0),
    ("time", 1e20),
    ("time", "soon"),
    ("vm_id", "bad\x00id"),
    ("host_id", ""),
    ("tenant", "t" * 10_000),
    ("v", 2),
    ("type", "vm.teleport"),
    ("pool", None),
]


@st.composite
def records(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    """A stream of (key, value) records: mostly valid events of every kind, some spoiled."""
    # Every pool starts with its hosts up, so most later events mean something.
    out: list[tuple[bytes, bytes]] = [
        (
            pool.encode(),
            orjson.dumps(
                {"v": 1, "type": "host.up", "time": 0.0, "pool": pool, "host_id": host}
                | {"cores": 32, "memory_gib": 128}
            ),
        )
        for pool in POOLS
        for host in HOSTS
    ]
    clock = 0.0
    for _ in range(draw(st.integers(150, 250))):
        clock += draw(st.sampled_from([60.0, 0.0, 1.0, 600.0, 3_600.0]))
        # Now and then a record arrives late: a little (handled at the pool's
        # clock) or more than live.max_behind_s (refused).
        late = draw(st.sampled_from([0.0] * 8 + [30.0, 7_200.0]))
        pool = draw(st.sampled_from(POOLS))
        kind = draw(
            st.sampled_from(
                ["vm.request", "vm.exit"] * 4
                + ["usage", "vm.placed", "host.up", "host.down", "host.drain"]
            )
        )
        record: dict[str, Any] = {
            "v": 1,
            "type": kind,
            "time": max(0.0, clock - late),
            "pool": pool,
        }
        vm, host = draw(st.sampled_from(VMS)), draw(st.sampled_from(HOSTS))
        if kind in ("vm.request", "vm.placed"):
            record |= {
                "vm_id": vm,
                "cores": draw(st.sampled_from([1, 2.5, 8, 64])),
                "memory_gib": draw(st.sampled_from([1, 4.0, 32])),
            }
            if kind == "vm.placed":
                record["host_id"] = host
        elif kind == "vm.exit":
            record["vm_id"] = vm
        elif kind == "host.up":
            record |= {"host_id": host, "cores": 32, "memory_gib": 128}
        elif kind == "usage":
            sample = {"mean": 0.3, "peak": 0.6, "samples": 12}
            record |= {"vm_id": vm, "interval_s": 300, "cpu": sample}
        else:
            record["host_id"] = host
        # (The minimal draws, which hypothesis tries first, give valid records.)
        if draw(st.integers(0, 9)) == 9:
            field, value = draw(st.sampled_from(SPOILERS))
            record[field] = value
        value = orjson.dumps(record)
        if draw(st.integers(0, 39)) == 39:
            value = value[: len(value) // 2]  # truncated: not JSON
        topic_key = pool.encode()
        out.append((topic_key, value))
    return out


def _expected(
    settings: Any, stream: list[tuple[bytes, bytes]]
) -> tuple[dict[tuple[str, str], list[bytes]], int]:
    """An in-process replay of the decodable records: decisions by (pool, kind), dead letters."""
    events: list[Event] = []
    undecodable = 0
    for _, value in stream:
        try:
            events.append(decode_event(value))
        except SchemaError:
            undecodable += 1
    sink = io.BytesIO()
    result = replay(events, live_engine_config(settings), decisions_out=sink)
    return _by_pool_and_kind(sink.getvalue().splitlines()), undecodable + result.dead_letters.get(
        "rejected", 0
    )


def _by_pool_and_kind(lines: list[bytes]) -> dict[tuple[str, str], list[bytes]]:
    out: dict[tuple[str, str], list[bytes]] = {}
    for line in lines:
        decision = orjson.loads(line)
        out.setdefault((decision["pool"], decision["kind"]), []).append(line)
    return out


KINDS = {
    "placement": NAMES.placements,
    "migration": NAMES.migrations,
    "reprediction": NAMES.repredictions,
    "limit": NAMES.limits,
}


async def _fuzz_once(stream: list[tuple[bytes, bytes]], tmp_path: Path) -> None:
    broker = EmbeddedBroker.start()
    try:
        bootstrap = broker.bootstrap_servers
        settings = live_settings(bootstrap, tmp_path)
        expected, dead_expected = _expected(settings, stream)
        # The stream exercises both outcomes (a spoiled record in ten, decisions from the rest).
        assert dead_expected > 0
        assert sum(len(lines) for lines in expected.values()) > 0
        await create_topics(bootstrap)
        await produce_raw(bootstrap, NAMES.vm_events, stream)
        daemon = LiveDaemon(settings, live_engine_config(settings))
        stop = asyncio.Event()
        task = asyncio.create_task(daemon.run(stop))
        published: list[bytes] = []
        try:
            await wait_for(lambda: daemon.records_processed >= len(stream), 60, "all records")
            assert all(daemon.readiness().values()), daemon.readiness()
            for kind, topic in KINDS.items():
                count = sum(len(v) for (_, k), v in expected.items() if k == kind)
                records = await read_topic(bootstrap, topic, at_least=count, timeout_s=30)
                published += [record.value for record in records]
            dead = await read_topic(bootstrap, NAMES.dead_letters, at_least=dead_expected)
            assert all(daemon.readiness().values()), daemon.readiness()
        finally:
            stop.set()
            await task
        got = _by_pool_and_kind(published)
        for key in sorted(set(expected) | set(got)):
            assert got.get(key, []) == expected.get(key, []), f"pool and kind {key}"
        assert len(dead) == dead_expected
        for record in dead:
            assert header_map(record.headers)["lavad.reason"]
    finally:
        broker.close()


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(stream=records())
def test_fuzzed_records_are_each_decided_or_dead_lettered(
    stream: list[tuple[bytes, bytes]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    asyncio.run(_fuzz_once(stream, tmp_path_factory.mktemp("fuzz")))
