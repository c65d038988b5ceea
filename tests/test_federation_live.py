"""The live federation on the embedded broker: 2 pool owners and 2 global schedulers
as processes. Both schedulers' views are stale on purpose (the state topic read once
a day): launches into resources another scheduler took are refused and retried with
the owner's summary. One owner is killed with kill -9 mid-stream: its pool resumes on
the other from the owner-snapshot topic; every request ends with exactly one accepted
launch (after dropping duplicate verdicts), no host is ever given twice. The failover
time (kill -9 to the survivor's first verdict for the moved pool) is printed."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from federation_live_support import (
    create_topics,
    federation_config,
    launches,
    produce,
    start,
    stop_all,
    taken_partitions,
    tasks,
    until,
    verdicts,
)

from lavad.federation.live_clients import read_partition
from lavad.federation.live_wire import DEAD_LETTERS, LAUNCHES, REQUESTS
from lavad.streams.kafka.embedded import EmbeddedBroker, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


async def _read(bootstrap: str, topic: str) -> list[Any]:
    return list(await read_partition(bootstrap, topic))


def _metrics(port: int) -> dict[str, float]:
    # Prometheus's default scrape timeout: a loaded CI box can keep a scrape waiting.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("lavad_federation_allocation") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


async def test_two_owners_two_schedulers_kill_9_an_owner(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap)
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b", "gm0", "gm1")}
    # a takes no snapshot after its pool's first (1000 launches apart): killed between them
    owner_a = start(
        logs["a"],
        "owner",
        "--instance",
        "a",
        "--config",
        str(federation_config(tmp_path / "a.toml", bootstrap, owner_snapshot_every=1000)),
    )
    owner_b = start(
        logs["b"],
        "owner",
        "--instance",
        "b",
        "--config",
        str(federation_config(tmp_path / "b.toml", bootstrap, owner_snapshot_every=7)),
    )
    metrics_port = free_port()
    gms = [
        start(
            logs[f"gm{g}"],
            "scheduler",
            "--gm",
            str(g),
            "--config",
            str(
                federation_config(
                    tmp_path / f"gm{g}.toml",
                    bootstrap,
                    scheduler_state_lag_s=86400.0,
                    scheduler_metrics_port=metrics_port if g == 0 else 0,
                )
            ),
        )
        for g in range(2)
    ]
    processes = [owner_a, owner_b, *gms]
    try:

        async def all_hold() -> bool:
            owners = all("pool taken" in logs[n].read_text() for n in ("a", "b"))
            return owners and all(taken_partitions(logs[f"gm{g}"]) for g in (0, 1))

        # a scheduler reads the state topic before it joins its group (every pool empty:
        # no launch yet), so once both have taken queues, both views are read, stale from then on
        await until(all_hold, 60, "each owner to take a pool and each scheduler a queue")
        a_pool = int(
            next(line for line in logs["a"].read_text().splitlines() if "pool taken" in line)
            .split("pool=")[1]
            .split()[0]
        )
        # tenant 0: 60 tasks, more than one scheduler's partitions (2 pools x 25 hosts):
        # its scheduler repartitions into the other's; tenant 1's scheduler, not seeing
        # that (stale view), launches there and is refused.
        # bad input first: a launch and a request that are not one; each is dead-lettered
        # with its reason and the processes go on
        garbage = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await garbage.start()
        try:
            await garbage.send_and_wait(LAUNCHES, b"not a launch", key=b"x", partition=0)
            await garbage.send_and_wait(REQUESTS, b'{"task": 1, "v": 1}', key=b"y", partition=0)
        finally:
            await garbage.stop()
        await produce(bootstrap, tasks(0, 0, 60))

        async def some_verdicts() -> bool:
            return len(await verdicts(bootstrap)) >= 40

        await until(some_verdicts, 60, "40 verdicts")

        # tenant 0's scheduler has decided all 60, its overflow into the other's
        # partitions among them, before tenant 1's tasks exist: otherwise a slow box lets
        # tenant 1's scheduler take those hosts first, and tenant 0's, refreshed by its own
        # verdicts' summaries, steers clear of them, and no launch is ever stale
        async def all_launched() -> bool:
            found = await launches(bootstrap, 2)
            sent = {v["task"]["task"] for _, v in found if v["kind"] != "end"}
            return set(range(60)) <= sent

        await until(all_launched, 60, "a launch for each of tenant 0's 60 tasks")
        killed_at = time.time()
        owner_a.send_signal(signal.SIGKILL)
        owner_a.wait()
        await produce(bootstrap, tasks(1, 60, 30))

        async def all_accepted() -> list[tuple[float, dict[str, Any]]] | None:
            found = await verdicts(bootstrap)
            accepted = {v["task"] for _, v in found if v["accepted"]}
            return found if len(accepted) == 90 else None

        answered = await until(all_accepted, 120, "all 90 tasks accepted")
        metrics = await asyncio.to_thread(_metrics, metrics_port)
    finally:
        stop_all(processes)
    # one verdict per launch (task, scheduler, seq); a replayed launch must get the same
    # scheduler 0's allocation time: its accepted launches, the components summing up
    count = metrics["lavad_federation_allocation_seconds_count"]
    assert count > 0
    parts = [
        metrics[f'lavad_federation_allocation_component_seconds_sum{{component="{c}"}}']
        for c in ("queueing", "processing", "communication", "retries")
    ]
    assert sum(parts) == pytest.approx(metrics["lavad_federation_allocation_seconds_sum"])
    # one dead letter per bad record (a replayed one is dead-lettered again: same origin)
    letters = {}
    for record in await _read(bootstrap, DEAD_LETTERS):
        headers = {name: value.decode() for name, value in record.headers}
        origin = tuple(headers[f"lavad.source.{k}"] for k in ("topic", "partition", "offset"))
        letters[origin] = headers["lavad.reason"]
    reasons = sorted(letters.values())
    assert len(reasons) == 2 and reasons[0].startswith("launch: not JSON"), reasons
    assert reasons[1] == "task: 'job' is not an integer", reasons
    distinct: dict[tuple[int, int, int], dict[str, Any]] = {}
    for _, v in answered:
        key = (v["task"], v["gm"], v["seq"])
        first = distinct.setdefault(key, v)
        decision = ("accepted", "final", "pool", "host", "reason")
        assert [first[k] for k in decision] == [v[k] for k in decision], (first, v)
    placements: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for v in distinct.values():
        if v["accepted"]:
            placements[v["task"]].add((v["pool"], v["host"]))
    # every request: exactly one accepted launch, whatever the duplicates
    assert sorted(placements) == list(range(90))
    assert all(len(hosts) == 1 for hosts in placements.values()), placements
    # no host given twice (each has one slot)
    holders: dict[tuple[int, int], set[int]] = defaultdict(set)
    for task, hosts in placements.items():
        holders[next(iter(hosts))].add(task)
    assert all(len(tasks) == 1 for tasks in holders.values())
    stale = [v for v in distinct.values() if not v["accepted"] and not v["final"]]
    # a queue moved between the schedulers (a rebalance) is the one way left for tenant 1
    # to be decided on a fresh view: the takeovers say whether it did
    takeovers = [
        line
        for g in (0, 1)
        for line in logs[f"gm{g}"].read_text().splitlines()
        if "queues taken" in line
    ]
    assert stale, f"no stale-view launch was refused; takeovers: {takeovers}"
    assert all("stale view" in v["reason"] for v in stale)
    assert not [v for v in distinct.values() if not v["accepted"] and v["final"]]
    # the survivor replayed a's launches since its snapshot: the same verdicts again
    assert len(answered) > len(distinct)
    replayed = len(answered) - len(distinct)
    moved = sorted(t for t, v in answered if v["instance"] == "b" and v["pool"] == a_pool)
    assert moved, "the survivor never decided for the moved pool"
    failover = moved[0] - killed_at
    sys.stdout.write(
        f"\nscheduler 0: {count:.0f} launches, allocation mean "
        f"{metrics['lavad_federation_allocation_seconds_sum'] / count * 1000:.1f} ms, "
        f"components (s): {[round(p, 3) for p in parts]}"
    )
    sys.stdout.write(
        f"\nlive federation: {len(answered)} verdicts, {replayed} of them replayed, "
        f"{len(stale)} stale refusals; kill -9 -> survivor's first verdict for pool "
        f"{a_pool}: {failover:.2f} s\n"
    )
