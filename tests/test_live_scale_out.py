"""Several ``lavad run`` instances in one consumer group on one real broker.

Six pools on six partitions, three instances: the pools spread across them,
and through a kill -9 mid-stream, an instance joining and a rolling restart
of every instance, each request gets exactly one placement (after dropping
re-published duplicates by decision id), and every decision is the
in-process replay's, byte for byte. The instances share nothing but the
broker: snapshots live on the snapshot topic, as they would across machines.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner
from live_support import (
    NAMES,
    DaemonProcess,
    create_topics,
    decision_ids,
    live_settings,
    pool_events,
    produce,
    read_decisions,
    replay_in_process,
)

from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.kafka

PARTITIONS = 6
PER_POOL = 900
# Snapshots every second, on the topic store: a restarted or moved partition
# resumes from a recent one, re-publishing what came after it.
ENV = {
    "LAVAD_LIVE__SNAPSHOT_STORE": "topic",
    "LAVAD_LIVE__SNAPSHOT_INTERVAL_S": "1",
    "LAVAD_TOPICS__PARTITIONS": str(PARTITIONS),
}


def one_pool_per_partition(count: int) -> list[str]:
    """Pool names the producers' default partitioner puts on partitions 0..count-1, in order."""
    partitioner = DefaultPartitioner()
    partitions = list(range(count))
    chosen: dict[int, str] = {}
    for number in itertools.count():
        name = f"pool-{number}"
        chosen.setdefault(partitioner(name.encode(), partitions, partitions), name)
        if len(chosen) == count:
            return [chosen[p] for p in partitions]
    raise AssertionError("unreachable")


async def assigned(daemon: DaemonProcess) -> int:
    _, text = await daemon.get("/metrics")
    for row in text.splitlines():
        if row.startswith("lavad_assigned_partitions "):
            return int(float(row.split()[1]))
    return 0


async def decided(daemon: DaemonProcess) -> float:
    """Decisions the instance has published so far."""
    _, text = await daemon.get("/metrics")
    return sum(
        float(row.split()[1])
        for row in text.splitlines()
        if row.startswith("lavad_decisions_total{")
    )


async def wait_spread(daemons: list[DaemonProcess]) -> list[int]:
    """Until every instance holds partitions and together they hold all of them."""
    counts: list[int] = []

    async def check() -> bool:
        nonlocal counts
        counts = [await assigned(daemon) for daemon in daemons]
        return all(counts) and sum(counts) == PARTITIONS

    for _ in range(600):
        if await check():
            return counts
        await asyncio.sleep(0.2)
    raise AssertionError(f"the instances did not split the {PARTITIONS} partitions: {counts}")


async def test_three_instances_share_the_pools_through_a_kill_a_join_and_a_rolling_restart(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    pools = one_pool_per_partition(PARTITIONS)
    events = pool_events(pools, PER_POOL)
    expected = {
        orjson.loads(line)["decision_id"]: line
        for lines in replay_in_process(
            live_settings(bootstrap, tmp_path / "unused"), events
        ).values()
        for line in lines
    }
    requests = {(e.pool, e.vm_id) for e in events if e.type == "vm.request"}
    assert len(expected) == len(requests), "the replay places every request once"
    step = len(events) // 5
    parts = [events[i * step : (i + 1) * step] for i in range(4)] + [events[4 * step :]]
    await create_topics(bootstrap, PARTITIONS)
    snapshots = tmp_path / "snapshots"
    logs = iter(tmp_path / f"instance-{n}.log" for n in itertools.count())

    def start() -> DaemonProcess:
        return DaemonProcess(bootstrap, snapshots, next(logs), **ENV)

    running: list[DaemonProcess] = []
    stopped: list[int] = []
    try:
        await produce(bootstrap, parts[0])
        running = [start(), start(), start()]
        for daemon in running:
            await daemon.wait_status("/readyz", 200, 90)
        counts = await wait_spread(running)
        assert counts == [2, 2, 2], counts

        # kill -9 one instance once it has decided some of the new input.
        victim = running.pop(1)
        before = await decided(victim)
        await produce(bootstrap, parts[1])
        for _ in range(600):
            if await decided(victim) > before:
                break
            await asyncio.sleep(0.05)
        victim.kill()
        await wait_spread(running)

        # A fourth instance joins and takes its share.
        await produce(bootstrap, parts[2])
        running.append(start())
        await running[-1].wait_status("/readyz", 200, 90)
        await wait_spread(running)

        # Rolling restart: each instance in turn stops (SIGTERM) and a new one
        # takes its place, while input keeps coming.
        third = len(parts[3]) // 3 + 1
        for turn in range(len(running)):
            # In order: the replay saw each pool's events in this order.
            await produce(bootstrap, parts[3][turn * third : (turn + 1) * third])
            stopped.append(running[0].stop())
            running = [*running[1:], start()]
            await running[-1].wait_status("/readyz", 200, 90)
            await wait_spread(running)
        await produce(bootstrap, parts[4])
        records = await read_decisions(bootstrap, NAMES.placements, expected, timeout_s=120)
    finally:
        for daemon in running:
            stopped.append(daemon.stop())
    assert stopped == [0] * len(stopped), f"{stopped}: {_errors(tmp_path)}"
    published = decision_ids(records)
    assert set(published) == set(expected)
    for decision_id, bodies in published.items():
        assert bodies == {expected[decision_id]}, f"{decision_id}: a duplicate differs"
    placed: dict[tuple[str, str], set[str]] = {}
    for decision_id, (body,) in ((k, tuple(v)) for k, v in published.items()):
        decision = orjson.loads(body)
        placed.setdefault((decision["pool"], decision["vm_id"]), set()).add(decision_id)
    assert set(placed) == requests
    assert all(len(ids) == 1 for ids in placed.values())


def _errors(folder: Path) -> list[str]:
    """Every instance's error lines, and the reason lavad printed on exit."""
    found = []
    for log in sorted(folder.glob("instance-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if '"level":"error"' in line or line.startswith("lavad:"):
                found.append(f"{log.name}: {line[:500]}")
    return found
