"""The live shell against a real Kafka-protocol broker: sustained ingest and decision latency.

``python -m benchmarks --live`` runs this (and only this). Two measurements,
each on its own embedded Tansu broker (memory storage, loopback), with the
daemon in this process on this event loop and the default configuration
(``config/lavad.toml``: Best Fit, stranding metrics on) at log level warning:

* sustained ingest: real Azure V1 events (the bundled slice, one pool per
  input partition, each pool its own lifetime-sampling seed) published before
  the daemon starts; the rate is taken from the first processed record to
  the last, so the group join is left out. Baseline in the same process: the
  in-process replay of the same events (no Kafka, no JSON decoding);
* decision latency at a fixed input rate: the daemon is started and ready
  first, then the records are published at a steady rate, each stamped with
  the wall time of its sending as its Kafka timestamp. A reader outside any
  group (fetch_max_wait_ms=5) notes when each placement arrives: an upper
  bound, as it adds the reader's own fetch. Baseline: the same paced
  publishing with no daemon, the input records themselves read back (one
  broker hop; lavad's path takes two). The embedded broker's fetches slow
  down as a partition fills with small batches, so each run gets a fresh
  broker and the table shows the first and last seconds apart.

The broker and the load generator share the machine's cores with the daemon
(and the generator its event loop), so every figure is for one instance on a
shared box, not an isolated daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import io
import itertools
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner

from benchmarks.live_path import live_path_overhead
from lavad.daemon import heap
from lavad.daemon.live.logs import configure_logging
from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.replay import replay
from lavad.daemon.settings import LogSettings, Settings, load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord, decode_event, encode
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import TopicNames, ensure_topics
from lavad.streams.schema import Event, VmRequest

ROOT = Path(__file__).resolve().parents[1]
SLICE_AZURE = ROOT / "data" / "azure-v1-vms-slice"
NAMES = TopicNames()
PARTITIONS = 3


# ------------------------------------------------------------------ inputs


def pools_on_every_partition(partitions: int, prefix: str) -> list[str]:
    """One pool name per partition number, as the default (murmur2) partitioner keys them."""
    chosen: dict[int, str] = {}
    numbers = list(range(partitions))
    for i in itertools.count():
        name = f"{prefix}-{i}"
        chosen.setdefault(DefaultPartitioner()(name.encode(), numbers, numbers), name)
        if len(chosen) == partitions:
            return [chosen[n] for n in numbers]
    raise AssertionError("unreachable")


def azure_events(pools: Sequence[str], per_pool: int | None, first_seed: int) -> list[Event]:
    """The slice once per pool (each with its own seed), merged by event time."""
    streams = []
    for seed, pool in enumerate(pools, start=first_seed):
        events = (
            item
            for item in open_trace(SLICE_AZURE, seed=seed, pool=pool).events()
            if not isinstance(item, BadRecord)
        )
        streams.append(list(itertools.islice(events, per_pool)))
    return list(heapq.merge(*streams, key=lambda event: event.time))


def bench_settings(bootstrap: str, snapshots: Path, **kafka: Any) -> Settings:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"bootstrap_servers": bootstrap, **kafka}),
            "live": settings.live.model_copy(update={"snapshot_dir": snapshots}),
            "http": settings.http.model_copy(update={"port": 0}),
        }
    )


async def create_topics(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await ensure_topics(admin, NAMES, PARTITIONS)
    finally:
        await admin.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (0.0 where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def start_daemon(settings: Settings) -> tuple[LiveDaemon, asyncio.Event, asyncio.Task[None]]:
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    return daemon, stop, asyncio.create_task(daemon.run(stop))


async def wait_until(predicate: Any, timeout_s: float, what: str, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval)


# ------------------------------------------------------------------ ingest


@dataclass(slots=True)
class Ingest:
    records: int
    publish_seconds: float
    join_seconds: float
    timed_records: int
    timed_seconds: float
    daemon_cpu_seconds: float
    broker_cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.timed_records / self.timed_seconds


async def _ingest(broker: EmbeddedBroker, events: list[Event], snapshots: Path) -> Ingest:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=256 * 1024
    )
    await producer.start()
    try:
        published = await publish_trace(events, producer, NAMES)
    finally:
        await producer.stop()
    settings = bench_settings(bootstrap, snapshots)
    began = time.perf_counter()
    daemon, stop, task = await start_daemon(settings)
    try:
        await wait_until(lambda: daemon.records_processed > 0, 60, "the first record")
        first_seen = time.perf_counter()
        first_count = daemon.records_processed
        cpu0 = time.process_time()
        broker0 = cpu_seconds(broker.process.pid)
        # Processed and acknowledged: the daemon decides a batch while the one
        # before it is still being published, so the count alone is early.
        await wait_until(
            lambda: daemon.records_processed >= len(events) and daemon.partitions.pending == 0,
            120,
            "every record",
        )
        done = time.perf_counter()
        cpu = time.process_time() - cpu0
        broker_cpu = cpu_seconds(broker.process.pid) - broker0
    finally:
        stop.set()
        await task
    return Ingest(
        records=published.records,
        publish_seconds=published.wall_seconds,
        join_seconds=first_seen - began,
        timed_records=len(events) - first_count,
        timed_seconds=done - first_seen,
        daemon_cpu_seconds=cpu,
        broker_cpu_seconds=broker_cpu,
    )


def sustained_ingest(per_pool: int) -> None:
    pools = pools_on_every_partition(PARTITIONS, "ingest")
    events = azure_events(pools, per_pool, first_seed=0)
    settings = load_settings(ROOT / "config" / "lavad.toml")

    # Baselines in this process: the engine alone (events already decoded), and decoding alone,
    # under the collector's schedule the daemon sets for itself (and `lavad replay` too).
    # The fastest of 3 replays: one timed replay moved from 63k to 106k events/s
    # between runs on this VM, and a slow baseline made the ratio look met.
    heap.tune_collector()
    runs = []
    for _ in range(3):
        heap.settle()
        cpu0 = time.process_time()
        run = replay(events, live_engine_config(settings), decisions_out=io.BytesIO())
        runs.append((time.process_time() - cpu0, run))
    replay_cpu_s, result = min(runs, key=lambda timed: timed[0])
    replay_cpu_us = replay_cpu_s / len(events) * 1e6
    encoded = [encode(event) for event in events]
    began = time.perf_counter()
    for raw in encoded:
        decode_event(raw)
    decode_rate = len(encoded) / (time.perf_counter() - began)

    # The fastest of 3 live runs too (each on a fresh broker), so that both sides of
    # the ratio get the same treatment; every run's rate is printed.
    ingests = []
    for _ in range(3):
        with EmbeddedBroker.start() as broker, tempfile.TemporaryDirectory() as snapshots:
            ingests.append(asyncio.run(_ingest(broker, events, Path(snapshots))))
    ingest = max(ingests, key=lambda run: run.rate)

    wall = ingest.timed_seconds
    print(
        f"live ingest: {ingest.records:,} real Azure V1 events, {len(pools)} pools on "
        f"{PARTITIONS} partitions, published before the daemon starts"
    )
    print(f"  (broker, daemon and this harness share {os.cpu_count()} cores)")
    publish_rate = ingest.records / ingest.publish_seconds
    print(f"  publishing to the broker         {publish_rate:>10,.0f} records/s")
    print(f"  daemon start to first record     {ingest.join_seconds:>10.2f} s (group join)")
    print(
        f"  Kafka shell, sustained (best of 3) {ingest.rate:>8,.0f} records/s "
        f"({ingest.timed_records:,} records in {wall:.2f} s; the 3 runs: "
        f"{', '.join(f'{run.rate:,.0f}' for run in ingests)})"
    )
    print(f"  in-process replay (best of 3)    {result.events_per_second:>10,.0f} events/s")
    print(f"  decode_event alone               {decode_rate:>10,.0f} records/s")
    print(f"  Kafka shell / in-process replay  {ingest.rate / result.events_per_second:>10.2f}x")
    print(
        f"  CPU while timed: this process {ingest.daemon_cpu_seconds / wall:.0%} of a core, "
        f"broker {ingest.broker_cpu_seconds / wall:.0%} of a core"
    )
    # On a shared box the wall-clock rates move with the neighbours' load; CPU
    # time per record is the steadier comparison of the work each path does.
    live_cpu_us = ingest.daemon_cpu_seconds / ingest.timed_records * 1e6
    print(
        f"  CPU per record: live {live_cpu_us:.1f} us, replay {replay_cpu_us:.1f} us "
        f"(replay / live {replay_cpu_us / live_cpu_us:.2f}x)"
    )
    # The same work with the network left out (benchmarks/live_path.py): what
    # the shell adds per record to the engine's work, and how much is decoding.
    path_replay_us, path_live_us = live_path_overhead(settings, events, NAMES, PARTITIONS)
    print(
        f"  without a broker (CPU, min of 3): live path {path_live_us:.1f} us, replay "
        f"{path_replay_us:.1f} us a record (replay / live {path_replay_us / path_live_us:.2f}x); "
        f"of the {path_live_us - path_replay_us:.1f} us more, decoding {1e6 / decode_rate:.1f} us"
    )
    ratio = ingest.rate / result.events_per_second
    # Wall rates measured seconds apart on a shared VM swing either way (a loaded
    # replay once made the live shell look 1.38x as fast), so the CPU per record
    # is printed beside the wall ratio. The ratio is reported, not a goal: scale
    # comes from partitions and instances, so the goal is the rate one instance
    # sustains.
    cpu_ratio = replay_cpu_us / live_cpu_us
    print(f"  live / replay: wall {ratio:.2f}x, CPU {cpu_ratio:.2f}x (reported; not a goal)")
    met = ingest.rate >= 40_000
    print(f"  goal >= 40,000 records/s per instance: {'met' if met else 'NOT met'}")


# ----------------------------------------------------------------- latency


@dataclass(slots=True)
class Series:
    """Latencies (ms) of one view, with the send time (s from the first send) of each."""

    label: str
    at: np.ndarray
    ms: np.ndarray

    def row(self, seconds: float, window: float) -> str:
        p50, p99 = np.percentile(self.ms, [50, 99])
        early = self.ms[self.at < window]
        late = self.ms[self.at >= seconds - window]
        first = np.percentile(early, 99) if early.size else float("nan")
        last = np.percentile(late, 99) if late.size else float("nan")
        return (
            f"  {self.label:<54}{p50:>8.1f}{p99:>8.1f}{self.ms.max():>8.1f}"
            f"{first:>14.1f}{last:>13.1f}"
        )


@dataclass(slots=True)
class Latency:
    sent: int
    requests: int
    seconds: float
    views: list[Series]
    histogram: list[tuple[float, float]]  # the daemon's own: (upper bound s, cumulative count)


class _Reader:
    """Reads a topic outside any group; notes when each VM's record arrives, and its timestamp.

    On an input topic it keeps the VM requests; on the placements topic, the decisions.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=5,
        )
        self.arrivals: dict[tuple[str, str], tuple[float, int]] = {}

    async def start(self) -> None:
        await self.consumer.start()
        partitions = self.consumer.partitions_for_topic(self.topic) or set()
        self.consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])
        await self.consumer.seek_to_beginning()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batch = await self.consumer.getmany(timeout_ms=50)
            now = time.time()
            for records in batch.values():
                for record in records:
                    body = orjson.loads(record.value)
                    if body.get("type", "vm.request") == "vm.request":
                        key = (body["pool"], body["vm_id"])
                        self.arrivals.setdefault(key, (now, record.timestamp))


