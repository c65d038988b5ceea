"""Helpers for the live-shell tests against a real broker (imported as ``live_support``)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import io
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from lavad.core.engine import Handler, Handlers, PlainStrategy, PoolRuntime
from lavad.daemon.live.shell import live_engine_config
from lavad.daemon.replay import replay
from lavad.daemon.settings import Settings, load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import TopicNames, ensure_topics
from lavad.streams.schema import Decision, Event, VmRequest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"
NAMES = TopicNames()
PUBLISHED_MS = 1_767_225_600_000


@dataclass(frozen=True)
class Record:
    """A fetched record as the intake reads it (aiokafka's ConsumerRecord's fields it uses)."""

    offset: int
    value: bytes | None
    # When a producer would have published it, in Kafka's milliseconds since
    # the epoch (2026-01-01): the bundled traces' event times are long before.
    timestamp: int = PUBLISHED_MS
    key: bytes | None = b"default"


def placed_vm_ids(out: Iterable[Any]) -> list[str]:
    """The VMs of the placements among the intake's outgoing records, in order."""
    return [orjson.loads(item.value)["vm_id"] for item in out if item.topic == NAMES.placements]


@dataclass
class FakeConsumer:
    """The one consumer call the intake makes on its own: a seek, recorded."""

    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


def two_pool_events(per_pool: int) -> list[Event]:
    """The bundled Azure slice as two pools (two lifetime-sampling seeds), merged by time."""
    return pool_events(("east", "west"), per_pool)


def pool_events(names: Iterable[str], per_pool: int) -> list[Event]:
    """The bundled Azure slice once per pool (seeded apart), merged by time."""
    pools = []
    for seed, pool in enumerate(names):
        events = (
            item
            for item in open_trace(AZURE_SLICE, seed=seed, pool=pool).events()
            if not isinstance(item, BadRecord)
        )
        pools.append(list(itertools.islice(events, per_pool)))
    return list(heapq.merge(*pools, key=lambda event: event.time))


class DefectAt(PlainStrategy):
    """Books ``vm_id``'s request in ``pool`` as the engine does, then raises: a defect met
    half-way, leaving the pool's state half-changed (pools made of one slice share VM ids);
    with ``leaves``, that value in the pool's counters too (one the state codec refuses)."""

    def __init__(self, pool: str, vm_id: str, *, leaves: object = None) -> None:
        self.pool = pool
        self.vm_id = vm_id
        self.leaves = leaves

    def handlers(self, plain: Handlers) -> Handlers:
        request = plain[VmRequest]

        def half_way(pool: PoolRuntime, event: VmRequest, now: float) -> list[Decision]:
            decisions = request(pool, event, now)
            if event.vm_id == self.vm_id and event.pool == self.pool:
                if self.leaves is not None:
                    pool.counters["left by the defect"] = self.leaves  # type: ignore[assignment]
                raise RuntimeError(f"injected defect after booking {event.vm_id}")
            return decisions

        replaced: Handler = half_way
        return {**plain, VmRequest: replaced}


class OpeningFails(PlainStrategy):
    """Opening pool ``pool`` raises, the first ``times`` times."""

    def __init__(self, pool: str, times: int) -> None:
        self.pool = pool
        self.left = times

    def open_pool(self, pool: PoolRuntime) -> PoolRuntime:
        if pool.name == self.pool and self.left:
            self.left -= 1
            raise MemoryError("injected while opening")
        return pool


def live_settings(bootstrap: str, snapshots: Path, **live: Any) -> Settings:
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={
                    "bootstrap_servers": bootstrap,
                    "request_timeout_ms": 3000,
                    # As ``DaemonProcess``'s: the embedded broker holds a new
                    # group's join for half the session timeout (5 s at the
                    # default 10 s, 2 s at 4 s), once per daemon started.
                    "session_timeout_ms": 4000,
                    "heartbeat_interval_ms": 500,
                }
            ),
            "live": settings.live.model_copy(update={"snapshot_dir": snapshots, **live}),
            "http": settings.http.model_copy(update={"port": 0}),
        }
    )


def with_section(settings: Settings, section: str, **changes: Any) -> Settings:
    """``settings`` with fields of its ``section`` (a pydantic table) changed, the rest kept."""
    table = getattr(settings, section).model_copy(update=changes)
    return settings.model_copy(update={section: table})


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


