"""``lavad run``, ``lavad produce`` and ``lavad demo``: the live commands."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import typer
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from lavad.daemon.console import err, fail, out, settings_or_exit
from lavad.daemon.live.connection import client_options
from lavad.daemon.live.demo import DemoOptions, run_demo
from lavad.daemon.live.logs import configure_logging
from lavad.daemon.live.shell import LiveDaemon, StartupError, live_engine_config
from lavad.daemon.live.snapshots import SnapshotError
from lavad.daemon.placement.registry import needs_true_lifetimes
from lavad.streams.adapters import TraceFormatError, open_trace
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import TopicError, TopicNames


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def run_command(
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
) -> None:
    """Run the daemon: consume the input topics, publish decisions, serve /metrics."""
    settings = settings_or_exit(config)
    if needs_true_lifetimes(settings.placement.policy):
        # The daemon cannot know a VM's future: an oracle is for replays only.
        raise fail(
            f"placement.policy: {settings.placement.policy!r} is an oracle (it reads each VM's"
            " true lifetime, which only `lavad replay` knows); use it without '-oracle'"
        )
    if settings.migrations.lifetimes == "oracle":
        raise fail(
            "migrations.lifetimes: 'oracle' reads each VM's true lifetime, which only"
            " `lavad replay` knows; use 'policy'"
        )
    configure_logging(settings.log)
    engine_config = live_engine_config(settings)

    async def main() -> None:
        stop = asyncio.Event()
        install_stop_signals(stop)
        await LiveDaemon(settings, engine_config).run(stop)

    try:
        asyncio.run(main())
    except (SnapshotError, TopicError, StartupError) as exc:
        raise fail(str(exc)) from None


def produce_command(
    path: Annotated[Path, typer.Argument(help="trace file or directory (see `lavad trace info`)")],
    speed: Annotated[
        float, typer.Option(help="times real time; 0 publishes as fast as the broker takes it")
    ] = 0.0,
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
    seed: Annotated[int, typer.Option(help="seed for sampled trace fields")] = 0,
    limit: Annotated[int | None, typer.Option(help="publish at most this many records")] = None,
) -> None:
    """Publish a recorded trace to the input topics (keyed by pool)."""
    if speed < 0:
        raise fail("--speed must be >= 0")
    settings = settings_or_exit(config)
    try:
        trace = open_trace(path, seed=seed)
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    names = TopicNames(**settings.topics.model_dump())

    async def main() -> None:
        producer = AIOKafkaProducer(acks="all", linger_ms=5, **client_options(settings.kafka))
        await producer.start()
        try:
            result = await publish_trace(trace.events(), producer, names, speed=speed, limit=limit)
        finally:
            await producer.stop()
        out.print(
            f"published {result.records} records ({result.unreadable_rows} unreadable rows "
            f"passed through for dead-lettering) in {result.wall_seconds:.1f} s"
        )

    try:
        asyncio.run(main())
    except KafkaError as exc:
        raise fail(f"broker at {settings.kafka.bootstrap_servers}: {exc!r}") from None


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
    except (SnapshotError, TopicError, StartupError) as exc:
        raise fail(str(exc)) from None
    err.print("demo stopped")
