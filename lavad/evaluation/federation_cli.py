"""``lavad evaluate federation TRACE``: centralized, Megha and Sparrow on one trace, and
fair shares under contention. The protocol is ``lavad.evaluation.federation``'s."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.table import Table

from lavad.daemon.console import err, fail, out, plot_or_exit, seed_option, writable_or_exit
from lavad.daemon.plotting import PlotsUnavailable
from lavad.evaluation.federation import (
    CONFIG_HELP,
    Configuration,
    FairnessFigures,
    fairness_study,
    parse_configuration,
    plot_fairness,
    run_configuration,
)
from lavad.evaluation.options import options_command
from lavad.federation.simulator import SimulationBoundError
from lavad.federation.timing import TimingModel
from lavad.federation.trace import TraceError, read_jobs


def _trace_file(path: Path) -> Path:
    if path.is_dir():
        found = sorted(path.glob("*.tr"))
        if not found:
            raise fail(f"{path}: no .tr file in the folder")
        return found[0]
    if not path.is_file():
        raise fail(f"{path}: no such trace file")
    return path


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise fail(f"{option}: want integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise fail(f"{option}: want integers >= 1, got {text!r}")
    return values


def _ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:,.1f}"


@dataclass(frozen=True)
class FederationOptions:
    """The options of ``federation``, as typer reads them (``options_command``)."""

    path: Annotated[Path, typer.Argument(help="Megha trace (.tr) or a folder holding one")]
    workers: Annotated[str, typer.Option(help="worker counts, comma-separated")] = "1000,10000"
    configs: Annotated[
        str, typer.Option(help=f"configurations, comma-separated: {CONFIG_HELP}")
    ] = "centralized,megha-10x4,megha-10x10,sparrow"
    slots: Annotated[int, typer.Option(help="task slots per worker (Megha's sim: 1)", min=1)] = 1
    tenants: Annotated[int, typer.Option(help="tenant queues (jobs round-robin)", min=1)] = 10
    max_jobs: Annotated[int | None, typer.Option(help="read only the first N jobs", min=1)] = None
    network_delay_ms: Annotated[float, typer.Option(help="one message's delay", min=0)] = 0.5
    seed: Annotated[int, seed_option("Sparrow's probe draws")] = 0
    fairness: Annotated[bool, typer.Option(help="also run the fair-share study")] = True
    fair_workers: Annotated[int, typer.Option(help="the contended cluster's size", min=4)] = 200
    fair_jobs: Annotated[
        int, typer.Option(help="jobs of the trace replayed in the fair-share study", min=1)
    ] = 100
    plot: Annotated[Path | None, typer.Option(help="PNG: tenants' shares over time")] = None
    json_out: Annotated[Path | None, typer.Option("--json", help="write every figure as JSON")] = (
        None
    )


def run_federation(options: FederationOptions) -> None:
    """Allocation time p50/p99/p99.9 and utilisation per configuration; fair shares."""
    plot_or_exit("--plot", options.plot)
    writable_or_exit("--json", options.json_out)
    trace = _trace_file(options.path)
    try:
        chosen: list[Configuration] = [
            parse_configuration(c.strip()) for c in options.configs.split(",")
        ]
    except ValueError as exc:
        raise fail(f"--configs: {exc}") from None
    sizes = _ints(options.workers, "--workers")
    try:
        timing = TimingModel(network_delay_s=options.network_delay_ms / 1000.0)
        jobs = read_jobs(trace, max_jobs=options.max_jobs)
    except (TraceError, ValueError) as exc:
        raise fail(f"{trace}: {exc}") from None
    if not jobs:
        # Every figure is of allocation times: with no job there is none to give.
        raise fail(f"{trace}: holds no job (one per line: 'arrival n mean d_1..d_n')")
    tasks = sum(len(j.durations) for j in jobs)
    out.print(
        f"{trace}: {len(jobs):,} jobs, {tasks:,} tasks; network delay {options.network_delay_ms} ms"
    )
    rows: list[dict[str, Any]] = []
    for size in sizes:
        for config in chosen:
            try:
                result = run_configuration(
                    config,
                    jobs,
                    size,
                    slots=options.slots,
                    tenants=options.tenants,
                    timing=timing,
                    seed=options.seed,
                )
            except (ValueError, SimulationBoundError) as exc:
                err.print(f"[yellow]{config.name} at {size} workers: {exc}[/yellow]")
                continue
            figures = result.figures()
            rows.append({"configuration": config.name, "workers": size, **figures})
            out.print(
                f"  {config.name} at {size:,} workers: p50 {_ms(figures['p50_s'])} ms, "
                f"p99 {_ms(figures['p99_s'])} ms ({result.events:,} events)"
            )
    table = Table(title="Allocation time (ms) and utilisation")
    for column in (
        "configuration",
        "workers",
        "p50",
        "p99",
        "p99.9",
        "util.",
        "queue p50",
        "proc. p50",
        "comm. p50",
        "retry mean",
        "stale refusals",
        "repartitions",
    ):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in rows:
        table.add_row(
            row["configuration"],
            f"{row['workers']:,}",
            _ms(row["p50_s"]),
            _ms(row["p99_s"]),
            _ms(row["p99_9_s"]),
            f"{row['utilisation']:.1%}",
            _ms(row["queueing_median_s"]),
            _ms(row["processing_median_s"]),
            _ms(row["communication_median_s"]),
            _ms(row["retries_mean_s"]),
            f"{row['stale_refusals']:,}",
            f"{row['repartitions']:,}",
        )
    out.print(table)
    study: FairnessFigures | None = None
    if options.fairness:
        study = fairness_study(
            jobs[: options.fair_jobs], workers=options.fair_workers, timing=timing
        )
        _print_fairness(study)
        if options.plot is not None:
            try:
                plot_fairness(study, options.plot)
            except PlotsUnavailable as exc:
                raise fail(str(exc)) from None
            out.print(f"plot: {options.plot}")
    if options.json_out is not None:
        payload: dict[str, Any] = {
            "trace": str(trace),
            "jobs": len(jobs),
            "tasks": tasks,
            "slots_per_worker": options.slots,
            "tenants": options.tenants,
            "network_delay_ms": options.network_delay_ms,
            "runs": rows,
        }
        if study is not None:
            payload["fairness"] = {
                "workers": study.workers,
                "pools": study.pools,
                "shares": study.shares,
                "table": study.table,
                "contended_samples": study.contended_samples,
                "contended_samples_no_fairness": study.contended_samples_unfair,
                "figures": study.figures,
                "figures_no_fairness": study.figures_unfair,
                "times": study.times,
                "shares_over_time": study.rows,
                "shares_over_time_no_fairness": study.rows_unfair,
            }
        options.json_out.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
        out.print(f"json: {options.json_out}")


federation_command = options_command(FederationOptions, run_federation)


def _print_fairness(study: FairnessFigures) -> None:
    table = Table(
        title=f"Fair shares on {study.workers} workers ({study.pools} pools): mean share "
        "while the cluster is full (>= 95% held) and every tenant has tasks waiting "
        f"({study.contended_samples} of {len(study.rows)} samples; without fair shares "
        f"{study.contended_samples_unfair} of {len(study.rows_unfair)})"
    )
    for column in ("tenant", "scheduler", "configured", "with Algorithm 2", "without", "starts"):
        table.add_column(column, justify="right")
    for row in study.table:
        table.add_row(
            str(row["tenant"]),
            str(row["scheduler"]),
            f"{row['share']:.0%}",
            f"{row['mean_share_contended']:.1%}",
            f"{row['mean_share_contended_no_fairness']:.1%}",
            f"{row['starts']:,}",
        )
    out.print(table)
    f = study.figures
    out.print(
        f"preemptions {f['preemptions']:,} of {f['preemption_attempts']:,} attempts; "
        f"repartitions {f['repartitions']:,}; stale refusals {f['stale_refusals']:,}; "
        f"p50 {_ms(f['p50_s'])} ms, p99 {_ms(f['p99_s'])} ms "
        f"(without fair shares: p50 {_ms(study.figures_unfair['p50_s'])} ms, "
        f"p99 {_ms(study.figures_unfair['p99_s'])} ms)"
    )
