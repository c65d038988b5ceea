"""`lavad federation ...`: the live federation's processes from the command line.

    lavad federation check federation.toml
    lavad federation topics federation.toml
    lavad federation owner --instance a --config federation.toml
    lavad federation scheduler --gm 0 --config federation.toml

The file is checked whole before anything connects (settings.py); a bad key exits 2
with the key and the reason. The environment is not read: the file is the whole
configuration. SIGTERM or SIGINT stops a process cleanly (an owner
snapshots its pools first); kill -9 is what the failover is built for.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Protocol

import typer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from prometheus_client import start_http_server

from lavad.daemon.config_file import ConfigError
from lavad.daemon.console import err, out, print_error
from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.live.connection import SecurityRefusal, check_security, client_options
from lavad.federation.fairness import Shares
from lavad.federation.live_owner import Owner
from lavad.federation.live_scheduler import Scheduler
from lavad.federation.settings import (
    UNUSED_KAFKA_KEYS,
    FederationSettings,
    load_federation_settings,
)
from lavad.federation.topics import create_federation_topics, federation_topics
from lavad.federation.topology import Topology, uniform_topology
from lavad.streams.kafka.topics import TopicError

federation_app = typer.Typer(
    help="The live federation's processes: pool owners and global schedulers.",
    no_args_is_help=True,
    add_completion=False,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(help="the federation's TOML file (tables kafka, federation); none: defaults"),
]


def _settings_or_exit(config: Path | None) -> FederationSettings:
    try:
        return load_federation_settings(config)
    except ConfigError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None


def _topology(settings: FederationSettings) -> Topology:
    fed = settings.federation
    return uniform_topology(fed.pools, fed.hosts_per_pool, fed.schedulers)


class _Process(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


def _until_signal(make: Callable[[], _Process], kafka: KafkaSettings) -> None:
    """Run the process ``make`` builds (inside the event loop: aiokafka's clients need
    one) until SIGTERM or SIGINT.

    A TLS or SASL refusal stops it at once with exit status 2, naming the cause
    (``check_security``), as ``lavad run`` does: retrying cannot help, and the
    process's clients would otherwise retry it as if the broker were down.
    """

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await check_security(kafka)
        await make().run(stop)

    try:
        asyncio.run(serve())
    except SecurityRefusal as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None


@federation_app.command("check")
def check_command(
    config: Annotated[Path, typer.Argument(help="the federation's TOML file")],
) -> None:
    """Validate a federation file as the processes would; print the settings (secrets masked)."""
    unused = set(UNUSED_KAFKA_KEYS)
    out.print_json(_settings_or_exit(config).model_dump_json(exclude={"kafka": unused}))


@federation_app.command("topics")
def topics_command(
    config: Annotated[Path, typer.Argument(help="the federation's TOML file")],
    replication_factor: Annotated[
        int, typer.Option(min=1, help="replicas of each topic on the cluster")
    ] = 1,
) -> None:
    """Create the federation's topics (partitions from federation.pools and .tenants).

    Topics that exist with the right partition counts are left as they are, so
    running it again is harmless; one with another count is an error (exit 1).
    """
    settings = _settings_or_exit(config)
    fed = settings.federation
    topics = federation_topics(fed.pools, fed.tenants)

    async def main() -> tuple[str, ...]:
        await check_security(settings.kafka)
        admin = AIOKafkaAdminClient(**client_options(settings.kafka))
        try:
            await admin.start()
            return await create_federation_topics(admin, topics, replication_factor)
        finally:
            await admin.close()

    try:
        created = asyncio.run(main())
    except TopicError as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None
    except SecurityRefusal as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None
    except KafkaError as exc:
        print_error(f"broker at {settings.kafka.bootstrap_servers}: {exc!r}")
        raise typer.Exit(1) from None
    for topic in topics:
        state = "created" if topic.name in created else "exists"
        out.print(f"{topic.name}: {state} ({topic.partitions} partitions)")


@federation_app.command("owner")
def owner_command(
    instance: Annotated[str, typer.Option(help="this instance's name, in its verdicts and logs")],
    config: ConfigOption = None,
) -> None:
    """A pool owner: validates launches for the pools the owners' group gives it."""
    settings = _settings_or_exit(config)
    if not instance.strip():
        err.print("[red]lavad: --instance: an owner needs a name[/red]")
        raise typer.Exit(2)
    fed = settings.federation
    topology = _topology(settings)
    _until_signal(
        lambda: Owner(
            settings.kafka,
            instance,
            topology,
            fed.tenants,
            fed.owner.snapshot_every,
            fed.owner.snapshot_chunk_bytes,
        ),
        settings.kafka,
    )


@federation_app.command("scheduler")
def scheduler_command(
    gm: Annotated[int, typer.Option("--gm", help="this global scheduler's index")],
    config: ConfigOption = None,
) -> None:
    """A global scheduler: decides the tenant queues the schedulers' group gives it."""
    settings = _settings_or_exit(config)
    fed = settings.federation
    if not 0 <= gm < fed.schedulers:
        err.print(
            f"[red]lavad: --gm: {gm} is not a scheduler index "
            f"(federation.schedulers = {fed.schedulers}: 0 to {fed.schedulers - 1})[/red]"
        )
        raise typer.Exit(2)
    topology = _topology(settings)

    def make() -> Scheduler:
        shares = None if fed.shares is None else Shares(fed.shares)
        scheduler = Scheduler(
            settings.kafka, gm, topology, fed.tenants, fed.scheduler.state_lag_s, shares
        )
        if fed.scheduler.metrics_port:
            start_http_server(
                fed.scheduler.metrics_port, addr="127.0.0.1", registry=scheduler.registry
            )
        return scheduler

    _until_signal(make, settings.kafka)
