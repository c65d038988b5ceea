"""``lavad demo``: the embedded broker, the daemon and a trace publisher in one process.

What ``make run`` shows a new user: a Kafka-compatible broker (Tansu, memory
storage) on loopback, the live daemon consuming from it, a recorded trace
published into the input topics, and a live table of what the daemon did.
The broker forgets everything when it stops, so each demo starts from empty
topics and an empty snapshot directory (``var/demo/``, which also holds the
broker's and the daemon's logs).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client import CollectorRegistry
from rich.live import Live
from rich.table import Table

from lavad.daemon.console import out
from lavad.daemon.live.connection import client_options
from lavad.daemon.live.logs import configure_logging
from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.settings import Settings
from lavad.streams.adapters.base import Trace
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import TopicNames, create_topics


@dataclass(frozen=True, slots=True)
class DemoOptions:
    speed: float
    partitions: int
    exit_when_done: bool
    state_dir: Path


@dataclass(slots=True)
class _Progress:
    published: int = 0
    publishing_done: bool = False
    # (wall, records processed) over the last couple of seconds, for the rate
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=8))

    def rate(self, processed: int) -> float:
        now = time.monotonic()
        self.recent.append((now, processed))
        then, before = self.recent[0]
        return (processed - before) / (now - then) if now > then else 0.0


def demo_settings(settings: Settings, bootstrap: str, snapshots: Path) -> Settings:
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"bootstrap_servers": bootstrap}),
            "live": settings.live.model_copy(update={"snapshot_dir": snapshots}),
        }
    )


async def run_demo(
    settings: Settings,
    trace: Trace,
    options: DemoOptions,
    install_signals: Callable[[asyncio.Event], None],
) -> None:
    stop = asyncio.Event()
    install_signals(stop)
    state = options.state_dir / "demo"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    with (
        EmbeddedBroker.start(log=state / "broker.log") as broker,
        (state / "lavad.log").open("wb") as log_file,
    ):
        settings = demo_settings(settings, broker.bootstrap_servers, state / "snapshots")
        configure_logging(settings.log, log_file)
        names = settings.topics
        admin = AIOKafkaAdminClient(**client_options(settings.kafka))
        await admin.start()
        try:
            await create_topics(admin, names, options.partitions, 1)
        finally:
            await admin.close()
        daemon = LiveDaemon(settings, live_engine_config(settings))
        daemon_task = asyncio.create_task(daemon.run(stop))
        progress = _Progress()
        publisher: asyncio.Task[None] | None = None
        out.print(
            f"broker {broker.bootstrap_servers} · metrics http://{settings.http.host}:"
            f"{settings.http.port}/metrics · logs {state}/ · Ctrl-C stops"
        )
        with Live(_table(daemon, progress, trace.name), console=out, refresh_per_second=4) as live:
            try:
                while not stop.is_set() and not daemon_task.done():
                    await asyncio.sleep(0.25)
                    if publisher is None and all(daemon.readiness().values()):
                        # Publish once the daemon holds its partitions, so the
                        # latencies shown are the daemon's, not the group join's.
                        publisher = asyncio.create_task(
                            _publish(settings, trace, names, options.speed, progress)
                        )
                    daemon.refresh_gauges()
                    live.update(_table(daemon, progress, trace.name))
                    finished = (
                        progress.publishing_done and daemon.records_processed >= progress.published
                    )
                    if finished and options.exit_when_done:
                        stop.set()
            finally:
                stop.set()
                if publisher is not None:
                    publisher.cancel()
                    await asyncio.gather(publisher, return_exceptions=True)
                await daemon_task
                # The last table is drawn once the publisher's producer has
                # flushed and the daemon has stopped: the counts are final.
                daemon.refresh_gauges()
                live.update(_table(daemon, progress, trace.name, stopped=True), refresh=True)
        # Only now, after the daemon's final commit, does the broker stop.


async def _publish(
    settings: Settings, trace: Trace, names: TopicNames, speed: float, progress: _Progress
) -> None:
    producer = AIOKafkaProducer(acks="all", linger_ms=5, **client_options(settings.kafka))

    def tick(count: int) -> None:
        # Each acknowledgement as it arrives: "records published" is never
        # behind what the daemon could have read.
        progress.published = count

    try:
        await producer.start()
        await publish_trace(trace.events(), producer, names, speed=speed, progress=tick)
        progress.publishing_done = True
    finally:
        # Flushes what was sent before a Ctrl-C; their acknowledgements count.
        await producer.stop()


def _table(
    daemon: LiveDaemon, progress: _Progress, trace_name: str, *, stopped: bool = False
) -> Table:
    registry = daemon.telemetry.registry
    table = Table(title=f"lavad live · {trace_name}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    done = " (done)" if progress.publishing_done else ""
    table.add_row("records published", f"{progress.published:,}{done}")
    table.add_row("records processed", f"{daemon.records_processed:,}")
    table.add_row("records/s (last 2 s)", f"{progress.rate(daemon.records_processed):,.0f}")
    for kind, count in _samples(registry, "lavad_decisions_total", "kind").items():
        table.add_row(f"decisions: {kind}", f"{count:,.0f}")
    for stage, count in _samples(registry, "lavad_dead_letters_total", "stage").items():
        table.add_row(f"dead letters: {stage}", f"{count:,.0f}")
    lag = sum(_samples(registry, "lavad_consumer_lag_records", "partition").values())
    table.add_row("consumer lag (records)", f"{lag:,.0f}")
    p50, p99 = _quantile(registry, 0.5), _quantile(registry, 0.99)
    table.add_row("decision latency p50 / p99", f"<= {p50} / <= {p99}")
    table.add_row("ready", "stopped" if stopped else str(all(daemon.readiness().values())))
    for name, pool in sorted(daemon.engine.pools.items()):
        cluster = pool.cluster
        up = cluster.hosts_up
        empty = 100.0 * cluster.hosts_empty / up if up else 0.0
        table.add_row(f"pool {name}: hosts up / VMs", f"{up:,} / {len(cluster.vms):,}")
        table.add_row(f"pool {name}: empty hosts", f"{empty:.1f} %")
        used, capacity = cluster.used_total, cluster.capacity_total
        if capacity[0]:
            table.add_row(f"pool {name}: CPU booked", f"{100.0 * used[0] / capacity[0]:.1f} %")
    return table


def _samples(registry: CollectorRegistry, name: str, label: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get(label, "")
                found[key] = found.get(key, 0.0) + sample.value
    return found


def _quantile(registry: CollectorRegistry, q: float) -> str:
    """The upper bound of the histogram bucket holding quantile ``q``."""
    buckets: list[tuple[float, float]] = []
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "lavad_decision_latency_seconds_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return "-"
    total = buckets[-1][1]
    for bound, count in buckets:
        if count >= q * total:
            return "inf" if bound == float("inf") else f"{bound * 1000:g} ms"
    return "inf"
