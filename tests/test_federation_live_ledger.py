"""The request ledger forgets live, on the embedded broker: one pool owner and one
global scheduler as `lavad federation` processes. 20 requests are placed and their
tasks end; once the queue's commit has passed them the scheduler forgets them (its log
says so), and the same 20 requests sent again are still skipped as final (the newest
forgotten are remembered): no second launch, and a fresh request after them is placed."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

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

from lavad.federation.live_wire import LAUNCHES, encode_end
from lavad.federation.messages import TaskEnd
from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

COUNT = 20


async def test_a_scheduler_forgets_ended_requests_below_the_commit(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, pools=1, queues=2)
    config = str(
        federation_config(
            tmp_path / "f.toml", bootstrap, pools=1, hosts_per_pool=COUNT, schedulers=1
        )
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("owner", "gm0")}
    processes = [
        start(logs["owner"], "owner", "--instance", "a", "--config", config),
        start(logs["gm0"], "scheduler", "--gm", "0", "--config", config),
    ]
    first = tasks(0, 0, COUNT)
    try:

        async def ready() -> bool:
            owner = "pool taken" in logs["owner"].read_text()
            return owner and taken_partitions(logs["gm0"]) == [0, 1]

        await until(ready, 60, "the owner to take the pool and the scheduler both queues")
        await produce(bootstrap, first)

        async def count(kind: str, needed: int) -> bool:
            found = await verdicts(bootstrap)
            return sum(v["kind"] == kind and v["accepted"] for _, v in found) >= needed

        await until(lambda: count("launch", COUNT), 60, "the requests placed")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for task in first:
                end = encode_end(TaskEnd(pool=0, task_id=task.task_id))
                await producer.send_and_wait(LAUNCHES, end, key=b"pool-0", partition=0)
        finally:
            await producer.stop()
        await until(lambda: count("end", COUNT), 60, "the tasks ended")

        async def forgotten() -> bool:
            totals = re.findall(r"requests forgotten.*?total=(\d+)", logs["gm0"].read_text())
            return bool(totals) and int(totals[-1]) >= COUNT

        # the queue's commit passes them within 0.5 s, the ledger forgets every 5 s
        await until(forgotten, 30, "the scheduler to forget the ended requests")
        await produce(bootstrap, [*first, *tasks(0, 50, 1)])  # the same 20 again, then one
        await until(lambda: count("launch", COUNT + 1), 60, "the fresh request placed")
    finally:
        stop_all(processes)
    sent = Counter(v["task"]["task"] for _, v in await launches(bootstrap, 1) if v["kind"] != "end")
    assert sent == Counter(range(COUNT)) + Counter([50])  # one launch each, none again
    stopping = logs["gm0"].read_text().split("scheduler stopping")[-1].splitlines()[0]
    replayed = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stopping)}
    assert replayed["already_final"] == COUNT, replayed
    assert replayed["retired"] >= COUNT, replayed
    sys.stdout.write(f"\nlive ledger: {stopping.strip()}\n")