async def _paced_publish(
    bootstrap: str, events: Iterable[Event], rate: float, sent_at: dict[tuple[str, str], float]
) -> tuple[int, float]:
    """Send at ``rate`` records/s, each stamped with its wall send time (no linger)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    pending = []
    count = 0
    try:
        began = time.monotonic()
        for count, event in enumerate(events, start=1):
            wait = began + (count - 1) / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            now = time.time()
            if isinstance(event, VmRequest):
                sent_at[(event.pool, event.vm_id)] = now
            pending.append(
                await producer.send(
                    NAMES.for_event_type(event.type),
                    encode(event),
                    key=event.pool.encode(),
                    timestamp_ms=int(now * 1000),
                )
            )
            if len(pending) >= 1_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return count, time.monotonic() - began
    finally:
        await producer.stop()


def _histogram(daemon: LiveDaemon) -> list[tuple[float, float]]:
    buckets: list[tuple[float, float]] = []
    for metric in daemon.telemetry.registry.collect():
        if metric.name != "lavad_decision_latency_seconds":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
    return sorted(buckets)


async def _measure(
    bootstrap: str, topic: str, events: list[Event], rate: float
) -> tuple[int, float, dict[tuple[str, str], float], _Reader]:
    """Publish at ``rate`` while a reader of ``topic`` notes arrivals; wait for the stragglers."""
    reader = _Reader(bootstrap, topic)
    await reader.start()
    done = asyncio.Event()
    reading = asyncio.create_task(reader.run(done))
    sent_at: dict[tuple[str, str], float] = {}
    try:
        sent, seconds = await _paced_publish(bootstrap, events, rate, sent_at)
        with contextlib.suppress(TimeoutError):
            await wait_until(
                lambda: len(reader.arrivals) >= len(sent_at), 10, "every record", interval=0.05
            )
    finally:
        done.set()
        await reading
        await reader.consumer.stop()
    return sent, seconds, sent_at, reader


def _views(
    sent_at: dict[tuple[str, str], float], reader: _Reader, labels: tuple[str, str | None]
) -> list[Series]:
    first = min(sent_at.values())
    at, receipt, stamped = [], [], []
    for key, sent_time in sent_at.items():
        arrival = reader.arrivals.get(key)
        if arrival is None:
            continue
        received, record_ms = arrival
        at.append(sent_time - first)
        receipt.append((received - sent_time) * 1e3)
        stamped.append(float(record_ms - int(sent_time * 1000)))
    times = np.asarray(at)
    views = [Series(labels[0], times, np.asarray(receipt))]
    if labels[1] is not None:
        views.append(Series(labels[1], times, np.asarray(stamped)))
    return views


async def _broker_alone(broker: EmbeddedBroker, events: list[Event], rate: float) -> Latency:
    """The same paced publishing with no daemon: the input records themselves read back."""
    await create_topics(broker.bootstrap_servers)
    sent, seconds, sent_at, reader = await _measure(
        broker.bootstrap_servers, NAMES.vm_events, events, rate
    )
    views = _views(sent_at, reader, ("broker alone: input sent -> same record read", None))
    return Latency(sent, len(sent_at), seconds, views, [])


async def _with_daemon(
    broker: EmbeddedBroker, events: list[Event], rate: float, snapshots: Path
) -> Latency:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap)
    daemon, stop, task = await start_daemon(bench_settings(bootstrap, snapshots))
    try:
        await wait_until(lambda: all(daemon.readiness().values()), 60, "the daemon to be ready")
        sent, seconds, sent_at, reader = await _measure(bootstrap, NAMES.placements, events, rate)
    finally:
        stop.set()
        await task
    views = _views(
        sent_at,
        reader,
        (
            "lavad: input sent -> decision read (upper bound)",
            "lavad: input timestamp -> decision record timestamp",
        ),
    )
    return Latency(sent, len(sent_at), seconds, views, _histogram(daemon))


def _bucket_quantile(buckets: list[tuple[float, float]], q: float) -> tuple[float, float]:
    """(upper bound of the bucket holding quantile q, Prometheus-style interpolation), in ms."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return upper, lower * 1e3
            share = (rank - below) / (count - below) if count > below else 1.0
            return upper * 1e3, (lower + (upper - lower) * share) * 1e3
        lower, below = upper, count
    return float("inf"), float("inf")


