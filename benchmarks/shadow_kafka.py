"""Shadow mode over Kafka on a whole stream: the advice published equals the shadow replay's.

    python -m benchmarks.shadow_kafka STREAM.jsonl [--policy lava] [--hosts 950]

STREAM is an existing scheduler's stream (``lavad shadow placements``). On an
embedded broker (Tansu, memory storage) the stream is published to the input
topics; a live daemon with ``[shadow] enabled`` in this process consumes all
of it; its advice topic is read back and compared, record for record, with
an in-process shadow replay of the same events run in this process (the
same code, so a change in a policy between runs cannot pass for a
difference). Prints the counts, the wall times, the equality, and whether
the placements topic was ever created (it must not be). The configuration
is ``config/lavad.toml`` with a fixed pool of ``--hosts`` hosts of its shape.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import tempfile
import time
from pathlib import Path

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.settings import Settings, load_settings
from lavad.daemon.shadow.live import topic_names
from lavad.daemon.shadow.replay import shadow_replay
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import ensure_topics
from lavad.streams.schema import Event

CONFIG = Path(__file__).resolve().parents[1] / "config" / "lavad.toml"


def shadow_settings(bootstrap: str, snapshots: Path, policy: str, hosts: int) -> Settings:
    settings = load_settings(CONFIG)
    return settings.model_copy(
        update={
            "placement": settings.placement.model_copy(update={"policy": policy}),
            "hosts": settings.hosts.model_copy(
                update={"source": "shape", "count": hosts, "grow_on_demand": False}
            ),
            "shadow": settings.shadow.model_copy(update={"enabled": True}),
            "kafka": settings.kafka.model_copy(update={"bootstrap_servers": bootstrap}),
            "live": settings.live.model_copy(update={"snapshot_dir": snapshots}),
            "http": settings.http.model_copy(update={"port": 0}),
        }
    )


async def read_all(bootstrap: str, topic: str, count: int, timeout_s: float) -> list[bytes]:
    """The first ``count`` records of ``topic``, partition by partition in offset order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        await consumer.topics()
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        records = []
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
    records.sort(key=lambda r: (r.partition, r.offset))
    return [r.value for r in records]


async def run(stream: Path, policy: str, hosts: int) -> bool:
    events: list[Event] = [e for e in open_trace(stream).events() if not isinstance(e, BadRecord)]
    with EmbeddedBroker.start() as broker, tempfile.TemporaryDirectory() as snapshots:
        bootstrap = broker.bootstrap_servers
        settings = shadow_settings(bootstrap, Path(snapshots), policy, hosts)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await ensure_topics(admin, topic_names(settings), settings.topics.partitions)
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        started = time.perf_counter()
        try:
            await publish_trace(events, producer, settings.topics)
        finally:
            await producer.stop()
        print(f"published {len(events):,} events in {time.perf_counter() - started:.0f} s")

        daemon = LiveDaemon(settings, live_engine_config(settings))
        stop = asyncio.Event()
        started = time.perf_counter()
        task = asyncio.create_task(daemon.run(stop))
        while daemon.records_processed < len(events):
            if task.done():
                await task  # raises what stopped it
                raise RuntimeError("the daemon stopped before the end of the stream")
            await asyncio.sleep(0.5)
        live_s = time.perf_counter() - started
        stop.set()
        await task
        print(f"daemon: {daemon.records_processed:,} records in {live_s:.0f} s")

        started = time.perf_counter()
        sink = io.BytesIO()
        shadow_replay(iter(events), live_engine_config(settings), decisions_out=sink)
        expected = sink.getvalue().splitlines()
        replay_s = time.perf_counter() - started
        print(f"shadow replay in process: {len(expected):,} advice in {replay_s:.0f} s")
        got = await read_all(bootstrap, settings.shadow.topic, len(expected), 600.0)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            placements = settings.topics.placements in await admin.list_topics()
        finally:
            await admin.close()
    equal = got == expected
    print(f"advice on {settings.shadow.topic}: {len(got):,}; equal to the replay: {equal}")
    if not equal:
        for i, (a, b) in enumerate(zip(got, expected, strict=False)):
            if a != b:
                print(
                    f"first difference at record {i}:\n  kafka  {a[:300]!r}\n  replay {b[:300]!r}"
                )
                break
    print(f"{settings.topics.placements} created: {placements}")
    return equal and not placements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stream", type=Path)
    parser.add_argument("--policy", default="lava")
    parser.add_argument("--hosts", type=int, default=950)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    sys.exit(0 if asyncio.run(run(args.stream, args.policy, args.hosts)) else 1)


if __name__ == "__main__":
    main()
