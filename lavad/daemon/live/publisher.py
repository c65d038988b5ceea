"""The publishing path of the live shell: decisions and dead letters out, acknowledged.

A batch is published with acks=all and waited for; whatever the broker did
not acknowledge is sent again (``Backoff`` between attempts) until all of it
is in or the daemon is asked to stop (``Stopping``). Only then may the caller
commit the input offsets, which is what makes delivery at least once. With
``kafka.transactional_id`` set, decisions and offsets commit in one Kafka
transaction instead, retried whole.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from lavad.daemon.live.retry import Backoff
from lavad.daemon.live.telemetry import Telemetry

log = structlog.get_logger("lavad.live")


@dataclass(slots=True)
class Outgoing:
    """A record to publish: a decision or a dead letter, and the input it answers."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    source_timestamp_ms: int | None
    label: str  # decision kind, or "dead_letter"


class Stopping(Exception):
    """Shutdown was requested while a batch could not be published."""


class Publisher:
    """Sends batches of ``Outgoing`` on one producer; ``producer`` is set once connected."""

    def __init__(
        self,
        telemetry: Telemetry,
        backoff: Callable[[], Backoff],
        group_id: str,
        on_failure: Callable[[], None],
    ) -> None:
        self.producer: Any = None
        self.telemetry = telemetry
        self._backoff = backoff
        self._group_id = group_id
        # Called when the broker did not acknowledge: the daemon is not ready.
        self._on_failure = on_failure
        self._route: dict[tuple[str, bytes | None], int] = {}
        self._partitioner = DefaultPartitioner()

    async def publish(self, out: list[Outgoing], stop: asyncio.Event) -> None:
        """Send every record and wait for acks=all; re-send what failed until all are in.

        Records go out as one producer batch per (topic, partition), in the
        order they were decided; the partition is the one aiokafka's default
        partitioner gives the key (the pool), so a pool's decisions stay in
        order on one partition. Unkeyed dead letters go to partition 0.
        """
        pending = out
        backoff = self._backoff()
        while pending:
            failed: list[Outgoing] = []
            try:
                sent = await self._send_batches(pending)
            except KafkaError as exc:
                log.warning("publish could not be queued", error=repr(exc))
                sent, failed = [], pending
            results = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
            acked = time.time()
            published: list[Outgoing] = []
            for (items, _), result in zip(sent, results, strict=True):
                (failed if isinstance(result, BaseException) else published).extend(items)
            self._count_published(published, acked)
            if not failed:
                return
            self._on_failure()
            self.telemetry.publish_retries.inc()
            log.warning("publish failed, retrying", records=len(failed), retry_in_s=backoff.delay)
            if stop.is_set():
                raise Stopping
            await backoff.wait(stop)
            pending = failed

    async def publish_transaction(
        self,
        out: list[Outgoing],
        offsets: Callable[[], dict[TopicPartition, int]],
        stop: asyncio.Event,
    ) -> None:
        """Decisions and input offsets in one transaction, retried whole until it commits."""
        producer = self.producer
        backoff = self._backoff()
        while True:
            try:
                async with producer.transaction():
                    futures = [
                        await producer.send(i.topic, i.value, key=i.key, headers=i.headers)
                        for i in out
                    ]
                    await asyncio.gather(*futures)
                    await producer.send_offsets_to_transaction(offsets(), self._group_id)
            except KafkaError as exc:
                self.telemetry.publish_retries.inc()
                log.warning(
                    "transaction failed, retrying", error=repr(exc), retry_in_s=backoff.delay
                )
                if stop.is_set():
                    raise Stopping from None
                await backoff.wait(stop)
                continue
            self._count_published(out, time.time())
            return

    async def _send_batches(
        self, items: list[Outgoing]
    ) -> list[tuple[list[Outgoing], Awaitable[Any]]]:
        producer = self.producer
        groups: dict[tuple[str, int], list[Outgoing]] = {}
        route = self._route
        for item in items:
            # Keys are pool names, a handful: murmur2 in Python costs ~9 us a call.
            partition = route.get((item.topic, item.key))
            if partition is None:
                partitions = sorted(await producer.partitions_for(item.topic))
                partition = (
                    self._partitioner(item.key, partitions, partitions)
                    if item.key is not None
                    else partitions[0]
                )
                route[item.topic, item.key] = partition
            groups.setdefault((item.topic, partition), []).append(item)
        sent: list[tuple[list[Outgoing], Awaitable[Any]]] = []
        for (topic, partition), group in groups.items():
            batch = producer.create_batch()
            members: list[Outgoing] = []
            for item in group:
                appended = batch.append(
                    key=item.key, value=item.value, timestamp=None, headers=item.headers
                )
                if appended is None:  # full: send it and start the next
                    batch.close()
                    future = await producer.send_batch(batch, topic, partition=partition)
                    sent.append((members, future))
                    batch, members = producer.create_batch(), []
                    batch.append(
                        key=item.key, value=item.value, timestamp=None, headers=item.headers
                    )
                members.append(item)
            # Closed, it goes out at once: an open one lingers (linger_ms), and the
            # event loop is busy deciding the next batch meanwhile.
            batch.close()
            future = await producer.send_batch(batch, topic, partition=partition)
            sent.append((members, future))
        return sent

    def _count_published(self, items: list[Outgoing], acked: float) -> None:
        kinds: Counter[str] = Counter(item.label for item in items)
        kinds.pop("dead_letter", None)
        for kind, count in kinds.items():
            self.telemetry.decisions.labels(kind).inc(count)
        stamps = [
            item.source_timestamp_ms
            for item in items
            if item.source_timestamp_ms is not None and item.label != "dead_letter"
        ]
        if stamps:
            latencies = acked - np.asarray(stamps, dtype=np.float64) / 1e3
            self.telemetry.decision_latency.observe_many(np.maximum(latencies, 0.0))