def decision_latency(rate: float, seconds: float) -> None:
    pools = pools_on_every_partition(PARTITIONS, "latency")
    count = int(rate * seconds)
    events = azure_events(pools, count // len(pools) + 1, first_seed=10)[:count]
    # Each run on a fresh broker: the embedded broker slows down as a partition fills.
    with EmbeddedBroker.start() as broker:
        alone = asyncio.run(_broker_alone(broker, events, rate))
    with EmbeddedBroker.start() as broker, tempfile.TemporaryDirectory() as snapshots:
        lavad = asyncio.run(_with_daemon(broker, events, rate, Path(snapshots)))

    window = min(3.0, seconds / 3)
    print(
        f"live decision latency at {rate:,.0f} records/s for {seconds:g} s: {lavad.sent:,} "
        f"records ({lavad.requests:,} VM requests), achieved "
        f"{lavad.sent / lavad.seconds:,.0f} records/s, "
        f"{lavad.views[0].ms.size:,} decisions matched"
    )
    print(f"  (broker, daemon, paced publisher and reader share {os.cpu_count()} cores and one")
    print("  event loop; each run on a fresh broker; the reader polls with fetch_max_wait_ms=5)")
    print(
        f"  {'view':<54}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
        f"{f'p99 first {window:g}s':>14}{f'p99 last {window:g}s':>13}"
    )
    for view in [*alone.views, *lavad.views]:
        print(view.row(seconds, window))
    if lavad.histogram and lavad.histogram[-1][1] > 0:
        b50, i50 = _bucket_quantile(lavad.histogram, 0.50)
        b99, i99 = _bucket_quantile(lavad.histogram, 0.99)
        print(
            f"  lavad's own histogram, input timestamp -> decision acked, "
            f"{lavad.histogram[-1][1]:,.0f} decisions:"
        )
        print(f"    p50 <= {b50:g} ms (interpolated {i50:.1f}), p99 <= {b99:g} ms ({i99:.1f})")
    lavad_p99 = float(np.percentile(lavad.views[0].ms, 99))
    broker_p99 = float(np.percentile(alone.views[0].ms, 99))
    print(f"  lavad p99 / broker-alone p99 (read views): {lavad_p99 / broker_p99:.2f}x")
    verdict = "met" if lavad_p99 <= 50 else "NOT met"
    print(f"  goal p99 <= 50 ms at 1,000 records/s (upper-bound view): {verdict}")


def live_benchmark(per_pool: int = 30_000, rate: float = 1_000.0, seconds: float = 10.0) -> None:
    """Print the live figures: sustained ingest, then latency at a fixed rate (about a minute)."""
    configure_logging(LogSettings(level="warning"))
    sustained_ingest(per_pool)
    decision_latency(rate, seconds)
