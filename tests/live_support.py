"""Helpers for the live-shell tests against a real broker (imported as ``live_support``)."""

from __future__ import annotations

import asyncio
import heapq
import io
import itertools
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from lavad.daemon.live.shell import live_engine_config
from lavad.daemon.replay import replay
from lavad.daemon.settings import Settings, load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import TopicNames, ensure_topics
from lavad.streams.schema import Event

PROJECT_ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"
NAMES = TopicNames()


def two_pool_events(per_pool: int) -> list[Event]:
    """The bundled Azure slice as two pools (two lifetime-sampling seeds), merged by time."""
    pools = []
    for seed, pool in ((0, "east"), (1, "west")):
        events = (
            item
            for item in open_trace(AZURE_SLICE, seed=seed, pool=pool).events()
            if not isinstance(item, BadRecord)
        )
        pools.append(list(itertools.islice(events, per_pool)))
    return list(heapq.merge(*pools, key=lambda event: event.time))


def live_settings(bootstrap: str, snapshots: Path, **live: Any) -> Settings:
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={"bootstrap_servers": bootstrap, "request_timeout_ms": 3000}
            ),
            "live": settings.live.model_copy(update={"snapshot_dir": snapshots, **live}),
            "http": settings.http.model_copy(update={"port": 0}),
        }
    )


def replay_in_process(settings: Settings, events: Iterable[Event]) -> dict[str, list[bytes]]:
    """Decisions of an in-process replay, per pool, as published bytes."""
    sink = io.BytesIO()
    replay(events, live_engine_config(settings), decisions_out=sink)
    return by_pool(sink.getvalue().splitlines())


def by_pool(lines: Iterable[bytes]) -> dict[str, list[bytes]]:
    import orjson  # noqa: PLC0415

    pools: dict[str, list[bytes]] = {}
    for line in lines:
        pools.setdefault(orjson.loads(line)["pool"], []).append(line)
    return pools


async def create_topics(bootstrap: str, partitions: int = 3) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, NAMES, partitions)
    finally:
        await admin.close()


async def produce(bootstrap: str, items: Iterable[Event | BadRecord]) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        return (await publish_trace(items, producer, NAMES)).records
    finally:
        await producer.stop()


async def produce_raw(bootstrap: str, topic: str, values: list[tuple[bytes | None, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in values]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str, topic: str, *, at_least: int, timeout_s: float = 60.0
) -> list[Any]:
    """Every record of ``topic`` from the beginning, once at least ``at_least`` are there."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    records: list[Any] = []
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer.topics()
            partitions = consumer.partitions_for_topic(topic) or set()
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + timeout_s
        while len(records) < at_least and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for part in batch.values():
                records.extend(part)
        # Anything straggling right behind the last fetch.
        batch = await consumer.getmany(timeout_ms=300)
        for part in batch.values():
            records.extend(part)
    finally:
        await consumer.stop()
    return records


async def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval)
