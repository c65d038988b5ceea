"""The Kafka clients the live federation's processes share one configuration of."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.live.connection import client_options
from lavad.daemon.live.retry import unless_stopped

OWNERS_GROUP = "lavad-federation-owners"
SCHEDULERS_GROUP = "lavad-federation-schedulers"


def group_consumer(kafka: KafkaSettings, group_id: str) -> AIOKafkaConsumer:
    """A member of ``group_id`` that commits by hand and starts a new group from the
    beginning; the session timeout is the failover time's first part (the federation's
    default is 4 s, settings.py)."""
    return AIOKafkaConsumer(
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        partition_assignment_strategy=(RangePartitionAssignor,),
        **client_options(kafka),
    )


def plain_consumer(kafka: KafkaSettings) -> AIOKafkaConsumer:
    """A consumer outside any group, for reading topics by hand."""
    return AIOKafkaConsumer(enable_auto_commit=False, **client_options(kafka))


def producer(kafka: KafkaSettings) -> AIOKafkaProducer:
    """acks=all: a launch, verdict or summary counts once every in-sync replica has it."""
    return AIOKafkaProducer(acks="all", **client_options(kafka))


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """``topic``'s partitions in order. A consumer that has not yet asked for the
    topic knows none of them, so it fetches the cluster's metadata once first."""
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        await consumer.topics()
        parts = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, p) for p in sorted(parts)]


async def fetches(
    consumer: AIOKafkaConsumer, stop: asyncio.Event, *, timeout_ms: int
) -> AsyncIterator[dict[TopicPartition, list[Any]]]:
    """The consumer's batches of at most 500 records, each fetch waiting ``timeout_ms``
    at most for records, until ``stop`` is set. A stop also ends a fetch waiting on a
    rebalance that does not end: ``getmany`` has no timeout for that."""
    while not stop.is_set():
        batch = await unless_stopped(consumer.getmany(timeout_ms=timeout_ms, max_records=500), stop)
        if batch is None:
            return
        yield batch


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
