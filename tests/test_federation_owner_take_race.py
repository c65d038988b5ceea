"""A pool owner never applies a batch fetched before it took the pool.

aiokafka fetches a newly assigned partition from the group's committed offset while
the rebalance listener (``Owner.take``) restores the pool's snapshot, and a batch it
returned then can reach ``Owner.handle`` after the take. Applied to the restored
state, that batch skipped the launches between the snapshot's offset and the
committed one: their hosts looked free and went to a second task (seen once in the
live test's kill -9 of an owner). Small fakes stand in for the Kafka clients here:
the order of events is the point, and a broker cannot be made to produce it on cue.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation import live_owner
from lavad.federation.live_owner import Owner
from lavad.federation.live_wire import (
    LAUNCHES,
    VERDICTS,
    LaunchVerdict,
    decode_verdict,
    encode_launch,
)
from lavad.federation.messages import LaunchRequest, Task
from lavad.federation.owner_snapshots import SnapshotReader
from lavad.federation.topology import uniform_topology

POOL = TopicPartition(LAUNCHES, 0)


@dataclass
class Record:
    offset: int
    value: bytes
    timestamp: int = 1_000
    key: bytes | None = None


@dataclass
class FakeConsumer:
    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(offsets)


@dataclass
class FakeProducer:
    sent: list[tuple[str, bytes]] = field(default_factory=list)

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        self.sent.append((topic, value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def verdicts(self) -> list[LaunchVerdict]:
        found = [decode_verdict(value) for topic, value in self.sent if topic == VERDICTS]
        return [v for v in found if isinstance(v, LaunchVerdict)]


def _launch(task: int, host: int, seq: int) -> bytes:
    return encode_launch(
        LaunchRequest(
            gm=0,
            seq=seq,
            pool=0,
            host=host,
            task=Task(
                task, job=task, tenant=0, demand=(1,), constraints=0, duration=60.0, arrival=0.0
            ),
            repartition=False,
            attempt=1,
        )
    )


# Offsets 0-2 of the pool's partition: task 0 on host 0; task 1 on host 0 too (a
# stale view), which an owner that applied offset 0 refuses (one slot a host); task 2
# on host 1.
LAUNCH_RECORDS = [
    Record(0, _launch(0, host=0, seq=1)),
    Record(1, _launch(1, host=0, seq=2)),
    Record(2, _launch(2, host=1, seq=3)),
]


async def test_a_batch_fetched_before_the_take_is_fetched_again_from_the_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def no_snapshot(kafka: KafkaSettings) -> SnapshotReader:
        return SnapshotReader()  # the pool restores empty, at offset 0

    monkeypatch.setattr(live_owner, "latest_snapshots", no_snapshot)
    owner = Owner(KafkaSettings(), "b", uniform_topology(1, 4, 1), 1, 1000)
    consumer, producer = FakeConsumer(), FakeProducer()
    owner.consumer, owner.producer = consumer, producer
    before = owner.takes.get(0, 0)
    await owner.take([POOL])
    assert consumer.seeks == [(POOL, 0)]
    # The batch the fetcher took from the committed offset (1) before the take's seek:
    # not applied, and the partition is sought back to where the restored state is.
    await owner.handle(POOL, LAUNCH_RECORDS[1:], before)
    assert producer.sent == []
    assert consumer.commits == []
    assert consumer.seeks == [(POOL, 0), (POOL, 0)]
    assert owner.next_offset[0] == 0
    # Fetched again from offset 0, after the take: each launch answered in order.
    await owner.handle(POOL, LAUNCH_RECORDS, owner.takes[0])
    answers = {v.request.task_id: v.accepted for v in producer.verdicts()}
    assert answers == {0: True, 1: False, 2: True}  # host 0 is task 0's: given once
    assert consumer.commits == [{POOL: 3}]
