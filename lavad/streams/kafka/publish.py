"""Publish a recorded trace to the input topics, as fast as possible or at X times real time.

Each event goes to the topic for its type, keyed by its pool, as canonical
schema-v1 JSON. A row the trace adapter could not read is published as its
original bytes (to the VM-events topic, unkeyed): the daemon then
dead-letters it with the reason, exactly as it would a bad record from any
other producer, so nothing is dropped on the way.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from lavad.streams.codec import BadRecord, encode
from lavad.streams.kafka.topics import TopicNames
from lavad.streams.schema import Event


class RecordProducer(Protocol):
    """The part of aiokafka's producer this uses."""

    async def send(
        self, topic: str, value: bytes | None = ..., key: bytes | None = ...
    ) -> asyncio.Future[Any]: ...


@dataclass(slots=True)
class PublishResult:
    records: int
    unreadable_rows: int
    wall_seconds: float


async def publish_trace(
    items: Iterable[Event | BadRecord],
    producer: RecordProducer,
    names: TopicNames,
    *,
    speed: float = 0.0,
    limit: int | None = None,
    skip: int = 0,
    progress: Callable[[int], None] | None = None,
    chunk: int = 5_000,
) -> PublishResult:
    """Send ``items`` in order; ``speed`` 0 means as fast as the broker takes them.

    The first ``skip`` items are not sent (to resume an interrupted run).
    ``progress`` gets the length of the unbroken run of records from the
    first that the broker has acknowledged, each time it grows. It keeps
    growing while the producer flushes after this was cancelled or failed,
    so once the producer has stopped its last value is how far the trace got:
    ``skip`` plus that resumes without sending a record twice.
    """
    if speed < 0:
        raise ValueError(f"speed must be >= 0, got {speed}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    started = time.monotonic()
    first_time: float | None = None
    pending: list[asyncio.Future[Any]] = []
    records = unreadable = 0
    acknowledged = _AcknowledgedPrefix(progress)

    async def send(topic: str, value: bytes, key: bytes | None) -> None:
        delivery = await producer.send(topic, value, key=key)
        acknowledged.track(delivery)
        pending.append(delivery)

    for item in itertools.islice(items, skip, None):
        if limit is not None and records >= limit:
            break
        if isinstance(item, BadRecord):
            unreadable += 1
            await send(names.vm_events, item.raw, None)
        else:
            if speed > 0:
                if first_time is None:
                    first_time = item.time
                due = started + (item.time - first_time) / speed
                wait = due - time.monotonic()
                if wait > 0:
                    await _drain(pending)
                    await asyncio.sleep(wait)
            await send(names.for_event_type(item.type), encode(item), item.pool.encode())
        records += 1
        if len(pending) >= chunk:
            await _drain(pending)
    await _drain(pending)
    return PublishResult(records, unreadable, time.monotonic() - started)


async def _drain(pending: list[asyncio.Future[Any]]) -> None:
    if pending:
        # wait, not gather: cancelling gather (Ctrl-C) would cancel these
        # futures while their records still go out in the producer's final
        # flush, and the acknowledged count would miss them.
        await asyncio.wait(pending)
        for delivery in pending:
            delivery.result()  # the first failure, if any
        pending.clear()


class _AcknowledgedPrefix:
    """Counts the records acknowledged without a gap from the first one sent.

    Deliveries complete out of order (one batch per partition), so a record
    counts only once every record before it is in too.
    """

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self._progress = progress
        self._sent = 0
        self.count = 0
        self._ahead: set[int] = set()

    def track(self, delivery: asyncio.Future[Any]) -> None:
        number = self._sent
        self._sent += 1
        delivery.add_done_callback(lambda done: self._done(number, done))

    def _done(self, number: int, delivery: asyncio.Future[Any]) -> None:
        if delivery.cancelled() or delivery.exception() is not None:
            return
        self._ahead.add(number)
        before = self.count
        while self.count in self._ahead:
            self._ahead.remove(self.count)
            self.count += 1
        if self.count != before and self._progress is not None:
            self._progress(self.count)
