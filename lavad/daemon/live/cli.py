"""``lavad run``, ``lavad produce`` and ``lavad demo``: the live commands."""

from __future__ import annotations

import asyncio
import math
import signal
import sys
from pathlib import Path
from typing import Annotated

import structlog
import typer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from lavad.daemon.console import err, fail, out, seed_option, settings_or_exit
from lavad.daemon.live.connection import SecurityRefusal, check_security, client_options
from lavad.daemon.live.demo import DemoOptions, run_demo
from lavad.daemon.live.logs import configure_logging
from lavad.daemon.live.shell import LiveDaemon, PartitionError, StartupError, live_engine_config
from lavad.daemon.live.snapshots import SnapshotError
from lavad.daemon.shadow.live import topic_names
from lavad.streams.adapters import TraceFormatError, open_trace
from lavad.streams.kafka.deadletter import record_json
from lavad.streams.kafka.embedded import BrokerError, EmbeddedBroker
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import TopicError, create_topics


class PublishingStopped(Exception):
    """SIGINT or SIGTERM ended ``lavad produce`` before the trace did."""


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def run_command(
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
) -> None:
    """Run the daemon: consume the input topics, publish decisions, serve /metrics."""
    # The same checks as `lavad config check` (settings.check_live_settings).
    settings = settings_or_exit(config, live=True)
    configure_logging(settings.log)
    engine_config = live_engine_config(settings)
    names = topic_names(settings)
    # What this instance consumes and publishes, before anything connects.
    structlog.get_logger("lavad.live").info(
        "starting",
        consumes=list(names.inputs),
        publishes=list(names.outputs),
        bootstrap=settings.kafka.bootstrap_servers,
        group=settings.kafka.group_id,
        policy=settings.placement.policy,
        shadow=settings.shadow.enabled,
        pools_allowed=list(settings.pools.allow),
        http=f"{settings.http.host}:{settings.http.port}",
        snapshots=str(settings.live.snapshot_dir),
    )

    async def main() -> None:
        stop = asyncio.Event()
        install_stop_signals(stop)
        await LiveDaemon(settings, engine_config).run(stop)

    try:
        asyncio.run(main())
    except (SnapshotError, PartitionError, TopicError, StartupError, SecurityRefusal) as exc:
        # The reason and exit code 2, not a traceback.
        raise fail(str(exc)) from None


def _check_speed(speed: float) -> None:
    """Exit with the reason unless ``--speed`` is a finite rate >= 0.

    The publisher paces only when ``speed > 0``: NaN, infinity or a negative
    number would publish as fast as 0 does, unasked.
    """
    if not (math.isfinite(speed) and speed >= 0):
        raise fail(f"--speed must be a finite number >= 0, got {speed}")


def produce_command(
    path: Annotated[Path, typer.Argument(help="trace file or directory (see `lavad trace info`)")],
    speed: Annotated[
        float, typer.Option(help="times real time; 0 publishes as fast as the broker takes it")
    ] = 0.0,
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
    seed: Annotated[int, seed_option("seed for sampled trace fields")] = 0,
    limit: Annotated[
        int | None, typer.Option(min=1, help="publish at most this many records")
    ] = None,
    from_offset: Annotated[
        int,
        typer.Option(min=0, help="skip the trace's first N records (resume an interrupted run)"),
    ] = 0,
) -> None:
    """Publish a recorded trace to the input topics (keyed by pool)."""
    _check_speed(speed)
    settings = settings_or_exit(config)
    try:
        trace = open_trace(path, seed=seed)
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    names = settings.topics
    acknowledged = 0

    def tick(count: int) -> None:
        nonlocal acknowledged
        acknowledged = count

    async def main() -> None:
        producer = AIOKafkaProducer(acks="all", linger_ms=5, **client_options(settings.kafka))
        # SIGINT and SIGTERM stop the publishing the same way, also where SIGINT
        # came in ignored (a job a non-interactive shell started in the
        # background), which asyncio.run's own Ctrl-C handling would leave
        # ignored: a supervisor can stop it and learn how far it got.
        publishing = asyncio.current_task()
        signalled: list[int] = []

        def interrupt(signum: int) -> None:
            signalled.append(signum)
            if publishing is not None:
                publishing.cancel()

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, interrupt, signum)
        try:
            await check_security(settings.kafka)
            await producer.start()
            result = await publish_trace(
                trace.events(),
                producer,
                names,
                speed=speed,
                limit=limit,
                skip=from_offset,
                progress=tick,
            )
        except asyncio.CancelledError:
            if signalled:
                raise PublishingStopped from None
            raise
        finally:
            # Also when start() failed: an unstopped producer leaks its client.
            await producer.stop()
        out.print(
            f"published {result.records} records ({result.unreadable_rows} unreadable rows "
            f"passed through for dead-lettering) in {result.wall_seconds:.1f} s; the trace's "
            f"records {from_offset} to {from_offset + result.records} are on the broker"
        )

    def how_far() -> str:
        reached = from_offset + acknowledged
        return (
            f"the broker acknowledged {acknowledged} records of this run (the trace's first "
            f"{reached}); resume with --from-offset {reached}"
        )

    try:
        asyncio.run(main())
    except SecurityRefusal as exc:
        raise fail(str(exc)) from None
    except KafkaError as exc:
        raise fail(f"broker at {settings.kafka.bootstrap_servers}: {exc!r}; {how_far()}") from None
    except (KeyboardInterrupt, PublishingStopped):
        # The publisher was cancelled and the producer stopped first.
        raise fail(f"interrupted; {how_far()}") from None


