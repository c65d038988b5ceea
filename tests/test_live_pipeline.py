"""The pipelined live loop never snapshots or commits ahead of what it published.

The daemon decides batch N+1 while batch N's acknowledgements are pending.
A snapshot or an offset commit taken from the positions of N+1 before N+1 is
acknowledged would, after a kill -9, skip decisions nobody ever received
(the snapshot) or tell tooling they were out (the commit). These tests kill
an instance in the middle of a burst, with snapshots as often as the daemon
can take them, and check against what the broker holds at that moment.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from live_support import (
    NAMES,
    DaemonProcess,
    create_topics,
    decision_ids,
    live_settings,
    produce,
    read_decisions,
    replay_in_process,
    two_pool_events,
)

from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.schema import Event, VmRequest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 3
GROUP = "lavad"  # config/lavad.toml's group, which DaemonProcess runs with


def _partition(pool: str) -> int:
    numbers = list(range(PARTITIONS))
    return int(DefaultPartitioner()(pool.encode(), numbers, numbers))


def _requests_by_offset(events: list[Event]) -> dict[int, list[tuple[str, str]]]:
    """Input partition -> (pool, vm_id) of the VM request at each offset of the VM-event topic.

    One producer sends every event in order, so a partition's offsets follow
    the order of its pool's events on that topic; non-requests keep their
    offset, as ("", "").
    """
    by_partition: dict[int, list[tuple[str, str]]] = {}
    for event in events:
        if NAMES.for_event_type(event.type) != NAMES.vm_events:
            continue
        slots = by_partition.setdefault(_partition(event.pool), [])
        slots.append((event.pool, event.vm_id) if isinstance(event, VmRequest) else ("", ""))
    return by_partition


def _unpublished_below(
    offsets: dict[int, int],
    requests: dict[int, list[tuple[str, str]]],
    placed: set[tuple[str, str]],
) -> list[tuple[int, int, str]]:
    """VM requests below ``offsets`` (partition -> VM-event topic offset) with no placement out."""
    missing = []
    for partition, offset in offsets.items():
        for index, key in enumerate(requests.get(partition, [])[:offset]):
            if key[0] and key not in placed:
                missing.append((partition, index, key[1]))
    return missing


def _snapshot_offsets(snapshots: Path) -> tuple[dict[int, int], int]:
    """Partition -> VM-event topic offset of each snapshot on disk, and how many were written."""
    offsets: dict[int, int] = {}
    for path in snapshots.rglob("*.snapshot"):
        header = orjson.loads(path.read_bytes().split(b"\n", 1)[0])
        offsets[header["partition"]] = header["offsets"].get(NAMES.vm_events, 0)
    return offsets, len(offsets)


async def _committed(bootstrap: str) -> dict[int, int]:
    """The group's committed offsets of the VM-event topic (read outside the group)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP)
    await consumer.start()
    try:
        committed = {}
        for partition in range(PARTITIONS):
            offset = await consumer.committed(TopicPartition(NAMES.vm_events, partition))
            if offset is not None:
                committed[partition] = offset
        return committed
    finally:
        await consumer.stop()


