"""The launches not yet answered: what a global scheduler reads when it takes tenant
queues over, so that it waits for their verdicts instead of launching the same
requests again.

An owner commits its launch offset only after the verdicts of the launches before it
are published, so every launch before the owners' committed offset has its verdict
on the verdicts topic; the ones after it, up to the topic's end, may not yet.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.live_clients import OWNERS_GROUP, plain_consumer, topic_partitions
from lavad.federation.live_wire import LAUNCHES, WireError, decode_owner_record
from lavad.federation.messages import TaskEnd

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class SentLaunch:
    task: int
    attempt: int
    gm: int
    seq: int
    pool: int
    queue: int  # the request's tenant queue, and its offset there
    request_offset: int


async def launches_since_owners_commit(
    kafka: KafkaSettings, admin: AIOKafkaAdminClient
) -> list[SentLaunch]:
    """Every launch from the owners' committed offset of each launch partition to its
    end now (from the beginning where the owners have committed nothing)."""
    consumer = plain_consumer(kafka)
    await consumer.start()
    found: list[SentLaunch] = []
    try:
        tps = await topic_partitions(consumer, LAUNCHES)
        if not tps:
            return found
        committed = await admin.list_consumer_group_offsets(OWNERS_GROUP, partitions=tps)
        consumer.assign(tps)
        starts = await consumer.beginning_offsets(tps)
        for tp in tps:
            mark = committed.get(tp)
            consumer.seek(tp, mark.offset if mark is not None and mark.offset >= 0 else starts[tp])
        ends = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(*tps, timeout_ms=300)
            for records in batch.values():
                for record in records:
                    if record.offset >= ends[TopicPartition(record.topic, record.partition)]:
                        continue  # sent after the takeover began: by a scheduler that owns it
                    if record.value is None:
                        continue
                    try:
                        launch = decode_owner_record(record.value)
                    except WireError:
                        continue  # not a launch: the owner dead-letters it
                    if isinstance(launch, TaskEnd):
                        continue
                    found.append(
                        SentLaunch(
                            launch.task.task_id,
                            launch.attempt,
                            launch.gm,
                            launch.seq,
                            launch.pool,
                            launch.task.tenant,
                            launch.request_offset,
                        )
                    )
    finally:
        await consumer.stop()
    return found