def demo_command(
    path: Annotated[
        Path, typer.Argument(help="trace to publish (the bundled real slice by default)")
    ] = Path("data/azure-v1-vms-slice"),
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
    speed: Annotated[float, typer.Option(help="times real time; 0 = as fast as possible")] = 0.0,
    partitions: Annotated[int, typer.Option(min=1, help="partitions per topic")] = 3,
    exit_when_done: Annotated[
        bool, typer.Option(help="stop once every published record is processed")
    ] = False,
) -> None:
    """Embedded broker + daemon + trace publisher, with a live summary; Ctrl-C stops all."""
    _check_speed(speed)
    settings = settings_or_exit(config)
    try:
        trace = open_trace(path, seed=settings.seed)
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    options = DemoOptions(
        speed=speed, partitions=partitions, exit_when_done=exit_when_done, state_dir=Path("var")
    )
    try:
        asyncio.run(run_demo(settings, trace, options, install_stop_signals))
    except (BrokerError, SnapshotError, TopicError, StartupError) as exc:
        raise fail(str(exc)) from None
    err.print("demo stopped")


def topics_create_command(
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
) -> None:
    """Create lavad's input and output topics ([topics] partitions and replication_factor).

    Topics that exist with the configured partition count are left as they
    are, so running it again is harmless; one with another count is an error.
    """
    settings = settings_or_exit(config)
    # With [shadow] enabled: the inputs, the advice topic and the dead letters.
    names = topic_names(settings)
    topics = settings.topics

    async def main() -> None:
        admin = AIOKafkaAdminClient(**client_options(settings.kafka))
        try:
            await check_security(settings.kafka)
            await admin.start()
            made = await create_topics(admin, names, topics.partitions, topics.replication_factor)
        finally:
            await admin.close()
        for name in names.all:
            state = "created" if name in made.created else "exists"
            out.print(f"{name}: {state} ({topics.partitions} partitions)")

    try:
        asyncio.run(main())
    except (TopicError, SecurityRefusal) as exc:
        raise fail(str(exc)) from None
    except KafkaError as exc:
        raise fail(f"broker at {settings.kafka.bootstrap_servers}: {exc!r}") from None


def broker_command(
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 9092,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    log: Annotated[Path | None, typer.Option(help="append the broker's own log here")] = None,
) -> None:
    """Run the embedded Kafka-compatible broker (Tansu) in the foreground; Ctrl-C stops it.

    For trying lavad without a Kafka cluster: topics live in memory and are
    gone when it stops.
    """
    try:
        broker = EmbeddedBroker.start(port=port, host=host, log=log)
    except BrokerError as exc:
        raise fail(str(exc)) from None

    async def serve() -> int | None:
        stop = asyncio.Event()
        install_stop_signals(stop)
        exited = asyncio.create_task(asyncio.to_thread(broker.process.wait))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if exited.done():
            return exited.result()
        broker.close()
        await exited
        return None

    with broker:
        out.print(
            f"broker listening on {broker.bootstrap_servers} (topics in memory, gone when it "
            "stops); Ctrl-C stops it"
        )
        # Whoever waits for that line (a script, a test) reads a pipe: flush.
        sys.stdout.flush()
        status = asyncio.run(serve())
    if status is not None:
        raise fail(f"the broker exited by itself with status {status}")
    err.print("broker stopped")


def tail_command(
    topic: Annotated[str, typer.Argument(help="topic to read, e.g. lavad.placements")],
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="stop after this many records")] = None,
    follow: Annotated[
        bool, typer.Option(help="keep waiting for new records (Ctrl-C stops)")
    ] = True,
    headers: Annotated[
        bool,
        typer.Option(
            "--headers",
            help="print each record as a JSON object of its headers, key and value (a dead"
            " letter's reason is in its headers)",
        ),
    ] = False,
) -> None:
    """Print a topic's records from the beginning, one value per line (decisions are JSON)."""
    settings = settings_or_exit(config)
    printed = 0

    async def main() -> None:
        nonlocal printed
        stop = asyncio.Event()
        install_stop_signals(stop)
        # No group: reading never moves anyone's committed offsets.
        consumer = AIOKafkaConsumer(
            enable_auto_commit=False, **client_options(settings.kafka, timeout=False)
        )
        try:
            await check_security(settings.kafka)
            await consumer.start()
            if topic not in await consumer.topics():
                raise TopicError(f"topic {topic!r} does not exist (lavad topics create)")
            parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            ends = await consumer.end_offsets(parts)
            sink = sys.stdout.buffer
            while not stop.is_set():
                batch = await consumer.getmany(*parts, timeout_ms=200)
                for records in batch.values():
                    for record in records:
                        if headers:
                            shown = record_json(record.key, record.value, record.headers)
                        else:
                            shown = record.value or b""
                        sink.write(shown + b"\n")
                        printed += 1
                        if limit is not None and printed >= limit:
                            return
                sink.flush()
                if not follow:
                    positions = [await consumer.position(tp) for tp in parts]
                    if all(pos >= ends[tp] for pos, tp in zip(positions, parts, strict=True)):
                        return
        finally:
            sys.stdout.buffer.flush()
            await consumer.stop()

    try:
        asyncio.run(main())
    except BrokenPipeError:
        pass  # piped into head: the reader has what it wanted
    except (TopicError, SecurityRefusal) as exc:
        raise fail(str(exc)) from None
    except KafkaError as exc:
        raise fail(f"broker at {settings.kafka.bootstrap_servers}: {exc!r}") from None
