"""A defect in a pool owner halts that pool only, on a real broker: the owner's other
pool answers every launch, the failing launch is dead-lettered with the error, nothing
of the halted pool is snapshotted or committed past it, and an owner without the
defect answers the halted pool's launches as if nothing had happened."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from federation_live_support import create_topics, send

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.live_clients import read_partition
from lavad.federation.live_owner import Owner
from lavad.federation.live_wire import DEAD_LETTERS, LAUNCHES, VERDICTS, encode_launch
from lavad.federation.messages import LaunchRequest, Task, Verdict
from lavad.federation.owner import PoolOwner
from lavad.federation.topology import uniform_topology
from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

POOLS, HOSTS, LAUNCHED = 2, 30, 20
# The launch of pool 0 the injected defect fails on (its 8th).
FAILING_TASK = 7


def _launches(pool: int) -> list[LaunchRequest]:
    """One task a host, each from scheduler 0 (every host is its home: one scheduler)."""
    return [
        LaunchRequest(
            gm=0,
            seq=i + 1,
            pool=pool,
            host=i,
            task=Task(
                100 * pool + i,
                job=i,
                tenant=0,
                demand=(1,),
                constraints=0,
                duration=60.0,
                arrival=0.0,
            ),
            repartition=False,
            attempt=1,
        )
        for i in range(LAUNCHED)
    ]


async def _produce(bootstrap: str) -> None:
    for pool in range(POOLS):
        launches = [encode_launch(launch) for launch in _launches(pool)]
        await send(bootstrap, LAUNCHES, launches, key=None, partition=pool)


async def _run_owner(kafka: KafkaSettings, name: str, done: Callable[[], Awaitable[bool]]) -> Owner:
    owner = Owner(kafka, name, uniform_topology(POOLS, HOSTS, 1), 1, 5)
    stop = asyncio.Event()
    task = asyncio.create_task(owner.run(stop))
    try:
        for _ in range(300):
            if task.done() or await done():
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"owner {name}: timed out")
    finally:
        stop.set()
        await task
    return owner


async def _verdicts(bootstrap: str) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in await read_partition(bootstrap, VERDICTS)]


def _pool_of(verdict: dict[str, Any]) -> int:
    return int(verdict["task"]) // 100


async def test_a_defect_halts_its_pool_and_an_owner_without_it_answers_the_rest(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, pools=POOLS, queues=1)
    await _produce(bootstrap)
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    launch = PoolOwner.launch

    def defective(self: PoolOwner, request: LaunchRequest, now: float) -> Verdict:
        if request.task.task_id == FAILING_TASK:
            self.free[request.host] -= 1  # half-changed: the host taken, no task
            raise RuntimeError("injected defect in a launch")
        return launch(self, request, now)

    monkeypatch.setattr(PoolOwner, "launch", defective)

    async def halted_and_other_answered() -> bool:
        answered = [v for v in await _verdicts(bootstrap) if _pool_of(v) == 1]
        dead = await read_partition(bootstrap, DEAD_LETTERS)
        return len(answered) == LAUNCHED and len(dead) == 1

    first = await _run_owner(kafka, "a", halted_and_other_answered)
    monkeypatch.undo()
    assert set(first.halted) == {0}
    verdicts = await _verdicts(bootstrap)
    # Pool 0 answered up to the defect; pool 1 everything, all accepted.
    assert sorted(v["task"] for v in verdicts if _pool_of(v) == 0) == list(range(FAILING_TASK))
    assert sorted(v["task"] for v in verdicts if _pool_of(v) == 1) == [
        100 + i for i in range(LAUNCHED)
    ]
    assert all(v["accepted"] for v in verdicts)
    (dead,) = await read_partition(bootstrap, DEAD_LETTERS)
    assert dead.value == encode_launch(_launches(0)[FAILING_TASK])
    headers = {key: value.decode() for key, value in dead.headers}
    assert "defect in the owner of pool 0: RuntimeError: injected defect" in headers["lavad.reason"]

    # The defect fixed: a new owner restores pool 0 from before the defect (the
    # half-taken host was never written) and answers its launches; pool 1 has none left.
    async def all_answered() -> bool:
        answered = {v["task"] for v in await _verdicts(bootstrap) if _pool_of(v) == 0}
        return len(answered) == LAUNCHED

    second = await _run_owner(kafka, "b", all_answered)
    assert second.halted == {}
    again = (await _verdicts(bootstrap))[len(verdicts) :]
    assert {_pool_of(v) for v in again} == {0}
    assert all(v["accepted"] for v in again)
    assert {v["task"] for v in again} >= set(range(FAILING_TASK, LAUNCHED))
    # A launch answered twice (replayed from pool 0's last snapshot) got the same verdict.
    first_answers = {v["task"]: v for v in verdicts}
    for verdict in again:
        before = first_answers.get(verdict["task"])
        if before is not None:
            assert {**verdict, "instance": "a"} == before
