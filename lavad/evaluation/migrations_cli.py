"""``lavad evaluate migrations TRACE``: LARS against the baseline orders.

The protocol is ``lavad.evaluation.migrations``'s; this module reads
the trace and the settings, and prints the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from lavad.core.migrations.config import RollingConfig
from lavad.core.placement.registry import REGISTRY, needs_true_lifetimes
from lavad.daemon.config_file import ConfigError
from lavad.daemon.console import err, fail, out, settings_or_exit, writable_or_exit
from lavad.evaluation.migrations import (
    BASELINES,
    DrainSettings,
    MigrationEvaluation,
    evaluate_migrations,
)
from lavad.streams.adapters import TraceFormatError, open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.oracle import exit_times, with_true_lifetimes
from lavad.streams.schema import Event, HostDown, HostDrain, HostUp


def migrations_command(
    path: Annotated[Path, typer.Argument(help="VM trace file or directory")],
    policy: Annotated[
        str, typer.Option(help="placement policy that picks the targets (and the lifetimes)")
    ] = "las",
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
    hosts: Annotated[
        int | None,
        typer.Option(help="pool size for a trace without hosts (default: Best Fit's peak)"),
    ] = None,
    headroom: Annotated[
        float, typer.Option(help="hosts above Best Fit's peak when sizing the pool", min=0)
    ] = 0.05,
    empty_below: Annotated[
        float | None,
        typer.Option(help="defragment below this empty-host share (default: --quantile)"),
    ] = None,
    quantile: Annotated[
        float,
        typer.Option(help="threshold = this quantile of the undrained empty-host share", min=0),
    ] = 0.2,
    max_draining_hosts: Annotated[
        int, typer.Option(help="defragmentation drains in progress at most", min=1)
    ] = 2,
    rolling_batch: Annotated[
        int,
        typer.Option(help="rolling maintenance instead of defragmentation: hosts per batch"),
    ] = 0,
    rolling_every_h: Annotated[
        float, typer.Option(help="hours between rolling maintenance batches", min=0.01)
    ] = 6.0,
    closed_loop: Annotated[
        bool, typer.Option(help="also replay LARS and LARS-oracle acting, each with a trigger")
    ] = True,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the results as JSON")
    ] = None,
) -> None:
    """Migrations per order on the same drains: arrival, random, shortest, LARS, LARS-oracle."""
    writable_or_exit("--json", json_out)
    settings = settings_or_exit(config)
    if policy not in REGISTRY or needs_true_lifetimes(policy):
        known = ", ".join(sorted(n for n in REGISTRY.names if not needs_true_lifetimes(n)))
        raise fail(f"--policy: want a non-oracle policy ({known}), got {policy!r}")
    if not 0.0 < quantile < 1.0:
        raise fail(f"--quantile must be in (0, 1), got {quantile}")
    if empty_below is not None and not 0.0 < empty_below < 1.0:
        raise fail(f"--empty-below must be in (0, 1), got {empty_below}")
    try:
        trace = open_trace(path, seed=settings.seed)
        # hosts.source = "shape" replaces a trace's own hosts with a pool of
        # the configured shape (OpenB's 1,523 nodes are 99% empty otherwise).
        own_hosts = trace.has_hosts and settings.hosts.source != "shape"
        base = settings.engine_config(policy, trace_has_hosts=own_hosts)
        exits = exit_times(open_trace(path, seed=settings.seed).events())
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    except ConfigError as exc:
        raise fail(str(exc)) from None
    end = trace.end_time if trace.end_time is not None else float("inf")

    def events() -> Iterable[Event | BadRecord]:
        # Every run gets the true lifetimes; only the oracle order reads them.
        items = open_trace(path, seed=settings.seed).events()
        if trace.has_hosts and not own_hosts:
            items = (e for e in items if not isinstance(e, HostUp | HostDown | HostDrain))
        return with_true_lifetimes(items, exits, end)

    rolling = None
    if rolling_batch:
        first = next(
            (
                e.time
                for e in open_trace(path, seed=settings.seed).events()
                if not isinstance(e, BadRecord)
            ),
            0.0,
        )
        # After a day, when the lifetime model has seen exits.
        rolling = RollingConfig(rolling_batch, rolling_every_h * 3600.0, first + 86_400.0)
    try:
        evaluation = evaluate_migrations(
            events,
            base,
            trace=trace.name,
            end_time=trace.end_time,
            trace_has_hosts=own_hosts,
            hosts=hosts,
            headroom=headroom,
            drain=DrainSettings(
                empty_below=empty_below, quantile=quantile, max_draining_hosts=max_draining_hosts
            ),
            closed_loop=closed_loop,
            rolling=rolling,
            progress=lambda label: err.print(f"[dim]replaying: {label}[/dim]"),
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    print_evaluation(evaluation)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_bytes(orjson.dumps(asdict(evaluation), option=orjson.OPT_INDENT_2))
        out.print(f"results written to {json_out}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:+.2f}%"


def print_evaluation(evaluation: MigrationEvaluation) -> None:
    base = evaluation.baseline_empty_hosts_pct
    undrained = "-" if base is None else f"{base:.2f}%"
    out.print(
        f"[bold]{evaluation.trace}[/bold], pool {evaluation.pool} of {evaluation.hosts} hosts,"
        f" targets by {evaluation.policy}; {evaluation.scenario}. Without drains:"
        f" {undrained} empty hosts, {evaluation.baseline_refused:,} requests refused."
    )
    same = Table(title=f"Same {evaluation.drains:,} drains, only the order changes (paper 5.1)")
    for column in (
        "order",
        "scheduled",
        "migrated",
        "exited first",
        "queued at end",
        "needed",
    ):
        same.add_column(column, justify="right")
    for baseline in BASELINES:
        same.add_column(f"fewer than {baseline.removesuffix('-policy')}", justify="right")
    for run in evaluation.same_drains:
        same.add_row(
            run.label,
            f"{run.scheduled:,}",
            f"{run.migrations:,}",
            f"{run.exited_before_migration:,}",
            f"{run.still_queued:,}",
            f"{run.needed:,}",
            *(
                "" if b == run.label else _pct(evaluation.reduction(run.label, b))
                for b in BASELINES
            ),
        )
    out.print(same)
    out.print(
        "needed = migrated + still queued at the end (still running: counted as migrated);"
        " the reductions compare it"
    )
    loop = Table(title="Closed loop: each order acting, with its own trigger")
    for column in (
        "acting order",
        "drains",
        "scheduled",
        "migrated",
        "exited first",
        "queued at end",
        "needed per scheduled VM",
        "per drained host",
        "hosts emptied",
        "empty hosts (pp vs no drains)",
        "refused",
        "wall s",
    ):
        loop.add_column(column, justify="right")
    for loop_run in evaluation.closed_loop:
        gained = (
            "-"
            if loop_run.empty_hosts_pct is None or base is None
            else f"{loop_run.empty_hosts_pct:.2f}% ({loop_run.empty_hosts_pct - base:+.2f})"
        )
        loop.add_row(
            loop_run.label,
            f"{loop_run.drains:,}",
            f"{loop_run.scheduled:,}",
            f"{loop_run.migrations:,}",
            f"{loop_run.exited_before_migration:,}",
            f"{loop_run.still_queued:,}",
            "-"
            if loop_run.needed_per_scheduled is None
            else f"{loop_run.needed_per_scheduled:.3f}",
            "-"
            if loop_run.migrations_per_drained_host is None
            else f"{loop_run.migrations_per_drained_host:.2f}",
            f"{loop_run.hosts_ready:,}",
            gained,
            f"{loop_run.refused:,}",
            f"{loop_run.wall_s:.1f}",
        )
    out.print(loop)
