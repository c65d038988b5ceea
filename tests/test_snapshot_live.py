"""A snapshot that does not load, under ``lavad run`` against a real broker.

aiokafka calls the daemon's partition assignment inside its coordinator and
only logs what it raises: before, a truncated snapshot left the daemon up,
``/readyz`` 503 for ever, the partition never processed. Now it stops with the
reason (``live.on_bad_snapshot = "stop"``) or rebuilds the partition from the
earliest retained offset (``"rebuild"``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from live_support import (
    NAMES,
    DaemonProcess,
    create_topics,
    decision_ids,
    live_settings,
    produce,
    read_topic,
    replay_in_process,
    two_pool_events,
)

from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.schema import Event

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def _snapshotted_then_truncated(
    broker: EmbeddedBroker, tmp_path: Path, events: list[Event]
) -> dict[Path, bytes]:
    """A daemon consumes ``events`` and stops (snapshots written); each snapshot holding
    pools is then cut in half, as a crash of the disk mid-write would. Returns their bytes."""
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap)
    await produce(bootstrap, events)
    first = DaemonProcess(bootstrap, tmp_path / "snapshots", tmp_path / "first.log")
    try:
        await first.wait_status("/readyz", 200, 60)
        await read_topic(bootstrap, NAMES.placements, at_least=_placements(events, tmp_path))
    finally:
        assert first.stop() == 0
    truncated: dict[Path, bytes] = {}
    for path in sorted((tmp_path / "snapshots").rglob("*.snapshot")):
        data = path.read_bytes()
        if orjson.loads(data.split(b"\n", 1)[0])["pools"]:
            truncated[path] = data[: len(data) // 2]
            path.write_bytes(truncated[path])
    assert len(truncated) == 2, "east and west should live on two partitions"
    return truncated


def _placements(events: list[Event], tmp_path: Path) -> int:
    decisions = replay_in_process(live_settings("unused:1", tmp_path / "unused"), events)
    return sum(b'"kind":"placement"' in line for lines in decisions.values() for line in lines)


async def _exit_code(daemon: DaemonProcess, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = daemon.process.poll()
        if code is not None:
            return code
        await asyncio.sleep(0.1)
    return None


async def test_a_truncated_snapshot_stops_the_daemon_with_the_reason(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    truncated = await _snapshotted_then_truncated(broker, tmp_path, two_pool_events(600))
    log = tmp_path / "second.log"
    second = DaemonProcess(broker.bootstrap_servers, tmp_path / "snapshots", log)
    try:
        code = await _exit_code(second, timeout_s=60)
    finally:
        second.stop()
    assert code is not None, "the daemon stayed up with a snapshot it cannot load"
    assert code == 2
    text = log.read_text()
    assert "checksum (truncated?)" in text
    assert "live.on_bad_snapshot = 'stop'" in text
    for path, data in truncated.items():
        assert path.read_bytes() == data, "the bad snapshot must be left for the operator"


async def test_a_truncated_snapshot_is_moved_aside_and_its_partition_rebuilt(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    events = two_pool_events(1_500)
    first, second = events[:1_200], events[1_200:]
    truncated = await _snapshotted_then_truncated(broker, tmp_path, first)
    settings = live_settings(bootstrap, tmp_path / "unused")
    expected = {
        orjson.loads(line)["decision_id"]: line
        for lines in replay_in_process(settings, events).values()
        for line in lines
    }
    placed_first = {
        orjson.loads(line)["decision_id"]
        for lines in replay_in_process(settings, first).values()
        for line in lines
        if orjson.loads(line)["kind"] == "placement"
    }
    env = {"LAVAD_LIVE__ON_BAD_SNAPSHOT": "rebuild"}
    daemon = DaemonProcess(bootstrap, tmp_path / "snapshots", tmp_path / "second.log", **env)
    try:
        await daemon.wait_status("/readyz", 200, 60)
        await produce(bootstrap, second)
        # Every decision of the first part twice (the first daemon's, then the
        # rebuild's), the second part's once.
        records = await read_topic(
            bootstrap, NAMES.placements, at_least=len(placed_first) + _placements(events, tmp_path)
        )
        _, metrics = await daemon.get("/metrics")
    finally:
        assert daemon.stop() == 0
    assert "lavad_snapshots_rebuilt_total 2.0" in metrics
    for path, data in truncated.items():
        (aside,) = path.parent.glob(f"{path.name}.bad-*")
        assert aside.read_bytes() == data
    published = decision_ids(records)
    assert set(published) == {
        d for d, line in expected.items() if orjson.loads(line)["kind"] == "placement"
    }
    for decision_id, bodies in published.items():
        assert bodies == {expected[decision_id]}, f"{decision_id}: differs from the replay"
    counts = Counter(orjson.loads(record.value)["decision_id"] for record in records)
    assert {d for d, n in counts.items() if n == 2} == placed_first
