"""The live shell: Kafka records through the same ``Engine`` as replay, decisions back to Kafka.

One cycle, repeated: fetch a batch of input records; decode each (a record
that does not decode, belongs to another partition's pool, or contradicts
the state goes to the dead-letter topic with the reason); feed the events to
the engine at their event time; run timers up to the watermark; publish
every decision with acks=all and wait for the acknowledgements (retrying
with backoff while the broker does not answer); only then commit the input
offsets that batch reflects. Further batches are fetched and decided while
those acknowledgements are pending, and sent together once they are all in.
Every ``live.snapshot_interval_s`` the state of each owned partition is
written with the offsets it reflects, once no decided batch is unpublished.

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
import dataclasses
import time
from typing import Any

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError

from lavad.core.engine import Engine, EngineConfig
from lavad.daemon import heap
from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.live.connection import (
    SecurityRefusal,
    check_security,
    decision_producer,
    input_consumer,
)
from lavad.daemon.live.http import HttpHandle, serve_http
from lavad.daemon.live.intake import Intake
from lavad.daemon.live.lag_watch import FallingBehind, LagWatch
from lavad.daemon.live.parsed_records import read_parsed_records
from lavad.daemon.live.partitions import Partitions
from lavad.daemon.live.publisher import Outgoing, Publisher, Stopping
from lavad.daemon.live.retry import Backoff, sleep_or_stop, unless_stopped
from lavad.daemon.live.snapshot_topic import snapshot_store
from lavad.daemon.live.snapshots import SnapshotError
from lavad.daemon.live.state_codec import Registry, default_registry
from lavad.daemon.live.telemetry import Telemetry
from lavad.daemon.live.watermark import Watermark
from lavad.daemon.settings import Settings
from lavad.daemon.shadow.engine import Shadow
from lavad.daemon.shadow.live import ShadowTelemetry, topic_names
from lavad.streams.kafka.topics import TopicNames, check_copartitioned

log = structlog.get_logger("lavad.live")

# Turns of the event loop given to the producer after a batch is handed to it.
SENDER_TURNS = 8

__all__ = ["LiveDaemon", "Outgoing", "PartitionError", "StartupError", "live_engine_config"]


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


class PartitionError(Exception):
    """Taking or giving up a partition failed; the daemon stopped rather than run without it."""


class LiveDaemon:
    """The clients, the loop and shutdown; the work is in its parts.

    ``intake`` turns fetched batches into records to publish, ``publisher``
    gets them acknowledged, ``partitions`` owns what was assigned (restore,
    release, snapshots), ``telemetry`` exports it all.
    """

    def __init__(self, settings: Settings, engine_config: EngineConfig) -> None:
        self.settings = settings
        # [shadow] enabled passes the shadow strategy to the engine and takes
        # its gauges and its advice topic here; nothing below changes with it.
        shadow = settings.shadow.enabled
        self.engine = Engine(engine_config, Shadow(engine_config) if shadow else None)
        self.names: TopicNames = topic_names(settings)
        self.telemetry: Telemetry = ShadowTelemetry() if shadow else Telemetry()
        self.watermark = Watermark(settings.live.idle_partition_s)
        self.partitions = Partitions(
            self.engine,
            snapshot_store(settings),
            self.watermark,
            self.telemetry,
            settings.live,
            self.fail,
        )
        self.intake = Intake(
            self.engine,
            self.partitions,
            self.watermark,
            self.telemetry,
            self.names,
            log_decisions=settings.log.level == "debug",
            dead_letter_max_bytes=settings.kafka.dead_letter_max_bytes,
            max_ahead_of_record_s=settings.live.max_ahead_of_record_s,
        )
        self.publisher = Publisher(
            self.telemetry, self._backoff, settings.kafka.group_id, self._unreachable
        )
        live = settings.live
        self.lag_watch = LagWatch(
            FallingBehind(live.falling_behind_samples, live.falling_behind_records),
            self.telemetry.falling_behind,
            # The gauges (and the lag) refresh at the housekeeping's pace.
            min(live.cluster_gauges_s, live.snapshot_interval_s),
        )
        self.broker_reachable = False
        # A rebalance restored state: housekeeping freezes the heap next turn.
        self.settle_heap = False
        self.http: HttpHandle | None = None
        self._consumer: Any = None
        self._producer: Any = None
        # How long a commit or a client's stop may wait for the broker.
        self._client_timeout_s = settings.kafka.request_timeout_ms / 1000.0
        # Set by a failure inside aiokafka's rebalance callbacks, which log
        # and swallow what they raise: ``run`` stops and raises it instead.
        self._stop: asyncio.Event | None = None
        self._failure: Exception | None = None
        # Decided and not yet handed to the publisher: the records, how many
        # batches they came from, the input positions right after the last one.
        self._decided: list[Outgoing] = []
        self._decided_batches = 0
        self._decided_offsets: dict[TopicPartition, int] = {}

    @property
    def records_processed(self) -> int:
        return self.intake.records_processed

    def _backoff(self) -> Backoff:
        return Backoff(self.settings.live.retry_initial_s, self.settings.live.retry_max_s)

    def _unreachable(self) -> None:
        self.broker_reachable = False

    # ------------------------------------------------------------ readiness

    def readiness(self) -> dict[str, bool]:
        assigned = bool(self._consumer is not None and self._consumer.assignment())
        return {
            "partitions_assigned": assigned,
            "snapshots_loaded": self.partitions.snapshots_loaded,
            "broker_reachable": self.broker_reachable,
        }

    def health(self) -> dict[str, bool]:
        """What /healthz reports beside being alive: true marks the daemon degraded."""
        quarantined = bool(self.engine.quarantined())
        return {"falling_behind": self.lag_watch.detector.on, "pools_quarantined": quarantined}

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; then snapshot, commit and close everything.

        Raises SnapshotError or PartitionError, after that shutdown, when a
        partition could not be taken or given up (a snapshot that does not
        load under ``live.on_bad_snapshot = "stop"``, one that cannot be
        written): the caller turns it into a message and an exit code.
        """
        self._stop = stop
        began = time.perf_counter()
        self.engine.warm_up()
        log.info("kernels ready", seconds=round(time.perf_counter() - began, 2))
        # The snapshot codec learns lavad's classes by importing every module
        # (about a second). In a thread, while the HTTP server starts and the
        # consumer joins its group (a broker holds a new member's join for a
        # second or more), and awaited before the loop consumes: the first
        # snapshot taken or loaded then does not stall the event loop
        # (scrapes, heartbeats) while partitions are ours. One taken sooner
        # waits for the walk (``default_registry``).
        registry = asyncio.ensure_future(asyncio.to_thread(default_registry))
        heap.tune_collector()
        try:
            await self._serve(stop, registry)
        finally:
            # A stop during start-up still waits for the walk: a thread cannot
            # be cancelled, and its failure must not go unseen.
            if not registry.done():
                await asyncio.wait([registry])
            if not registry.cancelled() and registry.exception() is not None:
                log.error("walking lavad's modules failed", error=repr(registry.exception()))
        if self._failure is not None:
            raise self._failure

    async def _serve(self, stop: asyncio.Event, registry: asyncio.Future[Registry]) -> None:
        """Serve HTTP, connect, then consume until ``stop``; shut down whatever started."""
        http = self.settings.http
        try:
            self.http = await serve_http(
                http.host, http.port, self.telemetry.registry, self.readiness, self.health
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
            await registry
            # The daemon's own objects, its modules' among them, leave the collector's view.
            heap.settle()
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

    def fail(self, exc: Exception) -> None:
        """Stop the daemon because of ``exc``; ``run`` raises it once shut down."""
        if self._failure is None:
            self._failure = exc
        log.error("stopping", reason=str(exc), error=type(exc).__name__)
        if self._stop is not None:
            self._stop.set()

    async def _connect(self, stop: asyncio.Event) -> bool:
        """Start the clients, retrying with backoff while the broker does not answer.

        A broker whose TLS or SASL refuses this configuration answers the same
        way each time: that stops start-up (``StartupError``) instead.
        """
        kafka = self.settings.kafka
        backoff = self._backoff()
        while not stop.is_set():
            producer = decision_producer(kafka)
            consumer = input_consumer(kafka)
            try:
                await check_security(kafka)
                await producer.start()
                await consumer.start()
                read_parsed_records(consumer)
                topics = await consumer.topics()
                counts = {topic: _count(consumer.partitions_for_topic(topic)) for topic in topics}
                partitions = check_copartitioned(counts, self.names)
            except SecurityRefusal as exc:
                await _stop_quietly(consumer, producer, self._client_timeout_s)
                raise StartupError(str(exc)) from None
            except KafkaError as exc:
                await _stop_quietly(consumer, producer, self._client_timeout_s)
                if not (exc.retriable or isinstance(exc, KafkaTimeoutError)):
                    raise StartupError(_refusal(exc, kafka)) from None
                log.warning(
                    "broker unreachable at start", error=repr(exc), retry_in_s=backoff.delay
                )
                await backoff.wait(stop)
                continue
            except BaseException:
                await _stop_quietly(consumer, producer, self._client_timeout_s)
                raise
            self._producer, self._consumer = producer, consumer
            self.publisher.producer = producer
            self.partitions.consumer = consumer
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
        """Fetch and decide while what was decided before is being published.

        Decided batches queue behind the publish in flight and go out
        together, in the order they were decided, as soon as it is
        acknowledged (``_publish_decided``): a pool's decisions stay in order
        on their partition, a re-send never overtakes what follows, and a
        record fetched while acks are awaited is decided at once rather than
        after them. Offsets are committed behind the publishing, in batch
        order. At most ``max_batch_records`` decisions wait (then the loop
        waits too). The state is still changed by one batch at a time, under
        the lock.
        """
        kafka = self.settings.kafka
        backoff = self._backoff()
        intake, partitions = self.intake, self.partitions
        transactional = kafka.transactional_id is not None
        while not stop.is_set():
            # Before the fetch: an acquisition during it shows as a change.
            acquired = dict(partitions.acquisitions)
            try:
                batch = await unless_stopped(
                    self._consumer.getmany(
                        timeout_ms=kafka.fetch_wait_ms, max_records=kafka.max_batch_records
                    ),
                    stop,
                )
            except KafkaError as exc:
                log.warning("fetch failed", error=repr(exc), retry_in_s=backoff.delay)
                await backoff.wait(stop)
                continue
            if batch is None:
                return  # stopped while the fetch waited (a rebalance that does not end)
            backoff.reset()
            async with partitions.lock:
                out = intake.process(batch, acquired)
                out.extend(intake.advance_timers())
                if not out and not batch:
                    continue
                # Counted at once: this batch's decisions are in the state now.
                partitions.pending += 1
                if transactional:
                    # Unpipelined: the transaction carries the offsets, so it
                    # must see exactly this batch's positions.
                    try:
                        await self.publisher.publish_transaction(out, partitions.offsets, stop)
                    except Stopping:
                        return
                    partitions.pending -= 1
                    continue
                self._decided.extend(out)
                self._decided_batches += 1
                # The positions right after deciding it (the consumer's own are
                # ahead once the next batch is fetched).
                self._decided_offsets = partitions.offsets()
                publishing = partitions.in_flight
                if publishing is None or publishing.done():
                    if partitions.pending > self._decided_batches:
                        return  # an earlier batch was not published: a stop cut its retries short
                    partitions.in_flight = asyncio.create_task(self._publish_decided(stop))
                elif len(self._decided) >= kafka.max_batch_records:
                    await partitions.published()
                    continue
                # The next batch is usually fetched already, so the loop would
                # decide it without ever letting the producer's sender task
                # write this one to the broker (or the publishing task take it,
                # if its acks are in): a few turns of the event loop (about
                # four: queue, wake the sender, drain, write) put it on the wire.
                for _ in range(SENDER_TURNS):
                    await asyncio.sleep(0)

    async def _publish_decided(self, stop: asyncio.Event) -> None:
        """Publish every decided batch, in order, then commit their offsets; until none is left.

        Stopping (a stop while the broker does not answer) leaves ``pending``
        up, so nothing snapshots past the unpublished batches.
        """
        while self._decided_batches:
            out, batches, offsets = self._decided, self._decided_batches, self._decided_offsets
            self._decided, self._decided_batches, self._decided_offsets = [], 0, {}
            try:
                await self.publisher.publish(out, stop)
            except Stopping:
                return
            except Exception as exc:  # noqa: BLE001 - in a task it would wait unseen
                # Unpipelined, it ended the loop and ``run`` raised it: the same here.
                self.fail(exc)
                return
            self.partitions.pending -= batches
            self.partitions.commit_later(offsets, self._commit)

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit a published batch's offsets; a failure is counted, the next batch commits again.

        Committed offsets are for lag monitoring and tooling: a restart resumes
        from the snapshot's offsets, so a failed commit loses nothing, and
        the next batch's commit is its retry (no backoff here).
        """
        if not offsets:
            return
        try:
            # aiokafka retries a commit until the coordinator answers: with
            # the broker gone that is forever, and a stopping daemon hangs.
            await asyncio.wait_for(self._consumer.commit(offsets), self._client_timeout_s)
        except (KafkaError, TimeoutError) as exc:
            self.telemetry.commit_failures.inc()
            log.warning("offset commit failed", error=repr(exc))

    async def snapshot_all(self) -> None:
        await self.partitions.snapshot_all()

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
            await sleep_or_stop(stop, interval)

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        live = self.settings.live
        next_snapshot = time.monotonic() + live.snapshot_interval_s
        while not stop.is_set():
            await sleep_or_stop(stop, min(live.cluster_gauges_s, live.snapshot_interval_s))
            self.refresh_gauges()
            if time.monotonic() >= next_snapshot:
                await self.partitions.snapshot_all()
                heap.settle()
                self.settle_heap = False
                next_snapshot = time.monotonic() + live.snapshot_interval_s
            elif self.settle_heap:
                heap.settle_new()
                self.settle_heap = False

    def refresh_gauges(self) -> None:
        engine = self.engine
        lags = self.telemetry.refresh(
            engine.pools.values(), self._consumer, self.partitions.owned, len(engine.quarantined())
        )
        self.lag_watch.observe(lags, ready=all(self.readiness().values()))
        self.telemetry.tasks.set(len(asyncio.all_tasks()))

    async def _shutdown(self) -> None:
        consumer, producer = self._consumer, self._producer
        try:
            if consumer is not None:
                async with self.partitions.lock:
                    # Drain: the batch in flight is published (or given up, if a
                    # stop cut its retries short) and committed before the snapshot.
                    if await self.partitions.settled():
                        self.partitions.snapshot_owned()
                        await self._commit(self.partitions.offsets())
                    # The snapshots are written: leaving the group must not redo
                    # them, nor take partitions a late rebalance still assigns.
                    self.partitions.close()
        finally:
            # A snapshot that cannot be written is raised, but the clients still close.
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
            await self.daemon.partitions.release(revoked)
        except SnapshotError as exc:
            self.daemon.fail(exc)
        except Exception as exc:  # noqa: BLE001 - raised here, it would be logged and lost
            self.daemon.fail(PartitionError(f"giving up partitions failed: {exc!r}"))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            restored = await self.daemon.partitions.acquire(assigned)
            # The restored state is long-lived: freeze it, but at housekeeping's
            # next turn rather than here, where the collection would delay the
            # first decisions after a failover. Only if a pool was restored:
            # otherwise the heap is as start-up settled it, and the collection
            # would only stall the decisions in flight.
            if restored:
                self.daemon.settle_heap = True
        except SnapshotError as exc:
            self.daemon.fail(exc)
        except Exception as exc:  # noqa: BLE001 - raised here, it would be logged and lost
            self.daemon.fail(PartitionError(f"taking partitions failed: {exc!r}"))


def _count(partitions: set[int] | None) -> int | None:
    return len(partitions) if partitions else None


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
    config = settings.engine_config(trace_has_hosts=settings.hosts.source == "trace")
    # A defect quarantines its pool rather than stopping every pool of the
    # partition at each restart (``core/quarantine.py``); replay stops.
    return dataclasses.replace(config, on_defect=settings.live.on_defect)
