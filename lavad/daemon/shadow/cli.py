"""``lavad shadow ...``: make an existing scheduler's stream from a trace, replay a shadow run."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import IO, Annotated, Any

import orjson
import typer
from rich.console import Console

from lavad.core.engine import EngineConfig
from lavad.core.placement.registry import REGISTRY, needs_true_lifetimes
from lavad.daemon.config_file import ConfigError
from lavad.daemon.console import (
    err,
    fail,
    out,
    plot_or_exit,
    replay_progress,
    settings_or_exit,
    shows_progress,
    writable_or_exit,
)
from lavad.daemon.plotting import PlotsUnavailable
from lavad.daemon.report import plot_results, print_results
from lavad.daemon.settings import Settings
from lavad.daemon.shadow.placed import PlacedCounts, placed_events
from lavad.daemon.shadow.replay import ShadowResult, shadow_replay
from lavad.streams.adapters import Trace, TraceFormatError, open_trace

shadow_app = typer.Typer(
    help="Shadow mode: lavad beside an existing scheduler.", no_args_is_help=True
)


@shadow_app.command("placements")
def placements_command(
    path: Annotated[Path, typer.Argument(help="trace file or directory")],
    output: Annotated[Path, typer.Argument(help="the scheduler's stream, canonical JSON lines")],
    policy: Annotated[str, typer.Option(help="the existing scheduler's policy")] = "firstfit",
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
) -> None:
    """Replay a trace with a baseline policy and write its placements as vm.placed events.

    Unplaced requests stay vm.request events, hosts opened on demand get a
    host.up, everything else passes through. Replay the result with
    `lavad shadow replay` (or `lavad replay` with [shadow] enabled).
    """
    settings = settings_or_exit(config)
    if policy not in REGISTRY or needs_true_lifetimes(policy):
        raise fail(
            f"unknown or oracle policy {policy!r}; known: {', '.join(sorted(REGISTRY.names))}"
        )
    trace, engine_config = _open_trace(settings, path, policy)
    # The existing scheduler places every pool by its one policy, whatever
    # [placement.pools] gives lavad's own pools.
    engine_config = dataclasses.replace(engine_config, pool_policies=())
    counts = PlacedCounts()
    writable_or_exit("OUTPUT", output)
    newline = orjson.OPT_APPEND_NEWLINE
    with output.open("wb", buffering=1 << 20) as handle:
        for event in placed_events(trace.events(), engine_config, counts):
            handle.write(orjson.dumps(event, option=newline))
    written = ", ".join(f"{n:,} {kind}" for kind, n in sorted(counts.written.items()))
    written = written or "no events"
    out.print(f"{output}: {written} ({counts.bad_records:,} bad records skipped)")
    if trace.end_time is not None:
        out.print(f"the trace ends at {trace.end_time!r}: pass --end-time {trace.end_time!r}")


@shadow_app.command("replay")
def replay_command(
    path: Annotated[Path, typer.Argument(help="the existing scheduler's stream (vm.placed)")],
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
    end_time: Annotated[
        float | None, typer.Option(help="where the recording ends (its censoring time)")
    ] = None,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="lavad's advice as JSON lines")
    ] = None,
    metrics_json: Annotated[
        Path, typer.Option(help="both sides' metrics, series and agreement as JSON")
    ] = Path("lavad-shadow.json"),
    plot: Annotated[Path | None, typer.Option(help="PNG of both sides over time")] = None,
    progress: Annotated[bool, typer.Option(help="progress bar on a terminal")] = True,
) -> None:
    """Shadow replay: the actual side follows vm.placed, lavad's side places the same requests."""
    settings = settings_or_exit(config)
    run_shadow_replay(settings, path, end_time, out_path, metrics_json, plot, progress)


def run_shadow_replay(
    settings: Settings,
    path: Path,
    end_time: float | None,
    out_path: Path | None,
    metrics_json: Path,
    plot: Path | None,
    progress: bool,
) -> ShadowResult:
    """The shadow replay behind both commands; prints the table and writes the files."""
    policy = settings.placement.policy
    for name in settings.placing_policies().values():
        if needs_true_lifetimes(name):
            raise fail(f"shadow mode cannot run the oracle policy {name!r}")
    writable_or_exit("--out", out_path)
    writable_or_exit("--metrics-json", metrics_json)
    plot_or_exit("--plot", plot)
    trace, engine_config = _open_trace(settings, path, policy)
    end = end_time if end_time is not None else trace.end_time
    with contextlib.ExitStack() as stack:
        decisions: IO[bytes] | None = None
        if out_path is not None:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            decisions = stack.enter_context(out_path.open("wb"))
        tick = stack.enter_context(replay_progress(f"shadow: {policy}", progress))
        started = time.perf_counter()
        result = shadow_replay(
            trace.events(), engine_config, end_time=end, decisions_out=decisions, progress=tick
        )
    print_shadow(result, trace.name, out)
    if not shows_progress(progress):
        err.print(
            f"shadow {policy}: {result.lavad.events:,} events in"
            f" {time.perf_counter() - started:.1f} s, {sum(result.lavad.decisions.values()):,}"
            " advice decisions"
        )
    metrics_json.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {"trace": str(path), "seed": settings.seed, **result.as_dict()}
    metrics_json.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    out.print(f"metrics written to {metrics_json}")
    if plot is not None:
        try:
            plot_results(result.sides, plot, f"shadow: {trace.name}")
        except PlotsUnavailable as exc:
            raise fail(str(exc)) from None
        out.print(f"plot written to {plot}")
    return result


def _open_trace(settings: Settings, path: Path, policy: str) -> tuple[Trace, EngineConfig]:
    """The trace and the engine configuration running ``policy`` on it (exit 2 if either fails)."""
    try:
        trace = open_trace(path, seed=settings.seed)
        return trace, settings.engine_config(policy, trace_has_hosts=trace.has_hosts)
    except (TraceFormatError, ConfigError) as exc:
        raise fail(str(exc)) from None


def print_shadow(result: ShadowResult, trace_name: str, console: Console) -> None:
    """Both sides in one table, then the agreement and the empty-hosts difference."""
    print_results(result.sides, f"shadow, {trace_name}", console)
    for pool, agreement in sorted(result.agreement.items()):
        same_host = agreement["same_host_rate"]
        same_class = agreement["same_class_rate"]
        console.print(
            f"pool {pool}: {agreement['compared']:,} VMs placed by both sides;"
            f" same host {_pct(same_host)}, same LAVA class {_pct(same_class)};"
            f" placed by the existing scheduler only {agreement['actual_only']:,},"
            f" by lavad only {agreement['lavad_only']:,}"
        )
    for pool, diff in sorted(result.difference.items()):
        ci = diff["ci95_pp"]
        interval = (
            f"95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}] pp ({diff['batches']} batches of"
            f" {diff['batch_size']} samples)"
            if ci is not None
            else "too few samples for an interval"
        )
        mean = diff["mean_pp"]
        console.print(
            f"pool {pool}: empty hosts, lavad minus actual, over {diff['samples']} samples:"
            f" {'n/a' if mean is None else f'{mean:+.2f} pp'}, {interval}"
        )


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100.0 * rate:.1f}%"
