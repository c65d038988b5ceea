"""Partition snapshots on a Kafka topic, so an instance on any machine restores a
partition it is assigned (``live.snapshot_store = "topic"``; files stay the default).

A snapshot is written as chunks of at most ``live.snapshot_chunk_bytes`` (a broker
refuses messages past its ``message.max.bytes``), then a manifest: the snapshot's
header (format, version, engine fingerprint, partition, offsets, pools, checksum of
the whole body) and its chunk count. Only then are the previous snapshot's chunks
deleted (tombstones), so at every moment the newest manifest names chunks that exist.
Keys: ``<group>/<partition>/manifest`` and ``<group>/<partition>/<snapshot>/<chunk>``,
so on a compacted topic (``cleanup.policy=compact``, which this store asks for when it
creates the topic) the newest manifest of each partition and its chunks are what stays.

Every record of a partition goes to topic partition ``partition % count``. Restoring
reads that topic partition from its start to its end as of the call and keeps the
newest manifest for the partition: a crash between chunks leaves no new manifest (the
previous snapshot stays the newest complete one); a manifest whose chunks are missing
(torn), or that belongs to another group, partition, format or engine configuration
(foreign), is refused with the reason, never half-loaded.

The store's interface is synchronous, like the file store's (a save blocks until
the broker has acknowledged every record, as a file save blocks on fsync): aiokafka
runs on an event loop of the store's own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.live.connection import client_options
from lavad.daemon.live.snapshots import (
    PartitionSnapshot,
    SnapshotError,
    SnapshotStorage,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot,
)
from lavad.daemon.settings import Settings

TOPIC_RECORD_FORMAT = "lavad.snapshot-record"
log = structlog.get_logger("lavad.live")

TIMEOUT_S = 60.0
# Attempts at reading a snapshot while the broker answers with transient errors,
# the first retry after LOAD_RETRY_S, each next one after twice as long.
LOAD_ATTEMPTS = 4
LOAD_RETRY_S = 0.5
# A prefetch holds the snapshots it reads until the rebalance ends; past this
# many bytes it stops (a large group's state need not fit on one instance).
PREFETCH_MAX_BYTES = 256 * 1024 * 1024
T = TypeVar("T")


@dataclass(slots=True)
class _Seen:
    """What the store's reader has read of one snapshot-topic partition, up to ``position``.

    The newest manifest per key, and the chunks not deleted since. A later
    load reads on from ``position`` instead of from the start. After a load
    the loaded snapshot's chunk bodies are let go (``partial``): this
    instance now holds that state itself, and a load that then misses a
    chunk reads the partition again from its start.
    """

    position: int = 0
    manifests: dict[bytes, tuple[int, Any]] = field(default_factory=dict)
    chunks: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)
    partial: bool = False


def _record(header: dict[str, Any], payload: bytes = b"") -> bytes:
    return orjson.dumps(header) + b"\n" + payload


class TopicSnapshotStore:
    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        group: str,
        *,
        chunk_bytes: int = 512 * 1024,
        partitions: int = 1,
    ) -> None:
        if chunk_bytes < 1024:
            raise ValueError(f"live.snapshot_chunk_bytes: want >= 1024, got {chunk_bytes}")
        self.kafka = kafka
        self.topic = topic
        self.group = group
        self.chunk_bytes = chunk_bytes
        self.create_partitions = partitions
        self._count: int | None = None
        self._producer: AIOKafkaProducer | None = None
        # One reader for every load: starting a consumer per partition cost
        # more than reading the snapshot (a failover restores several).
        self._reader: AIOKafkaConsumer | None = None
        self._seen: dict[int, _Seen] = {}
        # The reader serves one load or prefetch at a time (on the store's loop).
        self._reading: asyncio.Lock | None = None
        self._prefetching: Future[None] | None = None
        # per partition: (snapshot id, chunk count) of the newest manifest this store
        # wrote or read, whose chunks the next save deletes once its own manifest is in
        self._current: dict[int, tuple[str, int]] = {}
        self._generation: dict[int, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="lavad-snapshot-topic", daemon=True
        )
        self._thread.start()

    # -- the synchronous interface ----------------------------------------------------

    def save(self, snapshot: PartitionSnapshot) -> int:
        return self._run(self._save(snapshot, stop_after_chunks=None))

    def load(self, partition: int, fingerprint: str) -> PartitionSnapshot | None:
        return self._run(self._load(partition, fingerprint))

    def move_aside(self, partition: int) -> str:
        """Mark the partition's snapshot unusable (its records stay for inspection)."""
        return self._run(self._move_aside(partition))

    def prefetch(self) -> None:
        """Read on every partition of the topic in the background.

        Called when a rebalance revokes this instance's partitions: the group
        takes seconds to settle, and the partitions it will assign, whichever
        they are, are then mostly read already. A load reads on from there
        (what was written since, such as the snapshots other instances take
        when their partitions are revoked). A failure here is left to the
        load, which reads again and reports it.
        """
        if self._count is None or (self._prefetching and not self._prefetching.done()):
            return
        self._prefetching = asyncio.run_coroutine_threadsafe(self._prefetch(), self._loop)

    def settle(self) -> None:
        """Let go of prefetched chunks that no load used (their partitions are elsewhere)."""
        if self._prefetching is not None:
            # Its failure is the loads' to report: they read again.
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                self._prefetching.result(timeout=TIMEOUT_S)
            self._prefetching = None
        self._run(self._let_go())

    def close(self) -> None:
        if self._producer is not None:
            self._run(self._producer.stop())
            self._producer = None
        if self._reader is not None:
            self._run(self._reader.stop())
            self._reader = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def write_torn(self, snapshot: PartitionSnapshot, chunks: int) -> None:
        """Write only the first ``chunks`` chunks and no manifest: a crash mid-save."""
        self._run(self._save(snapshot, stop_after_chunks=chunks))

    # -- keys -------------------------------------------------------------------------

    def manifest_key(self, partition: int) -> bytes:
        return f"{self.group}/{partition:05d}/manifest".encode()

    def chunk_key(self, partition: int, snapshot_id: str, chunk: int) -> bytes:
        return f"{self.group}/{partition:05d}/{snapshot_id}/{chunk:05d}".encode()

    # -- on the store's loop ----------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=TIMEOUT_S)
        except KafkaError as exc:
            raise SnapshotError(f"snapshot topic {self.topic!r}: {exc!r}") from None

    async def _topic_partition(self, partition: int) -> TopicPartition:
        if self._count is None:
            admin = AIOKafkaAdminClient(**client_options(self.kafka))
            await admin.start()
            try:
                if self.topic not in set(await admin.list_topics()):
                    with contextlib.suppress(TopicAlreadyExistsError):
                        await admin.create_topics(
                            [
                                NewTopic(
                                    self.topic,
                                    self.create_partitions,
                                    1,
                                    topic_configs={"cleanup.policy": "compact"},
                                )
                            ]
                        )
                described = await admin.describe_topics([self.topic])
            finally:
                await admin.close()
            count = len(described[0].get("partitions", [])) if described else 0
            if count < 1:
                raise SnapshotError(f"snapshot topic {self.topic!r} has no partitions")
            self._count = count
        return TopicPartition(self.topic, partition % self._count)

    async def _producer_started(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                acks="all",
                max_request_size=self.chunk_bytes + 64 * 1024,
                **client_options(self.kafka),
            )
            await producer.start()
            self._producer = producer
        return self._producer

    def _header(self, kind: str, partition: int, **fields: Any) -> dict[str, Any]:
        """A record's header: what every record of the topic starts with, then ``fields``."""
        return {
            "format": TOPIC_RECORD_FORMAT,
            "kind": kind,
            "group": self.group,
            "partition": partition,
            **fields,
        }

    async def _save(self, snapshot: PartitionSnapshot, stop_after_chunks: int | None) -> int:
        header, body = encode_snapshot(snapshot)
        p = snapshot.partition
        where = await self._topic_partition(p)
        producer = await self._producer_started()
        generation = self._generation.get(p, 0) + 1
        snapshot_id = f"{generation:010d}-{header['body_sha256'][:16]}"
        pieces = [body[i : i + self.chunk_bytes] for i in range(0, len(body), self.chunk_bytes)]
        pieces = pieces or [b""]
        for index, piece in enumerate(pieces):
            if stop_after_chunks is not None and index >= stop_after_chunks:
                return len(body)
            chunk_header = self._header("chunk", p, snapshot=snapshot_id, chunk=index)
            await producer.send_and_wait(
                where.topic,
                _record(chunk_header, piece),
                key=self.chunk_key(p, snapshot_id, index),
                partition=where.partition,
            )
        if stop_after_chunks is not None:
            return len(body)
        manifest = self._header(
            "manifest", p, snapshot=snapshot_id, chunks=len(pieces), header=header
        )
        await producer.send_and_wait(
            where.topic, _record(manifest), key=self.manifest_key(p), partition=where.partition
        )
        previous = self._current.get(p)
        if previous is not None and previous[0] != snapshot_id:
            old_id, old_chunks = previous
            for index in range(old_chunks):
                await producer.send_and_wait(
                    where.topic,
                    None,
                    key=self.chunk_key(p, old_id, index),
                    partition=where.partition,
                )
        self._current[p] = (snapshot_id, len(pieces))
        self._generation[p] = generation
        return len(body)

    async def _move_aside(self, partition: int) -> str:
        where = await self._topic_partition(partition)
        producer = await self._producer_started()
        marker = self._header("aside", partition)
        result = await producer.send_and_wait(
            where.topic,
            _record(marker),
            key=self.manifest_key(partition),
            partition=where.partition,
        )
        self._current.pop(partition, None)
        return f"{self.topic}[{where.partition}]@{result.offset} (an 'aside' manifest)"

    async def _reader_started(self) -> AIOKafkaConsumer:
        if self._reader is None:
            reader = AIOKafkaConsumer(
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                # A new assignment waits for the fetch in flight, which the
                # broker may hold this long when there is nothing to read.
                fetch_max_wait_ms=10,
                **client_options(self.kafka),
            )
            await reader.start()
            self._reader = reader
        return self._reader

    def _lock(self) -> asyncio.Lock:
        if self._reading is None:
            self._reading = asyncio.Lock()
        return self._reading

    async def _prefetch(self) -> None:
        count = self._count or 0
        for number in range(count):
            held = sum(len(b) for seen in self._seen.values() for _, b in seen.chunks.values())
            if held > PREFETCH_MAX_BYTES:
                return  # the rest is read when loaded, as without a prefetch
            async with self._lock():
                where = TopicPartition(self.topic, number)
                await self._read_on(where, self._seen.get(number) or _Seen())

    async def _let_go(self) -> None:
        async with self._lock():
            for seen in self._seen.values():
                if seen.chunks:
                    seen.chunks.clear()
                    seen.partial = True

    async def _load(self, partition: int, fingerprint: str) -> PartitionSnapshot | None:
        # A load runs inside a rebalance, where a refused load stops the
        # daemon (live.on_bad_snapshot): a broker slow to answer once (an
        # offsets request past its timeout) is tried again first. What was
        # read before the error stays read.
        delay = LOAD_RETRY_S
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            try:
                async with self._lock():
                    return await self._load_locked(partition, fingerprint)
            except KafkaError as exc:
                transient = exc.retriable or isinstance(exc, KafkaTimeoutError)
                if not transient or attempt == LOAD_ATTEMPTS:
                    raise
                log.warning(
                    "snapshot load failed, trying again",
                    partition=partition,
                    error=repr(exc),
                    retry_in_s=delay,
                )
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def _load_locked(self, partition: int, fingerprint: str) -> PartitionSnapshot | None:
        where = await self._topic_partition(partition)
        seen = await self._read_on(where, self._seen.get(where.partition) or _Seen())
        prefix = f"{self.group}/{partition:05d}/".encode()
        manifest = seen.manifests.get(self.manifest_key(partition))
        if manifest is None:
            return None
        chunks = {key: value for key, value in seen.chunks.items() if key.startswith(prefix)}
        if seen.partial and not self._complete(partition, manifest[1], chunks):
            # Chunks let go after an earlier load: read it all again.
            seen = await self._read_on(where, _Seen())
            manifest = seen.manifests.get(self.manifest_key(partition))
            if manifest is None:
                return None
            chunks = {key: value for key, value in seen.chunks.items() if key.startswith(prefix)}
        offset, parsed = manifest
        loaded = self._assemble(partition, fingerprint, offset, parsed, chunks)
        for key in chunks:
            del seen.chunks[key]
        seen.partial = True
        return loaded

    def _complete(self, partition: int, manifest: Any, chunks: dict[bytes, Any]) -> bool:
        if not isinstance(manifest, dict) or manifest.get("kind") != "manifest":
            return True  # nothing to assemble: the manifest alone decides
        snapshot_id, count = manifest.get("snapshot"), manifest.get("chunks")
        if not isinstance(snapshot_id, str) or type(count) is not int:
            return True
        return all(self.chunk_key(partition, snapshot_id, i) in chunks for i in range(count))

    async def _read_on(self, where: TopicPartition, seen: _Seen) -> _Seen:
        """``seen`` brought up to the partition's end as of now (from its start if it is new)."""
        reader = await self._reader_started()
        reader.assign([where])
        start = (await reader.beginning_offsets([where]))[where]
        if start > seen.position:
            # Records were removed below what was read (retention): start over.
            seen = _Seen(position=start)
        end = (await reader.end_offsets([where]))[where]
        reader.seek(where, seen.position)
        ours = f"{self.group}/".encode()
        while seen.position < end:
            batch = await reader.getmany(where, timeout_ms=1000, max_records=500)
            for record in batch.get(where, []):
                if record.offset >= end:
                    break
                seen.position = record.offset + 1
                key = record.key or b""
                if not key.startswith(ours):
                    continue  # another group's
                if key.endswith(b"/manifest"):
                    seen.manifests[key] = (record.offset, self._parse(record.value, record.offset))
                elif record.value is None:
                    seen.chunks.pop(key, None)  # deleted by a newer snapshot
                else:
                    seen.chunks[key] = (record.offset, record.value)
            if not batch:
                seen.position = max(seen.position, await reader.position(where))
        self._seen[where.partition] = seen
        return seen

    def _parse(self, value: bytes | None, offset: int) -> Any:
        if value is None:
            return None
        line, _, _ = value.partition(b"\n")
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return {"unreadable": f"offset {offset}: header is not JSON ({exc})"}

    def _assemble(
        self,
        partition: int,
        fingerprint: str,
        offset: int,
        manifest: Any,
        chunks: dict[bytes, tuple[int, bytes]],
    ) -> PartitionSnapshot | None:
        where = f"snapshot topic {self.topic!r}, partition {partition}, manifest at {offset}"
        if manifest is None or (isinstance(manifest, dict) and manifest.get("kind") == "aside"):
            return None  # deleted, or moved aside: rebuild from the input topics
        if not isinstance(manifest, dict) or "unreadable" in manifest:
            detail = manifest.get("unreadable") if isinstance(manifest, dict) else manifest
            raise SnapshotError(f"{where}: not a snapshot manifest ({detail})")
        if manifest.get("format") != TOPIC_RECORD_FORMAT or manifest.get("kind") != "manifest":
            raise SnapshotError(f"{where}: foreign record (format {manifest.get('format')!r})")
        if manifest.get("group") != self.group or manifest.get("partition") != partition:
            raise SnapshotError(
                f"{where}: foreign manifest: group {manifest.get('group')!r}, partition "
                f"{manifest.get('partition')!r} (this store: {self.group!r}, {partition})"
            )
        snapshot_id = manifest.get("snapshot")
        count = manifest.get("chunks")
        if not isinstance(snapshot_id, str) or type(count) is not int or not 1 <= count <= 1 << 20:
            raise SnapshotError(f"{where}: manifest without a snapshot id and chunk count")
        parts: list[bytes] = []
        for index in range(count):
            found = chunks.get(self.chunk_key(partition, snapshot_id, index))
            if found is None:
                raise SnapshotError(
                    f"{where}: torn snapshot {snapshot_id}: chunk {index} of {count} is missing"
                )
            chunk_header = self._parse(found[1], found[0])
            if not isinstance(chunk_header, dict) or (
                chunk_header.get("snapshot"),
                chunk_header.get("chunk"),
                chunk_header.get("group"),
            ) != (snapshot_id, index, self.group):
                raise SnapshotError(f"{where}: chunk {index} at {found[0]} is another snapshot's")
            parts.append(found[1].partition(b"\n")[2])
        body = b"".join(parts)
        header = manifest.get("header")
        if isinstance(header, dict) and hashlib.sha256(body).hexdigest() != header.get(
            "body_sha256"
        ):
            raise SnapshotError(f"{where}: torn snapshot {snapshot_id}: body checksum differs")
        loaded = decode_snapshot(where, header, body, partition, fingerprint)
        self._current[partition] = (snapshot_id, count)
        self._generation[partition] = generation_of(snapshot_id)
        return loaded


def generation_of(snapshot_id: str) -> int:
    """The generation a snapshot id starts with (ten ASCII digits as this module writes
    them), or 0 for any other id: Unicode digits int() refuses, or thousands of digits."""
    generation = snapshot_id.split("-", 1)[0]
    if generation.isascii() and generation.isdigit() and len(generation) <= 18:
        return int(generation)
    return 0


def snapshot_store(settings: Settings) -> SnapshotStorage:
    """The store ``live.snapshot_store`` names."""
    live = settings.live
    if live.snapshot_store == "topic":
        return TopicSnapshotStore(
            settings.kafka,
            live.snapshot_topic,
            settings.kafka.group_id,
            chunk_bytes=live.snapshot_chunk_bytes,
            partitions=settings.topics.partitions,
        )
    return SnapshotStore(live.snapshot_dir, settings.kafka.group_id)