async def _read_to_end(bootstrap: str, topic: str) -> list[Any]:
    """Every record the topic holds now (up to its end offsets), read outside any group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    records: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            batch = await consumer.getmany(timeout_ms=200)
            for part in batch.values():
                records.extend(part)
    finally:
        await consumer.stop()
    return records


async def _counter(daemon: DaemonProcess, name: str) -> float | None:
    """The sum of a counter over its labels, from the daemon's /metrics.

    None when the scrape timed out: on a loaded machine a scrape can wait
    behind a batch or a snapshot, which is not what these tests check.
    """
    try:
        _, text = await daemon.get("/metrics")
    except TimeoutError:
        return None
    return sum(
        float(row.split()[-1])
        for row in text.splitlines()
        if row.startswith((f"{name}{{", f"{name} "))
    )


async def _kill_right_after_a_snapshot(daemon: DaemonProcess, events: float) -> None:
    """Once ``events`` are counted, kill -9 as soon as the next snapshot is written.

    Right after a snapshot is where one taken ahead of the acknowledgements
    would show: the batch it covers is likely still in flight.
    """
    deadline = time.monotonic() + 60
    while (counted := await _counter(daemon, "lavad_events_total")) is None or counted < events:
        assert time.monotonic() < deadline, f"the daemon did not reach {events} events"
        await asyncio.sleep(0.01)
    while (written := await _counter(daemon, "lavad_snapshots_total")) is None:
        assert time.monotonic() < deadline, "the daemon's /metrics did not answer"
    while (now := await _counter(daemon, "lavad_snapshots_total")) is None or now <= written:
        assert time.monotonic() < deadline, "no snapshot was written"
    daemon.kill()


async def test_kill_9_mid_burst_snapshots_and_commits_only_what_was_published(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Three instances in turn are killed mid-burst; a fourth finishes; nothing is lost.

    After each kill, every VM request below a snapshot's offsets or the
    committed offsets must have its placement on the topic already.
    """
    bootstrap = broker.bootstrap_servers
    events = two_pool_events(15_000)
    assert len({_partition(pool) for pool in ("east", "west")}) == 2
    expected = {
        orjson.loads(line)["decision_id"]: line
        for lines in replay_in_process(
            live_settings(bootstrap, tmp_path / "unused"), events
        ).values()
        for line in lines
    }
    requests = _requests_by_offset(events)
    snapshots = tmp_path / "snapshots"
    # Snapshot as often as the housekeeping loop wakes: every few batches.
    env = {"LAVAD_LIVE__SNAPSHOT_INTERVAL_S": "0.02", "LAVAD_LIVE__CLUSTER_GAUGES_S": "0.02"}
    await create_topics(bootstrap)
    await produce(bootstrap, events)
    placed: set[tuple[str, str]] = set()
    for crash in range(3):
        # Each instance resumes from the last snapshot and gets about 15 % further
        # (a fetch can run one partition a few batches ahead: well short of the end).
        daemon = DaemonProcess(bootstrap, snapshots, tmp_path / f"crash-{crash}.log", **env)
        try:
            await daemon.wait_status("/readyz", 200, 60)
            await _kill_right_after_a_snapshot(daemon, len(events) * 0.15)
        finally:
            daemon.stop()
        records = await _read_to_end(bootstrap, NAMES.placements)
        placed = {
            (body["pool"], body["vm_id"]) for body in (orjson.loads(r.value) for r in records)
        }
        on_disk, _ = _snapshot_offsets(snapshots)
        assert sum(on_disk.values()) > 0, "no snapshot was taken during the burst"
        ahead = _unpublished_below(on_disk, requests, placed)
        assert not ahead, f"crash {crash}: a snapshot is ahead of what was published: {ahead[:3]}"
        committed = await _committed(bootstrap)
        assert committed, "nothing was committed during the burst: nothing tested"
        ahead = _unpublished_below(committed, requests, placed)
        assert not ahead, f"crash {crash}: a commit is ahead of what was published: {ahead[:3]}"
    assert 0 < len(placed) < len(expected), "the kills did not land mid-burst"

    b = DaemonProcess(bootstrap, snapshots, tmp_path / "b.log")
    try:
        await b.wait_status("/readyz", 200, 60)
        records = await read_decisions(bootstrap, NAMES.placements, expected)
    finally:
        assert b.stop() == 0
    published = decision_ids(records)
    missing = set(expected) - set(published)
    assert not missing, f"{len(missing)} decisions lost, e.g. {sorted(missing)[:3]}"
    assert set(published) == set(expected)
    for decision_id, bodies in published.items():
        assert bodies == {expected[decision_id]}, f"{decision_id}: duplicates differ"
