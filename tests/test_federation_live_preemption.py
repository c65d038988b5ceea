"""Preemptions and task ends live, on the embedded broker: one pool-owner process
validates what a global scheduler would send on the pool's launch partition, in order:
two launches, an end, a preemption that is accepted, one whose victim already ended
(refused with the reason), one of the requester's own task (refused for good), a
malformed preemption (dead-lettered) and the end of a task that never ran (refused).
Then the owner is killed with kill -9 and a second one takes the pool over from the
snapshot topic: it replays the same records to the same verdicts, and goes on."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from federation_live_support import (
    create_topics,
    federation_config,
    send,
    start,
    stop_all,
    until,
)

from lavad.federation.live_clients import read_partition
from lavad.federation.live_wire import (
    DEAD_LETTERS,
    LAUNCHES,
    encode_end,
    encode_launch,
)
from lavad.federation.messages import LaunchRequest, PreemptRequest, Task, TaskEnd
from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _task(task_id: int, tenant: int) -> Task:
    return Task(task_id, task_id, tenant, (1,), 0, 60.0, 0.0)


def _launch(seq: int, task: Task, host: int) -> bytes:
    return encode_launch(LaunchRequest(0, seq, 0, host, task, False, attempt=1))


def _preempt(seq: int, task: Task, host: int, victims: tuple[int, ...]) -> bytes:
    return encode_launch(PreemptRequest(0, seq, 0, host, victims, task, attempt=1))


async def _send(bootstrap: str, records: list[bytes]) -> None:
    await send(bootstrap, LAUNCHES, records, key=b"pool-0", partition=0)


async def _verdicts(bootstrap: str) -> list[dict[str, Any]]:

    return [
        orjson.loads(r.value) for r in await read_partition(bootstrap, "lavad.federation.verdicts")
    ]


async def test_preemptions_and_ends_validated_live(broker: EmbeddedBroker, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, pools=1, queues=1)
    config = str(
        federation_config(
            tmp_path / "f.toml",
            bootstrap,
            pools=1,
            hosts_per_pool=2,
            schedulers=1,
            tenants=2,
            owner_snapshot_every=1000,  # the takeover replays everything after the first
        )
    )
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    owner_a = start(logs["a"], "owner", "--instance", "a", "--config", config)
    processes = [owner_a]
    try:

        async def taken() -> bool:
            return "pool taken" in logs["a"].read_text()

        await until(taken, 60, "owner a to take the pool")
        records = [
            _launch(1, _task(1, tenant=1), host=0),
            _launch(2, _task(2, tenant=1), host=1),
            encode_end(TaskEnd(pool=0, task_id=2)),
            _preempt(3, _task(3, tenant=0), host=0, victims=(1,)),
            _preempt(4, _task(4, tenant=0), host=1, victims=(2,)),  # 2 has ended
            _preempt(5, _task(5, tenant=0), host=0, victims=(3,)),  # 3 is tenant 0's own
            b'{"kind": "preempt", "victims": "all", "v": 1}',
            encode_end(TaskEnd(pool=0, task_id=99)),
        ]
        await _send(bootstrap, records)

        async def seven() -> list[dict[str, Any]] | None:
            found = await _verdicts(bootstrap)
            return found if len(found) >= 7 else None

        first = await until(seven, 60, "7 verdicts")
        owner_a.send_signal(signal.SIGKILL)
        owner_a.wait()
        owner_b = start(logs["b"], "owner", "--instance", "b", "--config", config)
        processes.append(owner_b)
        await _send(bootstrap, [_launch(6, _task(6, tenant=1), host=1)])

        async def all_of_them() -> list[dict[str, Any]] | None:
            found = await _verdicts(bootstrap)
            return found if any(v["task"] == 6 for v in found) else None

        every = await until(all_of_them, 60, "owner b's verdict for task 6")
    finally:
        stop_all(processes)
    by = {(v["kind"], v["task"]): v for v in first}
    assert len(first) == 7 and len(by) == 7
    assert by[("launch", 1)]["accepted"] and by[("launch", 2)]["accepted"]
    assert by[("end", 2)]["accepted"]
    preempted = by[("preempt", 3)]
    assert preempted["accepted"] and preempted["preempted"] == [1] and preempted["host"] == 0
    ended_victim = by[("preempt", 4)]
    assert not ended_victim["accepted"] and not ended_victim["final"]
    assert ended_victim["reason"] == "preemption of task 2, which is not running (it ended)"
    own = by[("preempt", 5)]
    assert not own["accepted"] and own["final"]
    assert own["reason"] == "task 3 belongs to tenant 0, the requester"
    never = by[("end", 99)]
    assert not never["accepted"] and never["reason"] == "end of task 99, which is not running here"
    # the refusal on a stale view carries the owner's summary: task 3 holds host 0 in
    # task 1's place, host 1 is free since task 2 ended
    assert ended_victim["summary"]["free"] == [[0], [1]]
    assert ended_victim["summary"]["tenant_usage"] == [[1], [0]]
    letters = await read_partition(bootstrap, DEAD_LETTERS)
    reasons = {dict(r.headers)["lavad.reason"].decode() for r in letters}
    assert reasons == {"preempt: victims must be a list of at most 64"}, reasons
    # owner b replayed the pool from its first snapshot: the same verdicts, then task 6
    decision = ("accepted", "final", "host", "reason", "preempted")
    replayed = [v for v in every if v["instance"] == "b"]
    assert len(replayed) == 8
    for verdict in replayed[:-1]:
        before = by[(verdict["kind"], verdict["task"])]
        assert [verdict.get(k) for k in decision] == [before.get(k) for k in decision]
    assert replayed[-1]["task"] == 6 and replayed[-1]["accepted"] and replayed[-1]["host"] == 1
