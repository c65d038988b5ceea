"""Crashes and broker outages: ``lavad run`` as a child process against a real broker."""

from __future__ import annotations

import asyncio
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
    pool_events,
    produce,
    read_decisions,
    read_topic,
    replay_in_process,
    two_pool_events,
)

from lavad.daemon.settings import Settings
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.schema import Event

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _expected(tmp_path: Path, bootstrap: str, per_pool: int) -> dict[str, bytes]:
    events = two_pool_events(per_pool)
    decisions = replay_in_process(live_settings(bootstrap, tmp_path / "unused"), events)
    return {
        orjson.loads(line)["decision_id"]: line for lines in decisions.values() for line in lines
    }


async def _placements_count(bootstrap: str, at_least: int) -> int:
    return len(await read_topic(bootstrap, NAMES.placements, at_least=at_least, timeout_s=0.5))


async def test_kill_9_between_snapshots_then_restart_loses_no_decision(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A snapshot, then decisions, then kill -9: the restart re-derives them, byte for byte.

    Instance A processes the first part and stops cleanly (its shutdown
    snapshot covers exactly that part). B resumes from it, publishes the
    decisions of the second part and is killed with no snapshot since (the
    periodic interval is an hour). C then resumes from A's snapshot again, so
    it must re-derive every decision of the second part, and then go on.
    """
    bootstrap = broker.bootstrap_servers
    events = two_pool_events(4_000)
    expected = _expected(tmp_path, bootstrap, 4_000)
    first, second, third = events[:2_500], events[2_500:5_500], events[5_500:]
    settings = live_settings(bootstrap, tmp_path / "unused")
    decided_by_second = _decided(settings, first + second)
    redo = decided_by_second - _decided(settings, first)
    snapshots = tmp_path / "snapshots"
    env = {"LAVAD_LIVE__SNAPSHOT_INTERVAL_S": "3600"}
    await create_topics(bootstrap)
    await produce(bootstrap, first)
    a = DaemonProcess(bootstrap, snapshots, tmp_path / "a.log", **env)
    try:
        await a.wait_status("/readyz", 200, 60)
        await _wait_events(a, len(first))
    finally:
        assert a.stop() == 0
    assert _snapshot_records(snapshots) == len(first)
    # Nothing to restore on a first start, so no full collection is scheduled.
    assert _restored_pools(tmp_path / "a.log") == 0

    b = DaemonProcess(bootstrap, snapshots, tmp_path / "b.log", **env)
    try:
        await b.wait_status("/readyz", 200, 60)
        await produce(bootstrap, second)
        records = await read_topic(bootstrap, NAMES.placements, at_least=len(decided_by_second))
        assert set(decision_ids(records)) == decided_by_second
        b.kill()
    finally:
        b.stop()
    assert _snapshot_records(snapshots) == len(first), "B wrote a snapshot: not a crash test"
    # Both pools came back from A's snapshots: their state is the heap's to settle.
    assert _restored_pools(tmp_path / "b.log") == 2

    await produce(bootstrap, third)
    c = DaemonProcess(bootstrap, snapshots, tmp_path / "c.log", **env)
    try:
        await c.wait_status("/readyz", 200, 60)
        records = await read_topic(bootstrap, NAMES.placements, at_least=len(expected) + len(redo))
    finally:
        assert c.stop() == 0
    published = decision_ids(records)
    missing = set(expected) - set(published)
    assert not missing, f"{len(missing)} decisions missing, e.g. {sorted(missing)[:3]}"
    assert set(published) == set(expected)
    for decision_id, bodies in published.items():
        assert bodies == {expected[decision_id]}, f"{decision_id}: duplicates differ"
    counts = Counter(orjson.loads(record.value)["decision_id"] for record in records)
    redone = {decision_id for decision_id, count in counts.items() if count > 1}
    assert redone == redo


def _decided(settings: Settings, events: list[Event]) -> set[str]:
    return {
        orjson.loads(line)["decision_id"]
        for lines in replay_in_process(settings, events).values()
        for line in lines
    }


def _restored_pools(log: Path) -> int:
    """Pools restored from snapshots, as the daemon's "partitions taken" lines count them."""
    lines = (orjson.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{"))
    return sum(line["restored_pools"] for line in lines if line.get("event") == "partitions taken")


def _snapshot_records(snapshots: Path) -> int:
    """Input records reflected by the snapshots on disk (sum of their offsets)."""
    total = 0
    for path in snapshots.rglob("*.snapshot"):
        header = orjson.loads(path.read_bytes().split(b"\n", 1)[0])
        total += sum(header["offsets"].values())
    return total


async def _wait_events(daemon: DaemonProcess, count: int, timeout_s: float = 60) -> None:
    """Until the daemon's /metrics counts ``count`` events and as many decisions are out."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        _, text = await daemon.get("/metrics")
        seen = sum(
            float(row.split()[-1])
            for row in text.splitlines()
            if row.startswith("lavad_events_total{")
        )
        if seen >= count:
            await asyncio.sleep(0.5)  # its decisions are published before the next fetch
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the daemon saw {seen} of {count} events")
        await asyncio.sleep(0.1)


async def test_paused_broker_flips_readiness_and_loses_nothing(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    events = two_pool_events(2_000)
    expected = _expected(tmp_path, bootstrap, 2_000)
    half = len(events) // 2
    await create_topics(bootstrap)
    await produce(bootstrap, events[:half])
    env = {"LAVAD_LIVE__BROKER_PROBE_S": "0.5"}
    daemon = DaemonProcess(bootstrap, tmp_path / "snapshots", tmp_path / "daemon.log", **env)
    try:
        await daemon.wait_status("/readyz", 200, 60)
        broker.pause()
        try:
            await daemon.wait_status("/readyz", 503, 20)
            assert await daemon.status("/healthz") == 200
            await asyncio.sleep(3)
        finally:
            broker.resume()
        await produce(bootstrap, events[half:])
        await daemon.wait_status("/readyz", 200, 60)
        records = await read_decisions(bootstrap, NAMES.placements, expected)
        status, body = await daemon.get("/readyz")
        assert status == 200, body
    finally:
        assert daemon.stop() == 0
    published = decision_ids(records)
    assert set(published) == set(expected)
    for decision_id, bodies in published.items():
        assert bodies == {expected[decision_id]}, f"{decision_id}: duplicates differ"


async def test_a_crashed_instances_pools_resume_on_the_other_instance(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Two instances split the partitions; one is killed; the other takes its pools over."""
    bootstrap = broker.bootstrap_servers
    # The default partitioner puts these pools on partitions 0, 1 and 2 of 3.
    pools = ("east", "alpha", "west")
    events = pool_events(pools, 1_500)
    settings = live_settings(bootstrap, tmp_path / "unused")
    expected = {
        orjson.loads(line)["decision_id"]: line
        for lines in replay_in_process(settings, events).values()
        for line in lines
    }
    first, second, third = events[:1_500], events[1_500:3_000], events[3_000:]
    await create_topics(bootstrap)
    await produce(bootstrap, first)
    snapshots = tmp_path / "snapshots"
    env = {"LAVAD_LIVE__SNAPSHOT_INTERVAL_S": "1"}
    one = DaemonProcess(bootstrap, snapshots, tmp_path / "one.log", **env)
    two: DaemonProcess | None = None
    try:
        await one.wait_status("/readyz", 200, 60)
        two = DaemonProcess(bootstrap, snapshots, tmp_path / "two.log", **env)
        await two.wait_status("/readyz", 200, 60)
        await _wait_split(one, two)
        await produce(bootstrap, second)
        await asyncio.sleep(2)  # both publish, and snapshot, some of it
        one.kill()
        await produce(bootstrap, third)
        records = await read_decisions(bootstrap, NAMES.placements, expected)
        _, text = await two.get("/metrics")
    finally:
        one.stop()
        if two is not None:
            assert two.stop() == 0
    assert "lavad_assigned_partitions 3.0" in text, "the survivor did not take every partition"
    published = decision_ids(records)
    assert set(published) == set(expected)
    for decision_id, bodies in published.items():
        assert bodies == {expected[decision_id]}, f"{decision_id}: duplicates differ"


async def _wait_split(one: DaemonProcess, two: DaemonProcess) -> None:
    """Until both instances hold partitions (the group has rebalanced)."""
    for _ in range(300):
        counts = []
        for daemon in (one, two):
            _, text = await daemon.get("/metrics")
            line = next(
                (row for row in text.splitlines() if row.startswith("lavad_assigned_partitions ")),
                "lavad_assigned_partitions 0",
            )
            counts.append(float(line.split()[1]))
        if all(counts) and sum(counts) == 3:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the two instances did not split the partitions: {counts}")


async def test_a_daemon_whose_broker_died_still_stops_on_sigterm(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Ctrl-C on `make run` stops the broker and the daemon together: the daemon
    must not wait forever to commit or leave the group with nobody to answer."""
    bootstrap = broker.bootstrap_servers
    events = two_pool_events(500)
    await create_topics(bootstrap)
    await produce(bootstrap, events)
    daemon = DaemonProcess(bootstrap, tmp_path / "snapshots", tmp_path / "daemon.log")
    try:
        await daemon.wait_status("/readyz", 200, 60)
        await _placements_count(bootstrap, at_least=1)
    finally:
        broker.close()
        # SIGTERM, then up to 30 s before a SIGKILL (which would give -9).
        assert daemon.stop() == 0