async def produce_raw(
    bootstrap: str,
    topic: str,
    values: list[tuple[bytes | None, bytes]],
    max_request_size: int = 1 << 20,
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=max_request_size
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in values]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def _from_beginning(bootstrap: str, topic: str) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer outside any group, on every partition of ``topic``, at its first offset."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer.topics()
            partitions = consumer.partitions_for_topic(topic) or set()
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        await consumer.seek_to_beginning()
        yield consumer
    finally:
        await consumer.stop()


async def _read_until(
    consumer: AIOKafkaConsumer, done: Callable[[list[Any]], bool], timeout_s: float
) -> list[Any]:
    """Records until ``done`` says so (called after each fetch) or time is up, then stragglers."""
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not done(records) and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        for part in batch.values():
            records.extend(part)
    # Anything straggling right behind the last fetch.
    batch = await consumer.getmany(timeout_ms=300)
    for part in batch.values():
        records.extend(part)
    return records


async def read_topic(
    bootstrap: str, topic: str, *, at_least: int, timeout_s: float = 60.0
) -> list[Any]:
    """Every record of ``topic`` from the beginning, once at least ``at_least`` are there."""
    async with _from_beginning(bootstrap, topic) as consumer:
        return await _read_until(consumer, lambda records: len(records) >= at_least, timeout_s)


async def read_decisions(
    bootstrap: str, topic: str, expected: Iterable[str], *, timeout_s: float = 90.0
) -> list[Any]:
    """Every record of ``topic`` once each ``expected`` decision id is among them (or time is up).

    After a crash a topic holds duplicates (decisions published again from a
    snapshot), so a record count can be reached while a restarted instance is
    still publishing: only the ids say when everything is there.
    """
    import orjson  # noqa: PLC0415

    wanted = set(expected)
    seen = 0

    def all_there(records: list[Any]) -> bool:
        nonlocal seen
        wanted.difference_update(orjson.loads(r.value)["decision_id"] for r in records[seen:])
        seen = len(records)
        return not wanted

    async with _from_beginning(bootstrap, topic) as consumer:
        return await _read_until(consumer, all_there, timeout_s)


async def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval)


class DaemonProcess:
    """``lavad run`` as a child process, configured through LAVAD_* variables."""

    def __init__(self, bootstrap: str, snapshots: Path, log: Path, **settings: str) -> None:
        import os  # noqa: PLC0415
        import subprocess  # noqa: PLC0415
        import sys  # noqa: PLC0415

        from lavad.streams.kafka.embedded import free_port  # noqa: PLC0415

        self.port = free_port()
        env = {
            **os.environ,
            "LAVAD_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "LAVAD_KAFKA__REQUEST_TIMEOUT_MS": "3000",
            # Crashed instances leave the group sooner (the tests kill some).
            "LAVAD_KAFKA__SESSION_TIMEOUT_MS": "4000",
            "LAVAD_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
            "LAVAD_LIVE__SNAPSHOT_DIR": str(snapshots),
            "LAVAD_HTTP__PORT": str(self.port),
            **settings,
        }
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from lavad.daemon.cli import main; main()",
                "run",
                "--config",
                str(PROJECT_ROOT / "config" / "lavad.toml"),
            ],
            env=env,
            stdout=self._log,
            stderr=self._log,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def get(self, path: str) -> tuple[int, str]:
        import aiohttp  # noqa: PLC0415

        async with (
            aiohttp.ClientSession() as session,
            # Prometheus's default scrape timeout: a loaded CI box can keep a
            # scrape waiting behind a batch or a snapshot for a while.
            session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=10)) as response,
        ):
            return response.status, await response.text()

    async def status(self, path: str) -> int | None:
        import aiohttp  # noqa: PLC0415

        try:
            return (await self.get(path))[0]
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def wait_status(self, path: str, status: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (await self.status(path)) != status:
            if self.process.poll() is not None:
                raise AssertionError(f"the daemon exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} did not answer {status} within {timeout_s} s")
            await asyncio.sleep(0.1)

    def kill(self) -> None:
        import signal  # noqa: PLC0415

        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._log.close()

    def stop(self) -> int:
        import signal  # noqa: PLC0415
        import subprocess  # noqa: PLC0415

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def decision_ids(records: Iterable[Any]) -> dict[str, set[bytes]]:
    """Decision id -> every distinct published body under it."""
    import orjson  # noqa: PLC0415

    seen: dict[str, set[bytes]] = {}
    for record in records:
        seen.setdefault(orjson.loads(record.value)["decision_id"], set()).add(record.value)
    return seen
