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
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from lavad.streams.codec import BadRecord, encode
from lavad.streams.kafka.topics import TopicNames
from lavad.streams.schema import Event


class RecordProducer(Protocol):
    """The part of aiokafka's producer this uses."""

    async def send(
        self, topic: str, value: bytes | None = ..., key: bytes | None = ...
    ) -> Awaitable[Any]: ...


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
    ``progress`` gets the number of records the broker has acknowledged
    (after ``skip``) each time that number moves: when this raises, its last
    value says how far the run got.
    """
    if speed < 0:
        raise ValueError(f"speed must be >= 0, got {speed}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    started = time.monotonic()
    first_time: float | None = None
    pending: list[Awaitable[Any]] = []
    records = unreadable = 0

    async def drain() -> None:
        if pending:
            await _drain(pending)
            if progress is not None:
                progress(records)

    for item in itertools.islice(items, skip, None):
        if limit is not None and records >= limit:
            break
        if isinstance(item, BadRecord):
            unreadable += 1
            pending.append(await producer.send(names.vm_events, item.raw, key=None))
        else:
            if speed > 0:
                if first_time is None:
                    first_time = item.time
                due = started + (item.time - first_time) / speed
                wait = due - time.monotonic()
                if wait > 0:
                    await drain()
                    await asyncio.sleep(wait)
            topic = names.for_event_type(item.type)
            pending.append(await producer.send(topic, encode(item), key=item.pool.encode()))
        records += 1
        if len(pending) >= chunk:
            await drain()
    await drain()
    return PublishResult(records, unreadable, time.monotonic() - started)


async def _drain(pending: list[Awaitable[Any]]) -> None:
    if pending:
        await asyncio.gather(*pending)
        pending.clear()
