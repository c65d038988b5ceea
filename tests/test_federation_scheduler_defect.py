"""A defect in a global scheduler, met on one request, one task's decision or one
verdict, sets that record aside (dead letter with the error, a counter) and the scheduler
goes on with the rest, on a real broker: a poison record would otherwise stop every
scheduler, since queues move to the survivors and every scheduler reads every verdict at
its start."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from federation_live_support import create_topics, send

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.live_clients import read_partition, topic_partitions
from lavad.federation.live_scheduler import Scheduler
from lavad.federation.live_wire import (
    DEAD_LETTERS,
    LAUNCHES,
    REQUESTS,
    VERDICTS,
    decode_launch,
    encode_request,
    encode_verdict,
)
from lavad.federation.messages import LaunchRequest, Task
from lavad.federation.owner import PoolOwner
from lavad.federation.request_ledger import CommitWatermark
from lavad.federation.scheduler import Choice, GlobalScheduler
from lavad.federation.topology import uniform_topology
from lavad.streams.kafka.deadletter import header_map
from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = [pytest.mark.kafka]

TOPOLOGY = uniform_topology(1, 10, 1)
POISON = 2


def _task(task_id: int) -> Task:
    return Task(
        task_id, job=task_id, tenant=0, demand=(1,), constraints=0, duration=60.0, arrival=0.0
    )


async def _close(scheduler: Scheduler) -> None:
    """The clients a scheduler makes and these tests never start, closed."""
    await scheduler.requests.stop()
    await scheduler.state.stop()
    await scheduler.verdicts.stop()
    await scheduler.producer.stop()


async def _requests_in_queue_0(bootstrap: str, tasks: tuple[int, ...]) -> list[Any]:
    """The federation's topics made, and requests for ``tasks`` in tenant queue 0, as read."""
    await create_topics(bootstrap, pools=1, queues=1)
    requests = [encode_request(_task(t)) for t in tasks]
    await send(bootstrap, REQUESTS, requests, key=b"0", partition=0)
    return list(await read_partition(bootstrap, REQUESTS))


async def _holding_queue_0(bootstrap: str) -> Scheduler:
    """Scheduler 0 holding tenant queue 0, its producer started (``_close`` stops it)."""
    scheduler = Scheduler(KafkaSettings(bootstrap_servers=bootstrap), 0, TOPOLOGY, 1, 86400.0)
    scheduler.owned[0] = CommitWatermark()
    await scheduler.producer.start()
    return scheduler


async def _set_aside_once(
    bootstrap: str, scheduler: Scheduler, kind: str, value: bytes, error: str
) -> Any:
    """Assert one record of ``kind`` was set aside: counted once, dead-lettered with
    ``value`` and a reason holding ``error``. Returns the dead letter."""
    assert (
        scheduler.registry.get_sample_value(
            "lavad_federation_records_set_aside_total", {"record": kind}
        )
        == 1.0
    )
    (dead,) = await read_partition(bootstrap, DEAD_LETTERS)
    assert dead.value == value
    assert error in _reason(dead)
    return dead


def _reason(record: Any) -> str:
    return str(dict(record.headers)["lavad.reason"].decode())


async def test_a_request_that_meets_a_defect_is_set_aside_and_the_others_admitted(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = broker.bootstrap_servers
    records = await _requests_in_queue_0(bootstrap, (1, POISON, 3))
    admit = Scheduler.admit

    def defective(self: Scheduler, task: Task, *args: Any) -> None:
        if task.task_id == POISON:
            raise RuntimeError("injected defect in admitting")
        admit(self, task, *args)

    monkeypatch.setattr(Scheduler, "admit", defective)
    scheduler = await _holding_queue_0(bootstrap)
    try:
        await scheduler.read_requests(0, records)
    finally:
        await _close(scheduler)
    assert set(scheduler.holding) == {1, 3}
    # Done for its queue, as a malformed request is: only 1 and 3 wait to be final.
    assert scheduler.owned[0].tasks() == {1, 3}
    error = "defect in global scheduler 0: RuntimeError: injected defect"
    await _set_aside_once(bootstrap, scheduler, "request", records[1].value, error)


async def test_a_verdict_that_meets_a_defect_is_set_aside_and_the_next_applied(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, pools=1, queues=1)
    owner = PoolOwner("owner-of-pool-0", TOPOLOGY.pools[0], 1, 1)
    launches = [
        LaunchRequest(gm=0, seq=i + 1, pool=0, host=i, task=_task(t), repartition=False, attempt=1)
        for i, t in enumerate((POISON, 5))
    ]
    verdicts = [encode_verdict(r, owner.launch(r, 1.0), "a") for r in launches]
    await send(bootstrap, VERDICTS, verdicts, key=b"0", partition=0)
    answer = Scheduler.answer

    def defective(self: Scheduler, verdict: Any, at: float) -> None:
        if verdict.request.task_id == POISON:
            raise KeyError("injected defect in a verdict")
        answer(self, verdict, at)

    monkeypatch.setattr(Scheduler, "answer", defective)
    scheduler = Scheduler(KafkaSettings(bootstrap_servers=bootstrap), 0, TOPOLOGY, 1, 86400.0)
    await scheduler.producer.start()
    await scheduler.verdicts.start()
    try:
        scheduler.verdict_parts = await topic_partitions(scheduler.verdicts, VERDICTS)
        scheduler.verdicts.assign(scheduler.verdict_parts)
        await scheduler.verdicts.seek_to_beginning(*scheduler.verdict_parts)
        await scheduler.read_verdicts(to_end=True)
    finally:
        await _close(scheduler)
    # The verdict after it was applied: task 5 is final and its tenant uses its core.
    assert scheduler.ledger.is_final(5) and not scheduler.ledger.is_final(POISON)
    assert np.array_equal(scheduler.running.usage[0], [1])
    error = "KeyError: 'injected defect in a verdict'"
    await _set_aside_once(bootstrap, scheduler, "verdict", verdicts[0], error)


async def test_a_task_whose_decision_meets_a_defect_is_set_aside_and_the_others_launched(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = broker.bootstrap_servers
    records = await _requests_in_queue_0(bootstrap, (POISON, 1, 3))
    decide = GlobalScheduler.decide

    def defective(self: GlobalScheduler, task: Task) -> tuple[Choice, int]:
        if task.task_id == POISON:
            raise ZeroDivisionError("injected defect in deciding")
        return decide(self, task)

    monkeypatch.setattr(GlobalScheduler, "decide", defective)
    scheduler = await _holding_queue_0(bootstrap)
    try:
        await scheduler.read_requests(0, records)
        await scheduler.launch_what_fits()
    finally:
        await _close(scheduler)
    launched = [decode_launch(r.value) for r in await read_partition(bootstrap, LAUNCHES)]
    assert [launch.task.task_id for launch in launched] == [1, 3]
    # Done for its queue: no longer held, and committed past; 1 and 3 wait on their verdicts.
    assert set(scheduler.holding) == {1, 3}
    assert scheduler.owned[0].advance(scheduler.ledger.is_final) == 1
    # The request encoded again from the task: the same bytes, and where it was read.
    error = "deciding the task: ZeroDivisionError: injected defect"
    dead = await _set_aside_once(bootstrap, scheduler, "decision", records[0].value, error)
    headers = header_map(dead.headers)
    assert dead.key == b"0"
    assert (headers["lavad.source.topic"], headers["lavad.source.offset"]) == (REQUESTS, "0")
