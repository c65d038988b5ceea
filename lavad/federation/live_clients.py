"""The Kafka clients the live federation's processes share one configuration of."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

# A crashed member is noticed within 4 s (aiokafka's default is 10 s): the
# failover time is this timeout plus a rebalance, so it is kept short.
SESSION_TIMEOUT_MS = 4000
HEARTBEAT_INTERVAL_MS = 500

OWNERS_GROUP = "lavad-federation-owners"
SCHEDULERS_GROUP = "lavad-federation-schedulers"


def group_consumer(bootstrap: str, group_id: str) -> AIOKafkaConsumer:
    """A member of ``group_id`` that commits by hand and starts a new group from the beginning."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        partition_assignment_strategy=(RangePartitionAssignor,),
    )


async def read_partition(
    bootstrap: str, topic: str, partition: int = 0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of one topic partition, from the beginning to its end offset now."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        while await consumer.position(tp) < end:
            for batch in (await consumer.getmany(tp, timeout_ms=300)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records
