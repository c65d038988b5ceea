"""The live shell against a real Kafka-protocol broker (Tansu) on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import aiohttp
import orjson
import pytest
from live_support import (
    AZURE_SLICE,
    NAMES,
    by_pool,
    create_topics,
    live_settings,
    pool_events,
    produce,
    produce_raw,
    read_topic,
    replay_in_process,
    two_pool_events,
    wait_for,
    with_section,
)
from prometheus_client.parser import text_string_to_metric_families
from replicas_support import slice_events

from lavad.daemon.live.shell import LiveDaemon, StartupError, live_engine_config
from lavad.daemon.settings import Settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.kafka.deadletter import header_map
from lavad.streams.kafka.embedded import EmbeddedBroker, free_port
from lavad.streams.schema import (
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
    UsageSample,
)

pytestmark = pytest.mark.kafka
GOOGLE_LIMITS_SLICE = Path(__file__).resolve().parents[1] / "data" / "google-2011-gcd-limits-slice"


async def _serve(daemon: LiveDaemon, stop: asyncio.Event) -> asyncio.Task[None]:
    task = asyncio.create_task(daemon.run(stop))
    await wait_for(lambda: all(daemon.readiness().values()), 30, "the daemon to be ready")
    return task


async def _consume_all(broker: EmbeddedBroker, settings: Settings, events: Sequence[Event]) -> None:
    """Publish ``events``, run a daemon until it has processed them all, stop it."""
    await create_topics(broker.bootstrap_servers)
    await produce(broker.bootstrap_servers, events)
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = await _serve(daemon, stop)
    await wait_for(lambda: daemon.records_processed >= len(events), 60, "all events")
    stop.set()
    await task


async def _placed_as_replayed(
    broker: EmbeddedBroker, settings: Settings, events: Sequence[Event]
) -> dict[str, list[bytes]]:
    """The daemon's placements of ``events``, per pool, held equal to an in-process replay's."""
    expected = replay_in_process(settings, events)
    await _consume_all(broker, settings, events)
    total = sum(len(lines) for lines in expected.values())
    records = await read_topic(broker.bootstrap_servers, NAMES.placements, at_least=total)
    got = by_pool(record.value for record in records)
    assert set(got) == set(expected)
    for pool, lines in expected.items():
        assert got[pool] == lines, f"pool {pool}: Kafka and in-process decisions differ"
    return got


async def test_kafka_gives_the_decisions_of_an_in_process_replay(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    got = await _placed_as_replayed(broker, settings, two_pool_events(3_000))
    assert set(got) == {"east", "west"}


async def test_each_pool_is_placed_by_its_own_policy_over_kafka(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # LAS places "east"; "west" matches a pattern that gives it Best Fit.
    settings = with_section(
        live_settings(broker.bootstrap_servers, tmp_path),
        "placement",
        policy="las",
        pools={"w*": "bestfit"},
    )
    got = await _placed_as_replayed(broker, settings, two_pool_events(2_000))
    for pool, policy in (("east", "las"), ("west", "bestfit")):
        assert {orjson.loads(line)["policy"] for line in got[pool]} == {policy}


async def test_malformed_records_go_to_dead_letters_and_valid_decisions_are_unaffected(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    events = two_pool_events(1_500)
    expected = replay_in_process(settings, events)
    await create_topics(broker.bootstrap_servers)
    # 1,000 bad records of several kinds, interleaved with the valid stream.
    bad_values = [
        b"not json at all",
        b'{"v": 1, "type": "vm.request", "pool": "east"}',
        b'{"v": 2, "type": "vm.exit", "time": 1.0, "pool": "east", "vm_id": "x"}',
        b'{"v": 1, "type": "vm.teleport", "time": 1.0, "pool": "east"}',
        b'{"v": 1, "type": "vm.exit", "time": 1.0, "pool": "east", "vm_id": "never-seen"}',
    ]
    bad = [(b"east", bad_values[i % len(bad_values)] + b" " * (i // 5 % 2)) for i in range(1_000)]
    half = len(events) // 2
    await produce(broker.bootstrap_servers, events[:half])
    await produce_raw(broker.bootstrap_servers, NAMES.vm_events, bad)
    await produce(broker.bootstrap_servers, events[half:])
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = await _serve(daemon, stop)
    await wait_for(lambda: daemon.records_processed >= len(events) + 1_000, 60, "all records")
    stop.set()
    await task
    dead = await read_topic(broker.bootstrap_servers, NAMES.dead_letters, at_least=1_000)
    assert len(dead) == 1_000
    assert sorted(record.value for record in dead) == sorted(value for _, value in bad)
    stages = {header_map(record.headers)["lavad.stage"] for record in dead}
    # The unknown exit at time 1.0 lands days behind its pool's clock, so it is
    # refused as too late (input.max_behind_s) before its VM is looked up;
    # engine refusals are covered in test_live_hardening.py.
    assert stages == {"decode", "time"}
    for record in dead:
        headers = header_map(record.headers)
        assert headers["lavad.reason"]
        assert headers["lavad.source.topic"] == NAMES.vm_events
        assert int(headers["lavad.source.offset"]) >= 0
    total = sum(len(lines) for lines in expected.values())
    placements = await read_topic(broker.bootstrap_servers, NAMES.placements, at_least=total)
    assert by_pool(record.value for record in placements) == expected


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def _metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name}{labels} not exported")


async def test_readiness_is_false_without_a_broker_while_health_stays_true(
    tmp_path: Path,
) -> None:
    nobody = f"127.0.0.1:{free_port()}"  # nothing listens there
    settings = live_settings(nobody, tmp_path)
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    await wait_for(lambda: daemon.http is not None, 30, "the HTTP server")
    assert daemon.http is not None
    assert (await _get(daemon.http.url + "/healthz"))[0] == 200
    status, body = await _get(daemon.http.url + "/readyz")
    assert status == 503
    checks = orjson.loads(body)["checks"]
    assert checks["broker_reachable"] is False
    assert checks["partitions_assigned"] is False
    stop.set()
    await task


async def test_health_readiness_and_metrics_when_serving(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path, cluster_gauges_s=0.2)
    events = two_pool_events(1_000)
    expected = replay_in_process(settings, events)
    requests = sum(1 for event in events if event.type == "vm.request")
    await create_topics(broker.bootstrap_servers)
    await produce(broker.bootstrap_servers, events)
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = await _serve(daemon, stop)
    await wait_for(lambda: daemon.records_processed >= len(events), 60, "all events")
    assert daemon.http is not None
    url = daemon.http.url
    assert (await _get(url + "/healthz"))[0] == 200
    status, body = await _get(url + "/readyz")
    assert status == 200
    assert orjson.loads(body)["checks"] == {
        "partitions_assigned": True,
        "snapshots_loaded": True,
        "broker_reachable": True,
    }
    await asyncio.sleep(0.5)  # one cluster-gauge refresh
    _, text = await _get(url + "/metrics")
    stop.set()
    await task
    assert _metric(text, "lavad_events_total", type="vm.request") == requests
    placements = sum(len(lines) for lines in expected.values())
    assert _metric(text, "lavad_decisions_total", kind="placement") == placements
    assert _metric(text, "lavad_decision_latency_seconds_count") == placements
    for pool in ("east", "west"):
        assert _metric(text, "lavad_pool_hosts_up", pool=pool) > 0
        empty = _metric(text, "lavad_pool_empty_hosts_ratio", pool=pool)
        assert 0.0 <= empty <= 1.0
    assert _metric(text, "lavad_broker_reachable") == 1.0


def test_lavad_produce_publishes_a_trace_keyed_by_pool(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from lavad.daemon.cli import app  # noqa: PLC0415

    asyncio.run(create_topics(broker.bootstrap_servers))
    monkeypatch.setenv("LAVAD_KAFKA__BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    result = CliRunner().invoke(
        app, ["produce", str(AZURE_SLICE), "--limit", "500", "--speed", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "published 500 records" in result.output
    records = asyncio.run(read_topic(broker.bootstrap_servers, NAMES.vm_events, at_least=500))
    assert len(records) == 500
    assert {record.key for record in records} == {b"default"}
    first = orjson.loads(min(records, key=lambda r: r.offset).value)
    assert first["type"] == "vm.request"


async def test_idempotent_producer_against_tansu_fails_at_start_with_the_reason(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    settings = with_section(settings, "kafka", enable_idempotence=True)
    await create_topics(broker.bootstrap_servers)
    daemon = LiveDaemon(settings, live_engine_config(settings))
    with pytest.raises(StartupError, match="enable_idempotence"):
        await asyncio.wait_for(daemon.run(asyncio.Event()), 60)


async def test_a_taken_http_port_stops_start_up_with_the_key(tmp_path: Path) -> None:
    settings = live_settings(f"127.0.0.1:{free_port()}", tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = with_section(settings, "http", port=port)
        daemon = LiveDaemon(settings, live_engine_config(settings))
        with pytest.raises(StartupError, match=r"http\.port"):
            await daemon.run(asyncio.Event())


async def test_lava_repredictions_are_published_as_in_a_replay(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    settings = with_section(settings, "placement", policy="lava")
    events = pool_events(("east",), 3_000)
    expected = replay_in_process(settings, events)["east"]
    placements = [line for line in expected if b'"kind":"placement"' in line]
    repredictions = [line for line in expected if b'"kind":"reprediction"' in line]
    assert repredictions, "the slice should change some LAVA host states"
    await _consume_all(broker, settings, events)
    got = await read_topic(
        broker.bootstrap_servers, NAMES.repredictions, at_least=len(repredictions)
    )
    assert [record.value for record in got] == repredictions
    got = await read_topic(broker.bootstrap_servers, NAMES.placements, at_least=len(placements))
    assert [record.value for record in got] == placements


async def test_usage_limits_are_published_as_in_a_replay(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    events = [
        item
        for item in open_trace(GOOGLE_LIMITS_SLICE, seed=0).events()
        if not isinstance(item, BadRecord)
    ]
    expected = replay_in_process(settings, events)["default"]
    assert expected and all(b'"kind":"limit"' in line for line in expected)
    await _consume_all(broker, settings, events)
    got = await read_topic(broker.bootstrap_servers, NAMES.limits, at_least=len(expected))
    assert [record.value for record in got] == expected


async def test_replica_recommendations_are_published_as_in_a_replay(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """[limits] horizontal on two real PlanetLab slices: lavad.limits equals the replay."""
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    settings = settings.model_copy(update={"limits": replace(settings.limits, horizontal=True)})
    events = slice_events()
    expected = replay_in_process(settings, events)["default"]
    replicas = [line for line in expected if b'"kind":"replicas"' in line]
    assert len(replicas) == 8 and len(expected) > len(replicas)  # the limits come too
    assert all(b'"kind":"limit"' in line or line in replicas for line in expected)
    # The VMs are booked on lavad.vm-events and their usage comes on
    # lavad.usage; nothing orders records across topics, so the bookings go
    # first (a sample of a VM the pool does not hold yet is unattributed).
    usage = [e for e in events if isinstance(e, UsageSample)]
    bookings = [e for e in events if not isinstance(e, UsageSample)]
    await create_topics(broker.bootstrap_servers)
    await produce(broker.bootstrap_servers, bookings)
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = await _serve(daemon, stop)
    await wait_for(lambda: daemon.records_processed >= len(bookings), 60, "the bookings")
    await produce(broker.bootstrap_servers, usage)
    await wait_for(lambda: daemon.records_processed >= len(events), 60, "all events")
    stop.set()
    await task
    got = await read_topic(broker.bootstrap_servers, NAMES.limits, at_least=len(expected))
    assert [record.value for record in got] == expected


async def test_admissions_are_published_as_in_a_replay(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    settings = with_section(
        settings, "admission", policy="zeroth", capacity_cores=10.0, args={"threshold": 0.8}
    )
    # Deployments of 2-5 cores arriving and growing on a 10-core pool: some
    # arrivals and scale-outs are refused.
    events: list[Event] = []
    for k in range(40):
        deployment = f"d{k % 7}"
        if k % 3 == 0:
            events.append(
                DeploymentArrival(
                    time=float(k), pool="east", deployment_id=deployment, cores=2.0 + k % 4
                )
            )
        elif k % 3 == 1:
            events.append(
                DeploymentScaleOut(time=float(k), pool="east", deployment_id=deployment, cores=1.0)
            )
        else:
            events.append(
                DeploymentScaleIn(time=float(k), pool="east", deployment_id=deployment, cores=1.0)
            )
    expected = replay_in_process(settings, events)["east"]
    assert any(b'"admitted":false' in line for line in expected)
    assert any(b'"admitted":true' in line for line in expected)
    await _consume_all(broker, settings, events)
    got = await read_topic(broker.bootstrap_servers, NAMES.admissions, at_least=len(expected))
    assert [record.value for record in got] == expected


async def test_migration_plans_are_published_as_in_a_replay(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    # 62 fixed hosts, which the slice's first 3,000 events (55 hosts at peak in
    # a growing pool) fill past 75%: the defragmenter drains hosts and LAS
    # moves their VMs, with plans, moves and ready hosts on lavad.migrations.
    settings = settings.model_copy(
        update={
            "placement": settings.placement.model_copy(update={"policy": "las"}),
            "hosts": settings.hosts.model_copy(update={"count": 62, "grow_on_demand": False}),
            "migrations": replace(
                settings.migrations, defrag=replace(settings.migrations.defrag, empty_below=0.25)
            ),
        }
    )
    events = pool_events(("east",), 3_000)
    expected = replay_in_process(settings, events)["east"]
    migrations = [line for line in expected if b'"kind":"migration"' in line]
    assert any(b'"action":"migrate"' in line for line in migrations)
    await _consume_all(broker, settings, events)
    got = await read_topic(broker.bootstrap_servers, NAMES.migrations, at_least=len(migrations))
    assert [record.value for record in got] == migrations
