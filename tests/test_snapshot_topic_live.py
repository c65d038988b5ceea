"""``lavad run`` with ``live.snapshot_store = "topic"``: two instances on separate disks
(no shared snapshot directory); one is killed with kill -9; the other restores its
partitions from the snapshot topic and goes on: every decision published, none
contradicted. The failover time is printed (kill -9 to the survivor's first decision
for every pool), not asserted: timings here are noisy."""

from __future__ import annotations

import asyncio
import sys
import time
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
    read_topic,
    replay_in_process,
)

from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def _assigned(daemon: DaemonProcess) -> float:
    _, text = await daemon.get("/metrics")
    line = next(
        (row for row in text.splitlines() if row.startswith("lavad_assigned_partitions ")),
        "lavad_assigned_partitions 0",
    )
    return float(line.split()[1])


async def test_kill_9_an_instance_and_its_pools_resume_from_the_snapshot_topic(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    pools = ("east", "alpha", "west")  # partitions 0, 1 and 2 of 3
    events = pool_events(pools, 1_500)
    settings = live_settings(bootstrap, tmp_path / "unused")
    expected = {
        orjson.loads(line)["decision_id"]: line
        for lines in replay_in_process(settings, events).values()
        for line in lines
    }
    first, second, third = events[:1_500], events[1_500:3_000], events[3_000:]
    third_ids = {
        orjson.loads(line)["decision_id"]
        for lines in replay_in_process(settings, first + second).values()
        for line in lines
    }
    third_ids = set(expected) - third_ids
    pool_of = {i: orjson.loads(expected[i])["pool"] for i in third_ids}
    await create_topics(bootstrap)
    await produce(bootstrap, first)
    env = {
        "LAVAD_LIVE__SNAPSHOT_INTERVAL_S": "1",
        "LAVAD_LIVE__SNAPSHOT_STORE": "topic",
        "LAVAD_LIVE__SNAPSHOT_CHUNK_BYTES": "65536",
    }
    # each instance its own snapshot directory: only the topic can carry state across
    one = DaemonProcess(bootstrap, tmp_path / "disk-one", tmp_path / "one.log", **env)
    two: DaemonProcess | None = None
    try:
        await one.wait_status("/readyz", 200, 60)
        two = DaemonProcess(bootstrap, tmp_path / "disk-two", tmp_path / "two.log", **env)
        await two.wait_status("/readyz", 200, 60)
        for _ in range(300):
            if await _assigned(one) and await _assigned(two):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the two instances did not split the partitions")
        await produce(bootstrap, second)
        await asyncio.sleep(3)  # both publish, and snapshot to the topic, some of it
        killed_at = time.monotonic()
        one.kill()
        await produce(bootstrap, third)
        took_over = None
        first_after: dict[str, float] = {}  # pool -> its first decision after the kill
        records: list[object] = []
        deadline = killed_at + 120
        while time.monotonic() < deadline:
            if took_over is None and await _assigned(two) == 3:
                took_over = time.monotonic() - killed_at
            records = await read_topic(bootstrap, NAMES.placements, at_least=0, timeout_s=0.2)
            published = decision_ids(records)
            for decision_id in third_ids & set(published):
                first_after.setdefault(pool_of[decision_id], time.monotonic() - killed_at)
            if set(expected) <= set(published):
                break
            await asyncio.sleep(0.2)
        all_done = time.monotonic() - killed_at
        _, text = await two.get("/metrics")
    finally:
        one.stop()
        if two is not None:
            assert two.stop() == 0
    assert "lavad_assigned_partitions 3.0" in text, "the survivor did not take every partition"
    assert not list((tmp_path / "disk-two").rglob("*.snapshot")), "a file store was used"
    published = decision_ids(records)
    assert set(published) == set(expected)
    for decision_id, bodies in published.items():
        assert bodies == {expected[decision_id]}, f"{decision_id}: duplicates differ"
    assert set(first_after) == set(pools)
    # the moved pools are the last to decide again: the largest first decision is theirs
    failover = max(first_after.values())
    sys.stdout.write(
        f"\nfailover (snapshot topic): kill -9 -> survivor holds every partition in "
        f"{took_over} s; first decision per pool after the kill (s, to a 0.2 s poll): "
        f"{ {p: round(t, 2) for p, t in sorted(first_after.items())} }: failover "
        f"{failover:.2f} s; every decision published {all_done:.2f} s\n"
    )
