"""Shadow mode over Kafka (embedded broker): the advice equals the shadow replay's, both sides
survive a restart through their snapshot, and nothing reaches the placements topic."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from live_support import DaemonProcess, by_pool, live_settings, produce, read_topic, wait_for
from shadow_support import SLICE_HOSTS, firstfit_stream

from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.settings import Settings
from lavad.daemon.shadow.engine import Shadow, shadow_of
from lavad.daemon.shadow.live import ShadowTelemetry, topic_names
from lavad.daemon.shadow.replay import shadow_replay
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.kafka.topics import ensure_topics
from lavad.streams.schema import Event, VmExit, VmPlaced

pytestmark = pytest.mark.kafka
# First Fit's stream of the slice's first events (LAVA on lavad's side).
EVENTS = 8_000


def shadow_settings(bootstrap: str, snapshots: Path) -> Settings:
    settings = live_settings(bootstrap, snapshots)
    return settings.model_copy(
        update={
            "placement": settings.placement.model_copy(update={"policy": "lava"}),
            "hosts": settings.hosts.model_copy(
                update={"source": "shape", "count": SLICE_HOSTS, "grow_on_demand": False}
            ),
            "metrics": dataclasses.replace(settings.metrics, warmup_s=21_600.0),
            "shadow": settings.shadow.model_copy(update={"enabled": True}),
            # Small batches: the first instance stops well before the end.
            "kafka": settings.kafka.model_copy(update={"max_batch_records": 500}),
        }
    )


async def _serve_until(daemon: LiveDaemon, processed: int) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    await wait_for(lambda: all(daemon.readiness().values()), 30, "the daemon to be ready")
    await wait_for(lambda: daemon.records_processed >= processed, 120, f"{processed} records")
    stop.set()
    await task


async def test_shadow_over_kafka_equals_the_shadow_replay(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = shadow_settings(broker.bootstrap_servers, tmp_path / "snapshots")
    events = firstfit_stream(settings, limit=EVENTS)
    sink = io.BytesIO()
    shadow_replay(iter(events), live_engine_config(settings), decisions_out=sink)
    expected = by_pool(sink.getvalue().splitlines())
    names = topic_names(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        await ensure_topics(admin, names, 3)
    finally:
        await admin.close()
    await produce(broker.bootstrap_servers, events)

    # The first instance stops halfway (snapshotting both sides); a second
    # one restores them and finishes.
    first = LiveDaemon(settings, live_engine_config(settings))
    assert isinstance(first.engine.strategy, Shadow)
    assert isinstance(first.telemetry, ShadowTelemetry)
    await _serve_until(first, EVENTS // 2)
    assert first.records_processed < EVENTS
    second = LiveDaemon(settings, live_engine_config(settings))
    await _serve_until(second, EVENTS - first.records_processed)

    total = sum(len(lines) for lines in expected.values())
    records = await read_topic(broker.bootstrap_servers, settings.shadow.topic, at_least=total)
    got = by_pool(record.value for record in records)
    assert got == expected, "Kafka and the shadow replay advise differently"
    assert all(orjson.loads(value)["decision_id"].startswith("advice/") for value in got["default"])
    # Nothing went to (or created) the placements topic.
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        assert settings.topics.placements not in await admin.list_topics()
    finally:
        await admin.close()
    # Both sides came back from the snapshot: the restored instance's actual
    # side holds every VM First Fit placed and has not exited.
    engine = second.engine
    running = _running(events)
    assert set(shadow_of(engine).follower.pools["default"].cluster.vms) == running
    assert set(engine.pools["default"].cluster.vms) == running


def _running(events: Sequence[Event]) -> set[str]:
    running: set[str] = set()
    for event in events:
        if isinstance(event, VmPlaced):
            running.add(event.vm_id)
        elif isinstance(event, VmExit):
            running.discard(event.vm_id)
    return running


async def test_lavad_run_in_shadow_mode_logs_its_inputs_pools_and_endpoints(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """The command as an operator starts it: topics, then the daemon, configured by LAVAD_*."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = {
        "LAVAD_SHADOW__ENABLED": "true",
        "LAVAD_PLACEMENT__POLICY": "bestfit",
        "LAVAD_HOSTS__SOURCE": "shape",
        "LAVAD_HOSTS__COUNT": str(SLICE_HOSTS),
        "LAVAD_HOSTS__GROW_ON_DEMAND": "false",
        "LAVAD_LIVE__CLUSTER_GAUGES_S": "0.5",
    }
    config = str(Path(__file__).resolve().parents[1] / "config" / "lavad.toml")
    created = subprocess.run(
        [sys.executable, "-c", "from lavad.daemon.cli import main; main()", "topics", "create",
         "--config", config],
        env={**os.environ, **env, "LAVAD_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers},
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    assert "lavad.shadow: created" in created.stdout
    assert "lavad.placements" not in created.stdout
    settings = shadow_settings(broker.bootstrap_servers, tmp_path)
    events = firstfit_stream(settings, limit=2_000)
    log = tmp_path / "daemon.log"
    daemon = DaemonProcess(broker.bootstrap_servers, tmp_path / "snapshots", log, **env)
    try:
        await daemon.wait_status("/readyz", 200, 90)
        await produce(broker.bootstrap_servers, events)
        records = await read_topic(broker.bootstrap_servers, "lavad.shadow", at_least=1_000)
        assert records
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            _, metrics = await daemon.get("/metrics")
            if 'lavad_shadow_pool_hosts_used{pool="default",side="actual"}' in metrics:
                break
            assert asyncio.get_running_loop().time() < deadline, "no per-side gauges"
            await asyncio.sleep(0.2)
        assert 'lavad_shadow_pool_hosts_used{pool="default",side="lavad"}' in metrics
        assert 'lavad_shadow_agreement_ratio{match="host",pool="default"}' in metrics
    finally:
        assert daemon.stop() == 0
    lines = [orjson.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]
    starting = next(line for line in lines if line["event"] == "starting")
    assert starting["consumes"] == ["lavad.vm-events", "lavad.deployments", "lavad.usage"]
    assert starting["publishes"] == ["lavad.shadow", "lavad.dead-letters"]
    assert starting["shadow"] is True and starting["policy"] == "bestfit"
    serving = next(line for line in lines if line["event"] == "http serving")
    assert serving["url"] == daemon.url
    acquired = [line for line in lines if line["event"] == "partition acquired"]
    assert len(acquired) == 3
    snapshots = [line for line in lines if line["event"] == "snapshot written"]
    assert any(line["pool_names"] == ["default"] for line in snapshots)
