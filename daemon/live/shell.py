"""The live shell: Kafka records through the same ``Engine`` as replay, decisions back to Kafka.

One cycle, repeated: fetch a batch of input records; decode each (a record
that does not decode, belongs to another partition's pool, or contradicts
the state goes to the dead-letter topic with the reason); feed the events to
the engine at their event time; run timers up to the watermark; publish
every decision with acks=all and wait for the acknowledgements (retrying
with backoff while the broker does not answer); only then commit the input
offsets. Every ``live.snapshot_interval_s`` the state of each owned
partition is written with the offsets it reflects.

Delivery guarantee: at least once, with deterministic decision ids. Every
input record that was committed, or that precedes a snapshot's offsets, has
had its decisions (or its dead letter) acknowledged by the broker. After a
crash the instance that takes the partition restores the snapshot and
re-reads from its offsets (not from the committed offsets, which may be
ahead of the snapshot); the engine is deterministic, so what it publishes
again carries the same ids and the same content, and consumers drop
duplicates by ``decision_id`` (dead letters by source topic/partition/
offset). With ``kafka.transactional_id`` set (a real Kafka cluster only),
each batch's decisions and offsets commit in one transaction instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner

from lavad.daemon.engine import Engine, EngineConfig
from lavad.daemon.live.connection import decision_producer, input_consumer
from lavad.daemon.live.http import HttpHandle, serve_http
from lavad.daemon.live.snapshots import PartitionSnapshot, SnapshotError, SnapshotStore
from lavad.daemon.live.telemetry import Telemetry
from lavad.daemon.live.watermark import Watermark
from lavad.daemon.placement.kernels import warm_up
from lavad.daemon.settings import KafkaSettings, Settings
from lavad.streams.codec import SchemaError, decode_event, encode
from lavad.streams.kafka.deadletter import dead_letter_headers
from lavad.streams.kafka.topics import TopicNames, check_copartitioned
from lavad.streams.schema import Decision, Placement

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


@dataclass(slots=True)
class OwnedPartition:
    """A partition number of the input topics this instance holds."""

    number: int
    pools: set[str] = field(default_factory=set)
    # input topic -> next offset to process; absent = from the beginning
    positions: dict[str, int] = field(default_factory=dict)


class StartupError(Exception):
    """The broker answered but refused what this configuration needs; retrying cannot help."""


def _refusal(exc: KafkaError, kafka: KafkaSettings) -> str:
    hint = ""
    if kafka.enable_idempotence or kafka.transactional_id is not None:
        hint = (
            " (kafka.enable_idempotence / kafka.transactional_id need a broker that supports "
            "InitProducerId; the embedded Tansu broker does not: turn them off there)"
        )
    return f"broker {kafka.bootstrap_servers} refused at start-up: {exc!r}{hint}"


class Stopping(Exception):
    """Shutdown was requested while a batch could not be published."""


class PartitionError(Exception):
    """Taking or giving up a partition failed; the daemon stopped rather than run without it."""


class LiveDaemon:
    def __init__(self, settings: Settings, engine_config: EngineConfig) -> None:
        self.settings = settings
        self.engine = Engine(engine_config)
        self.names = TopicNames(**settings.topics.model_dump())
        self.telemetry = Telemetry()
        self.store = SnapshotStore(settings.live.snapshot_dir, settings.kafka.group_id)
        self.watermark = Watermark(settings.live.idle_partition_s)
        self.owned: dict[int, OwnedPartition] = {}
        self.pool_partition: dict[str, int] = {}
        self.broker_reachable = False
        self.snapshots_loaded = False
        self.records_processed = 0
        self.http: HttpHandle | None = None
        self._lock = asyncio.Lock()
        # Decisions of the current batch are not all acknowledged: the state
        # is ahead of what was published, so it must not be snapshotted.
        self._unpublished = False
        self._consumer: Any = None
        self._producer: Any = None
        self._fingerprint = self.engine.fingerprint
        self._event_counts: Counter[str] = Counter()
        self._route: dict[tuple[str, bytes | None], int] = {}
        self._partitioner = DefaultPartitioner()
        self._log_decisions = settings.log.level == "debug"
        # How long a commit or a client's stop may wait for the broker.
        self._client_timeout_s = settings.kafka.request_timeout_ms / 1000.0
        # Set by a failure inside aiokafka's rebalance callbacks, which log
        # and swallow what they raise: ``run`` stops and raises it instead.
        self._stop: asyncio.Event | None = None
        self._failure: Exception | None = None

    # ------------------------------------------------------------ readiness

    def readiness(self) -> dict[str, bool]:
        assigned = bool(self._consumer is not None and self._consumer.assignment())
        return {
            "partitions_assigned": assigned,
            "snapshots_loaded": self.snapshots_loaded,
            "broker_reachable": self.broker_reachable,
        }

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; then snapshot, commit and close everything.

        Raises SnapshotError or PartitionError, after that shutdown, when a
        partition could not be taken or given up (a snapshot that does not
        load under ``live.on_bad_snapshot = "stop"``, one that cannot be
        written): the caller turns it into a message and an exit code.
        """
        self._stop = stop
        warm_up()
        http = self.settings.http
        try:
            self.http = await serve_http(
                http.host, http.port, self.telemetry.registry, self.readiness
            )
        except OSError as exc:
            raise StartupError(
                f"http.host/http.port {http.host}:{http.port}: cannot listen ({exc.strerror})"
            ) from None
        log.info("http serving", url=self.http.url)
        tasks: list[asyncio.Task[None]] = []
        try:
            if not await self._connect(stop):
                return
            tasks = [
                asyncio.create_task(self._probe_broker(stop)),
                asyncio.create_task(self._housekeeping(stop)),
            ]
            await self._consume(stop)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self._shutdown()
            log.info("stopped", records_processed=self.records_processed)
        if self._failure is not None:
            raise self._failure

    def fail(self, exc: Exception) -> None:
        """Stop the daemon because of ``exc``; ``run`` raises it once shut down."""
        if self._failure is None:
            self._failure = exc
        log.error("stopping", reason=str(exc), error=type(exc).__name__)
        if self._stop is not None:
            self._stop.set()

    async def _connect(self, stop: asyncio.Event) -> bool:
        """Start the clients, retrying with backoff while the broker does not answer."""
        kafka = self.settings.kafka
        delay = self.settings.live.retry_initial_s
        while not stop.is_set():
            producer = decision_producer(kafka)
            consumer = input_consumer(kafka)
            try:
                await producer.start()
                await consumer.start()
                topics = await consumer.topics()
                counts = {topic: _count(consumer.partitions_for_topic(topic)) for topic in topics}
                partitions = check_copartitioned(counts, self.names)
            except KafkaError as exc:
                if not (exc.retriable or isinstance(exc, KafkaTimeoutError)):
                    await _stop_quietly(consumer, producer, self._client_timeout_s)
                    raise StartupError(_refusal(exc, kafka)) from None
                log.warning("broker unreachable at start", error=repr(exc), retry_in_s=delay)
                await _stop_quietly(consumer, producer, self._client_timeout_s)
                await _sleep_or_stop(stop, delay)
                delay = min(delay * 2, self.settings.live.retry_max_s)
                continue
            except BaseException:
                await _stop_quietly(consumer, producer, self._client_timeout_s)
                raise
            self._producer, self._consumer = producer, consumer
            self.broker_reachable = True
            consumer.subscribe(list(self.names.inputs), listener=_Rebalance(self))
            log.info(
                "connected",
                bootstrap=kafka.bootstrap_servers,
                group=kafka.group_id,
                input_partitions=partitions,
            )
            return True
        return False

    async def _consume(self, stop: asyncio.Event) -> None:
        kafka = self.settings.kafka
        delay = self.settings.live.retry_initial_s
        while not stop.is_set():
            try:
                batch = await self._consumer.getmany(
                    timeout_ms=kafka.fetch_wait_ms, max_records=kafka.max_batch_records
                )
            except KafkaError as exc:
                log.warning("fetch failed", error=repr(exc), retry_in_s=delay)
                await _sleep_or_stop(stop, delay)
                delay = min(delay * 2, self.settings.live.retry_max_s)
                continue
            delay = self.settings.live.retry_initial_s
            async with self._lock:
                out = self._process(batch)
                out.extend(self._advance_timers())
                if not out and not batch:
                    continue
                try:
                    await self._publish_and_commit(out, stop)
                except Stopping:
                    return

    # ------------------------------------------------------------ processing

    def _process(self, batch: dict[Any, list[Any]]) -> list[Outgoing]:
        out: list[Outgoing] = []
        engine = self.engine
        names = self.names
        wall = time.time()
        for tp, records in batch.items():
            owned = self.owned.get(tp.partition)
            if owned is None or not records:
                continue  # revoked between fetch and processing: the next owner reads them
            expected = owned.positions.get(tp.topic, 0)
            for record in records:
                if record.offset < expected:
                    # Already reflected in the state (a fetch that raced a seek).
                    self.telemetry.records_skipped.inc()
                    continue
                out.extend(self._one(engine, names, owned, tp, record, wall))
            owned.positions[tp.topic] = records[-1].offset + 1
            self.records_processed += len(records)
        for event_type, count in self._event_counts.items():
            self.telemetry.events.labels(event_type).inc(count)
        self._event_counts.clear()
        return out

    def _one(
        self,
        engine: Engine,
        names: TopicNames,
        owned: OwnedPartition,
        tp: Any,
        record: Any,
        wall: float,
    ) -> list[Outgoing]:
        raw: bytes | None = record.value
        if raw is None:
            return [self._dead(record, tp, "decode", "record has no value (tombstone)")]
        try:
            event = decode_event(raw)
        except SchemaError as exc:
            return [self._dead(record, tp, "decode", str(exc))]
        pool = event.pool
        owner = self.pool_partition.get(pool)
        if owner is None:
            self.pool_partition[pool] = owner = owned.number
            owned.pools.add(pool)
        if owner != owned.number:
            return [
                self._dead(
                    record,
                    tp,
                    "routing",
                    f"pool {pool!r} lives on partition {owner} of the input topics, this record "
                    f"came on partition {owned.number}: key every input record by its pool",
                )
            ]
        self._event_counts[event.type] += 1
        handled = engine.handle(event, event.time)
        rejection = handled.rejection
        if rejection is None or rejection.stage != "time":
            # Only a plausible time moves the watermark (and every pool's timers).
            self.watermark.observe(tp, event.time, wall)
        if pool not in engine.pools:
            # Refused before the pool opened: its name must not be kept either.
            owned.pools.discard(pool)
            self.pool_partition.pop(pool, None)
        out = [self._decision(decision, record.timestamp, names) for decision in handled.decisions]
        if rejection is not None:
            # After the decisions the timers made on the way: both are published.
            out.append(self._dead(record, tp, rejection.stage, rejection.reason))
        return out

    def _decision(
        self, decision: Decision, timestamp_ms: int | None, names: TopicNames
    ) -> Outgoing:
        if self._log_decisions:
            log.debug("decision", decision_id=decision.decision_id, kind=decision.kind)
        elif isinstance(decision, Placement) and decision.host_id is None:
            # A request nobody could take is worth a line at info level.
            log.info(
                "unplaced",
                decision_id=decision.decision_id,
                reason=decision.reason,
                retryable=decision.retryable,
            )
        return Outgoing(
            names.for_decision(decision.kind),
            decision.pool.encode(),
            encode(decision),
            [("lavad.decision_id", decision.decision_id.encode())],
            timestamp_ms,
            decision.kind,
        )

    def _dead(self, record: Any, tp: Any, stage: str, reason: str) -> Outgoing:
        self.telemetry.dead_letters.labels(stage).inc()
        log.info(
            "dead letter",
            stage=stage,
            reason=reason,
            topic=tp.topic,
            partition=tp.partition,
            offset=record.offset,
        )
        return Outgoing(
            self.names.dead_letters,
            record.key,
            record.value if record.value is not None else b"",
            dead_letter_headers(stage, reason, tp.topic, tp.partition, record.offset),
            record.timestamp,
            "dead_letter",
        )

    def _advance_timers(self) -> list[Outgoing]:
        now = self.watermark.current(time.time())
        self.telemetry.watermark.set(now if now != float("-inf") else 0.0)
        if now < self.engine.next_deadline:
            return []
        return [self._decision(d, None, self.names) for d in self.engine.advance(now)]

    # ------------------------------------------------------------ publishing

    async def _publish_and_commit(self, out: list[Outgoing], stop: asyncio.Event) -> None:
        self._unpublished = bool(out)
        if self.settings.kafka.transactional_id is not None:
            await self._publish_transaction(out, stop)
        else:
            await self._publish(out, stop)
            await self._commit()
        self._unpublished = False

    async def _publish(self, out: list[Outgoing], stop: asyncio.Event) -> None:
        """Send every record and wait for acks=all; re-send what failed until all are in.

        Records go out as one producer batch per (topic, partition), in the
        order they were decided; the partition is the one aiokafka's default
        partitioner gives the key (the pool), so a pool's decisions stay in
        order on one partition. Unkeyed dead letters go to partition 0.
        """
        pending = out
        delay = self.settings.live.retry_initial_s
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
            self.broker_reachable = False
            self.telemetry.publish_retries.inc()
            log.warning("publish failed, retrying", records=len(failed), retry_in_s=delay)
            if stop.is_set():
                raise Stopping
            await _sleep_or_stop(stop, delay)
            delay = min(delay * 2, self.settings.live.retry_max_s)
            pending = failed

    async def _send_batches(
        self, items: list[Outgoing]
    ) -> list[tuple[list[Outgoing], Awaitable[Any]]]:
        producer = self._producer
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
                    future = await producer.send_batch(batch, topic, partition=partition)
                    sent.append((members, future))
                    batch, members = producer.create_batch(), []
                    batch.append(
                        key=item.key, value=item.value, timestamp=None, headers=item.headers
                    )
                members.append(item)
            future = await producer.send_batch(batch, topic, partition=partition)
            sent.append((members, future))
        return sent

    def _count_published(self, items: list[Outgoing], acked: float) -> None:
        kinds: Counter[str] = Counter()
        observe = self.telemetry.decision_latency.observe
        for item in items:
            if item.label == "dead_letter":
                continue
            kinds[item.label] += 1
            if item.source_timestamp_ms is not None:
                observe(max(0.0, acked - item.source_timestamp_ms / 1e3))
        for kind, count in kinds.items():
            self.telemetry.decisions.labels(kind).inc(count)

    async def _publish_transaction(self, out: list[Outgoing], stop: asyncio.Event) -> None:
        delay = self.settings.live.retry_initial_s
        while True:
            try:
                async with self._producer.transaction():
                    futures = [
                        await self._producer.send(i.topic, i.value, key=i.key, headers=i.headers)
                        for i in out
                    ]
                    await asyncio.gather(*futures)
                    await self._producer.send_offsets_to_transaction(
                        self._offsets(), self.settings.kafka.group_id
                    )
            except KafkaError as exc:
                self.telemetry.publish_retries.inc()
                log.warning("transaction failed, retrying", error=repr(exc), retry_in_s=delay)
                if stop.is_set():
                    raise Stopping from None
                await _sleep_or_stop(stop, delay)
                delay = min(delay * 2, self.settings.live.retry_max_s)
                continue
            self._count_published(out, time.time())
            return

    def _offsets(self) -> dict[Any, int]:
        return {
            TopicPartition(topic, owned.number): offset
            for owned in self.owned.values()
            for topic, offset in owned.positions.items()
        }

    async def _commit(self) -> None:
        """Commit the processed offsets; a failure is counted and the next batch commits again.

        Committed offsets are for lag monitoring and tooling: a restart resumes
        from the snapshot's offsets, so a failed commit loses nothing.
        """
        offsets = self._offsets()
        if not offsets:
            return
        try:
            # aiokafka retries a commit until the coordinator answers: with
            # the broker gone that is forever, and a stopping daemon hangs.
            await asyncio.wait_for(self._consumer.commit(offsets), self._client_timeout_s)
        except (KafkaError, TimeoutError) as exc:
            self.telemetry.commit_failures.inc()
            log.warning("offset commit failed", error=repr(exc))

    # ------------------------------------------------------------- snapshots

    def _snapshot(self, owned: OwnedPartition) -> None:
        pools = {name: self.engine.pools[name] for name in owned.pools if name in self.engine.pools}
        size = self.store.save(
            PartitionSnapshot(owned.number, self._fingerprint, dict(owned.positions), pools)
        )
        self.telemetry.snapshots.inc()
        log.info(
            "snapshot written",
            partition=owned.number,
            pools=len(pools),
            bytes=size,
            offsets=owned.positions,
        )

    async def snapshot_all(self) -> None:
        """The periodic snapshot of every owned partition.

        A write the filesystem refuses (disk full) is counted and logged, and
        tried again next interval: the previous snapshot still stands, so a
        restart re-reads more, losing nothing. A state that cannot be written
        as data would fail every time: the daemon stops with the path to it.
        """
        async with self._lock:
            if self._unpublished:
                return
            for owned in self.owned.values():
                try:
                    self._snapshot(owned)
                except OSError as exc:
                    self.telemetry.snapshot_failures.inc()
                    log.error("snapshot not written", partition=owned.number, error=str(exc))
                except SnapshotError as exc:
                    self.fail(exc)
                    return

    async def acquire(self, assigned: Iterable[Any]) -> None:
        """New partitions: restore each one's snapshot and seek to its offsets."""
        async with self._lock:
            by_number: dict[int, list[Any]] = {}
            for tp in assigned:
                by_number.setdefault(tp.partition, []).append(tp)
            for number, tps in sorted(by_number.items()):
                if number in self.owned:
                    continue
                snapshot = self._restore(number)
                owned = OwnedPartition(number)
                if snapshot is not None:
                    self.engine.adopt_pools(snapshot.pools)
                    owned.pools = set(snapshot.pools)
                    owned.positions = dict(snapshot.offsets)
                    for pool in snapshot.pools:
                        self.pool_partition[pool] = number
                # Every seek is synchronous: awaiting here (seek_to_beginning)
                # lets the fetcher reset the partitions not yet sought from the
                # committed offsets, which are ahead of the snapshot. Offset 0
                # below a truncated log start resets to the earliest offset
                # (auto_offset_reset), which is what "from the beginning" means.
                for tp in tps:
                    self._consumer.seek(tp, owned.positions.get(tp.topic, 0))
                self.owned[number] = owned
                log.info(
                    "partition acquired",
                    partition=number,
                    snapshot=snapshot is not None,
                    pools=len(owned.pools),
                    offsets=owned.positions,
                )
            self.watermark.assign(assigned, time.time())
            self.snapshots_loaded = True
            self.telemetry.assigned_partitions.set(len(self.owned))

    def _restore(self, number: int) -> PartitionSnapshot | None:
        """The partition's snapshot, or None to read it from the earliest retained offset.

        A snapshot that does not load raises (``live.on_bad_snapshot = "stop"``)
        or is renamed aside, kept for inspection, and the partition rebuilt
        ("rebuild").
        """
        try:
            return self.store.load(number, self._fingerprint)
        except SnapshotError as exc:
            if self.settings.live.on_bad_snapshot == "stop":
                raise SnapshotError(
                    f"{exc} [live.on_bad_snapshot = 'stop': move the file away, or set it to "
                    "'rebuild' to re-read the partition from the earliest retained offset]"
                ) from None
            reason = str(exc)
        aside = self.store.move_aside(number)
        self.telemetry.snapshots_rebuilt.inc()
        log.warning(
            "snapshot moved aside, rebuilding the partition from the earliest retained offset",
            partition=number,
            reason=reason,
            moved_to=str(aside),
        )
        return None

    async def release(self, revoked: Iterable[Any]) -> None:
        """Partitions leave: snapshot them (if all their decisions are out) and drop their pools."""
        async with self._lock:
            revoked = list(revoked)
            numbers = sorted({tp.partition for tp in revoked})
            for number in numbers:
                owned = self.owned.pop(number, None)
                if owned is None:
                    continue
                if not self._unpublished:
                    self._snapshot(owned)
                for name in self.engine.take_pools(owned.pools):
                    self.pool_partition.pop(name, None)
                    self.telemetry.forget_pool(name)
                log.info("partition released", partition=number, pools=len(owned.pools))
            self.watermark.revoke(revoked)
            self.telemetry.assigned_partitions.set(len(self.owned))

    # ----------------------------------------------------------- background

    async def _probe_broker(self, stop: asyncio.Event) -> None:
        interval = self.settings.live.broker_probe_s
        while not stop.is_set():
            try:
                await asyncio.wait_for(self._producer.client.fetch_all_metadata(), interval)
            except (KafkaError, TimeoutError, OSError) as exc:
                if self.broker_reachable:
                    log.warning("broker unreachable", error=repr(exc))
                self.broker_reachable = False
            else:
                if not self.broker_reachable:
                    log.info("broker reachable")
                self.broker_reachable = True
            self.telemetry.broker_reachable.set(1.0 if self.broker_reachable else 0.0)
            self.telemetry.ready.set(1.0 if all(self.readiness().values()) else 0.0)
            await _sleep_or_stop(stop, interval)

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        live = self.settings.live
        next_snapshot = time.monotonic() + live.snapshot_interval_s
        while not stop.is_set():
            await _sleep_or_stop(stop, min(live.cluster_gauges_s, live.snapshot_interval_s))
            self.refresh_gauges()
            if time.monotonic() >= next_snapshot:
                await self.snapshot_all()
                next_snapshot = time.monotonic() + live.snapshot_interval_s

    def refresh_gauges(self) -> None:
        self.telemetry.pools.set(len(self.engine.pools))
        for pool in self.engine.pools.values():
            self.telemetry.refresh_pool(pool)
        consumer = self._consumer
        if consumer is None:
            return
        for tp in consumer.assignment():
            owned = self.owned.get(tp.partition)
            highwater = consumer.highwater(tp)
            if owned is None or highwater is None:
                continue
            position = owned.positions.get(tp.topic, 0)
            self.telemetry.consumer_lag.labels(tp.topic, str(tp.partition)).set(
                max(0, highwater - position)
            )

    async def _shutdown(self) -> None:
        consumer, producer = self._consumer, self._producer
        if consumer is not None:
            async with self._lock:
                if not self._unpublished:
                    for owned in self.owned.values():
                        self._snapshot(owned)
                    await self._commit()
                # The snapshots are written: leaving the group must not redo them.
                self.owned.clear()
        await _stop_quietly(consumer, producer, self._client_timeout_s)
        if self.http is not None:
            await self.http.close()


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka calls these inside its coordinator and only logs what they raise, which
    would leave the daemon up but never ready: a failure stops the daemon instead."""

    def __init__(self, daemon: LiveDaemon) -> None:
        self.daemon = daemon

    async def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            await self.daemon.release(revoked)
        except SnapshotError as exc:
            self.daemon.fail(exc)
        except Exception as exc:  # noqa: BLE001 - raised here, it would be logged and lost
            self.daemon.fail(PartitionError(f"giving up partitions failed: {exc!r}"))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            await self.daemon.acquire(assigned)
        except SnapshotError as exc:
            self.daemon.fail(exc)
        except Exception as exc:  # noqa: BLE001 - raised here, it would be logged and lost
            self.daemon.fail(PartitionError(f"taking partitions failed: {exc!r}"))


def _count(partitions: set[int] | None) -> int | None:
    return len(partitions) if partitions else None


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _stop_quietly(consumer: Any, producer: Any, timeout_s: float) -> None:
    """Stop the clients; a broker that is gone must not keep the process alive.

    Leaving the group and flushing wait for the broker; past ``timeout_s``
    the client is abandoned (its decisions were acknowledged before any
    offset was committed, and a restart resumes from the snapshots).
    """
    for client in (consumer, producer):
        if client is None:
            continue
        try:
            await asyncio.wait_for(client.stop(), timeout_s)
        except (KafkaError, TimeoutError) as exc:
            log.warning("client did not stop cleanly", error=repr(exc))
        except asyncio.CancelledError:
            # aiokafka's consumer, closing its fetcher while the broker is
            # gone, awaits its own cancelled fetch task and lets that
            # CancelledError out. Only ours (this task being cancelled) counts.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            log.warning("client did not stop cleanly", error="cancelled inside the client")


def live_engine_config(settings: Settings) -> EngineConfig:
    """Live pools grow from the host shape unless ``hosts.source = "trace"``.

    In replay, "auto" asks the trace whether it lists hosts; a live stream
    cannot say in advance, so "auto" means the shape (as for traces without
    hosts), and fleets that announce every host with host.up set "trace".
    """
    return settings.engine_config(trace_has_hosts=settings.hosts.source == "trace")
