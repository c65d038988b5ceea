"""Algorithm 2 live, on the embedded broker: one pool owner and one global scheduler as
`lavad federation` processes, 2 one-slot hosts, 2 tenants with shares 50/50. Tenant 1
takes both slots; a task of tenant 0 then fits nowhere, and its scheduler preempts one of
tenant 1's tasks (the owner validates it). The victim goes back to tenant 1's queue,
where it waits (one more slot would put tenant 1 over its share) until tenant 0's task
ends; then it is launched again. No host ever holds two tasks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from federation_live_support import (
    create_topics,
    federation_config,
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


async def test_a_tenant_under_its_share_preempts_live(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, pools=1, queues=2)
    config = str(
        federation_config(
            tmp_path / "f.toml",
            bootstrap,
            pools=1,
            hosts_per_pool=2,
            schedulers=1,
            tenants=2,
            shares=[0.5, 0.5],
        )
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("owner", "gm0")}
    processes = [
        start(logs["owner"], "owner", "--instance", "a", "--config", config),
        start(logs["gm0"], "scheduler", "--gm", "0", "--config", config),
    ]
    try:

        async def ready() -> bool:
            owner = "pool taken" in logs["owner"].read_text()
            return owner and taken_partitions(logs["gm0"]) == [0, 1]

        await until(ready, 60, "the owner to take the pool and the scheduler both queues")
        await produce(bootstrap, tasks(1, 10, 2))

        async def accepted(count: int) -> list[tuple[float, dict[str, Any]]] | None:
            found = await verdicts(bootstrap)
            return found if sum(v["accepted"] for _, v in found) >= count else None

        await until(lambda: accepted(2), 60, "tenant 1's two tasks accepted")
        await produce(bootstrap, tasks(0, 20, 1))
        await until(lambda: accepted(3), 60, "tenant 0's preemption accepted")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            end = encode_end(TaskEnd(pool=0, task_id=20))
            await producer.send_and_wait(LAUNCHES, end, key=b"pool-0", partition=0)
        finally:
            await producer.stop()
        found = await until(lambda: accepted(5), 60, "the victim launched again")
    finally:
        stop_all(processes)
    answered = [v for _, v in found]
    preemptions = [v for v in answered if v["kind"] == "preempt"]
    assert len(preemptions) == 1
    preemption = preemptions[0]
    assert preemption["accepted"] and preemption["task"] == 20
    assert len(preemption["preempted"]) == 1 and preemption["preempted"][0] in (10, 11)
    victim = preemption["preempted"][0]
    victim_launches = [v for v in answered if v["task"] == victim and v["kind"] == "launch"]
    assert [(v["accepted"], v["attempt"]) for v in victim_launches] == [(True, 1), (True, 2)]
    # launched again on the host task 20 had, only after task 20's end
    order = [(v["kind"], v["task"]) for v in answered]
    assert order.index(("end", 20)) < len(order) - 1 - order[::-1].index(("launch", victim))
    assert victim_launches[-1]["host"] == preemption["host"]
    # no host ever holds two tasks: replay the verdicts in their order
    holding: dict[int, int] = {}
    most: Counter[int] = Counter()
    for v in answered:
        if not v["accepted"]:
            continue
        for gone in v.get("preempted", []):
            holding.pop(gone, None)
        if v["kind"] == "end":
            holding.pop(v["task"], None)
        else:
            holding[v["task"]] = v["host"]
        for host, count in Counter(holding.values()).items():
            most[host] = max(most[host], count)
    assert max(most.values()) == 1, most
    assert sorted(holding) == [10, 11]
