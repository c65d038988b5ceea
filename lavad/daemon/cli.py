"""The ``lavad`` command line: replay, trace tools, policies, configuration check.

The live commands (run, produce, demo) live in ``daemon/live/cli.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import IO, Annotated, Any, Final

import orjson
import typer
from pydantic import BaseModel, TypeAdapter, ValidationError

from lavad.core.admission.registry import ADMISSION_POLICIES
from lavad.core.limits.service import RECOMMENDER_REGISTRY
from lavad.core.metrics.pool import MetricsConfig
from lavad.core.migrations.lifetimes import LIFETIME_SOURCES
from lavad.core.migrations.orders import ORDERS
from lavad.core.placement.registry import REGISTRY, needs_true_lifetimes
from lavad.core.registry import Registry
from lavad.daemon import heap
from lavad.daemon.config_file import ConfigError
from lavad.daemon.console import (
    err,
    fail,
    out,
    plot_or_exit,
    replay_progress,
    seed_option,
    settings_or_exit,
    shows_progress,
    writable_or_exit,
)
from lavad.daemon.live.cli import (
    broker_command,
    demo_command,
    produce_command,
    run_command,
    tail_command,
    topics_create_command,
)
from lavad.daemon.oracle_share import oracle_shares
from lavad.daemon.plotting import PlotsUnavailable
from lavad.daemon.replay import ReplayResult, on_common_pool, replay
from lavad.daemon.report import plot_results, print_results
from lavad.daemon.shadow.cli import run_shadow_replay, shadow_app
from lavad.streams.adapters import TraceFormatError, open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.oracle import exit_times, with_true_lifetimes
from lavad.streams.schema import Event
from lavad.streams.trace_tools import convert, trace_info

# The offline studies (lavad.evaluation) load for every command but the live
# ones: `lavad run` and its kin keep an import graph of what runs live.
LIVE_COMMANDS: Final = frozenset(
    {"run", "produce", "demo", "broker", "tail", "topics", "federation"}
)


def federation_command(ctx: typer.Context) -> None:
    """The live federation's processes: `lavad federation --help`."""
    # The import graph is federation -> daemon; this import inside the command is the
    # accepted exception, so that no other command (lavad run) loads the federation.
    from lavad.federation.cli import federation_app  # noqa: PLC0415

    federation_app(args=ctx.args, prog_name="lavad federation")


@cache
def _metrics_adapter() -> TypeAdapter[MetricsConfig]:
    """The ``[metrics]`` table's validator, built on first use: most commands need none."""
    return TypeAdapter(MetricsConfig)


def _with_warmup(metrics: MetricsConfig, warmup_s: float) -> MetricsConfig:
    """``metrics`` with ``--warmup-s``, checked as the configuration's key is (a finite
    number of seconds, at least 0), or the command stops naming the option."""
    try:
        return _metrics_adapter().validate_python(
            {**dataclasses.asdict(metrics), "warmup_s": warmup_s}
        )
    except ValidationError as exc:
        reasons = "; ".join(error["msg"] for error in exc.errors())
        raise fail(f"--warmup-s {warmup_s:g}: {reasons}") from None


def replay_command(
    path: Annotated[Path, typer.Argument(help="trace file or directory (see `lavad trace info`)")],
    policy: Annotated[
        str | None, typer.Option(help="placement policy (default: the configuration's)")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None,
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help="write decisions as JSON lines (per policy with --compare)"),
    ] = None,
    compare: Annotated[
        str | None, typer.Option(help="comma-separated policies to run on the same trace")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="PNG of empty hosts and utilisation")] = None,
    metrics_json: Annotated[
        Path, typer.Option(help="where to write the metrics summary as JSON")
    ] = Path("lavad-metrics.json"),
    seed: Annotated[
        int | None,
        seed_option("override the configuration's seed"),
    ] = None,
    warmup_s: Annotated[
        float | None,
        typer.Option(
            "--warmup-s",
            # Escaped: the help is rich markup, which would drop "[metrics]".
            help="override \\[metrics] warmup_s: event time after the first event left out "
            "of the averages (the bundled slice's arrivals span 16.7 h: 21600 measures it)",
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="progress bar on a terminal")] = True,
) -> None:
    """Replay a recorded trace through the decision core and print the metrics."""
    settings = settings_or_exit(config)
    # The state a replay builds is long-lived, as the daemon's is: the same collector schedule.
    heap.tune_collector()
    if seed is not None:
        settings = settings.model_copy(update={"seed": seed})
    if warmup_s is not None:
        settings = settings.model_copy(update={"metrics": _with_warmup(settings.metrics, warmup_s)})
    if settings.shadow.enabled:
        # The trace is an existing scheduler's stream: both sides, one table.
        if compare:
            raise fail("shadow.enabled: --compare does not apply (the sides are compared)")
        if policy is not None:
            settings = settings.model_copy(
                update={"placement": settings.placement.model_copy(update={"policy": policy})}
            )
        run_shadow_replay(settings, path, None, out_path, metrics_json, plot, progress)
        return
    names = [p.strip() for p in compare.split(",") if p.strip()] if compare else []
    if names and policy is not None:
        # One would be dropped without a word: --compare lists every policy replayed.
        raise fail(f"--policy {policy} and --compare {compare}: give one (--compare lists all)")
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        # A second run would only overwrite the first's decisions and dead letters.
        raise fail(f"--compare names {', '.join(map(repr, twice))} more than once")
    if not names:
        names = [policy or settings.placement.policy]
    for name in names:
        if name not in REGISTRY:
            raise fail(f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY.names))}")
        try:
            settings.policy_args(name)
        except ConfigError as exc:
            raise fail(str(exc)) from None
        if settings.migrations.relief.enabled and name != "gpa":
            # Relief reads the GPA hooks' scored windows: refused before the
            # trace is read, with the key, not at the first pool it opens.
            raise fail(
                f"migrations.relief.enabled: relief needs policy 'gpa', and {name!r} is replayed"
            )
    several = len(names) > 1
    writable_or_exit("--out", *(_per_policy(out_path, name, several) for name in names))
    writable_or_exit("--metrics-json", metrics_json)
    plot_or_exit("--plot", plot)
    try:
        trace = open_trace(path, seed=settings.seed)
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    results: list[ReplayResult] = []
    # The compared policies that read true lifetimes: the shares are of the first's gain.
    oracles: list[str] = []
    # The oracle policies' true lifetimes: one extra pass over the trace, shared.
    true_exits: dict[tuple[str, str], float] | None = None
    for name in names:
        engine_config = settings.engine_config(name, trace_has_hosts=trace.has_hosts)
        decisions_file = _per_policy(out_path, name, several)
        dead_file = _dead_letter_path(out_path, metrics_json, name)
        with contextlib.ExitStack() as stack:
            decisions_out: IO[bytes] | None = None
            if decisions_file is not None:
                decisions_file.parent.mkdir(parents=True, exist_ok=True)
                decisions_out = stack.enter_context(decisions_file.open("wb"))
            dead_out = stack.enter_context(_LazyFile(dead_file))
            tick = stack.enter_context(replay_progress(name, progress))
            fresh = open_trace(path, seed=settings.seed)
            events: Iterable[Event | BadRecord] = fresh.events()
            oracle = any(needs_true_lifetimes(policy) for policy in engine_config.policies())
            if oracle:
                oracles.append(name)
            if oracle or settings.migrations.lifetimes == "oracle":
                if true_exits is None:
                    true_exits = exit_times(open_trace(path, seed=settings.seed).events())
                end = fresh.end_time if fresh.end_time is not None else float("inf")
                events = with_true_lifetimes(events, true_exits, end)
            # As the live shell after a restore: the previous policy's state
            # collected, and what lives on (modules, compiled code, the
            # trace's tables) out of the collector's view, so the collections
            # during the replay scan only the state it builds.
            heap.settle()
            result = replay(
                events,
                engine_config,
                end_time=fresh.end_time,
                decisions_out=decisions_out,
                dead_letters_out=dead_out,
                progress=tick,
            )
        if not shows_progress(progress):
            # Piped (or --no-progress): one line per policy instead of a bar.
            err.print(_summary_line(result), highlight=False, soft_wrap=True)
        results.append(result)
    on_common_pool(results)
    shares = oracle_shares(results, oracles)
    print_results(results, trace.name, out, shares)
    document: dict[str, object] = {
        "trace": str(path),
        "seed": settings.seed,
        # The series (empty hosts, utilisation over time) feed `lavad report`.
        "runs": [{**r.as_dict(), "series": r.series} for r in results],
    }
    if shares is not None:
        document["oracle_shares"] = shares.as_dict()
    metrics_json.parent.mkdir(parents=True, exist_ok=True)
    metrics_json.write_bytes(
        orjson.dumps(
            document,
            option=orjson.OPT_INDENT_2,
        )
    )
    out.print(f"metrics written to {metrics_json}")
    if plot is not None:
        try:
            plot_results(results, plot, trace.name)
        except PlotsUnavailable as exc:
            raise fail(str(exc)) from None
        out.print(f"plot written to {plot}")


def _summary_line(result: ReplayResult) -> str:
    dead = sum(result.dead_letters.values())
    return (
        f"{result.policy}: {result.events:,} events in {result.wall_seconds:.1f} s"
        f" ({result.events_per_second:,.0f}/s), {sum(result.decisions.values()):,} decisions,"
        f" {dead:,} dead letters"
    )


class _LazyFile(contextlib.AbstractContextManager["_LazyFile"]):
    """A dead-letter file created on the first write, so clean runs leave none."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[bytes] | None = None

    def write(self, data: bytes) -> int:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("wb")
        return self._handle.write(data)

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.close()
            err.print(f"[yellow]dead letters written to {self.path}[/yellow]")


def _per_policy(path: Path | None, policy: str, several: bool) -> Path | None:
    if path is None or not several:
        return path
    return path.with_name(f"{path.stem}.{policy}{path.suffix}")


def _dead_letter_path(decisions: Path | None, metrics: Path, policy: str) -> Path:
    """``<stem>.<policy>.deadletters.jsonl`` beside ``--out`` (else the metrics file):
    named from the path the user gave, not from a per-policy decisions file, whose
    stem already carries the policy."""
    anchor = decisions if decisions is not None else metrics
    return anchor.with_name(f"{anchor.stem}.{policy}.deadletters.jsonl")


def trace_info_command(
    path: Annotated[Path, typer.Argument(help="trace file or directory")],
    seed: Annotated[int, seed_option("seed for sampled fields")] = 0,
) -> None:
    """Counts of events by type, VMs, censored VMs, hosts and the time span."""
    try:
        info = trace_info(path, seed=seed)
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    out.print_json(orjson.dumps(info).decode())


def trace_convert_command(
    path: Annotated[Path, typer.Argument(help="trace file or directory")],
    output: Annotated[Path, typer.Argument(help="canonical events, JSON lines")],
    seed: Annotated[int, seed_option("seed for sampled fields")] = 0,
) -> None:
    """Write a trace as canonical v1 events (one JSON object per line)."""
    writable_or_exit("OUTPUT", output)
    try:
        written = convert(path, output, seed=seed)
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    out.print(f"{written} written to {output}")


def policies_command() -> None:
    """List everything the configuration chooses by name, with its arguments."""
    registries: tuple[tuple[str, str, Registry[Any]], ...] = (
        ("placement policies", "placement.policy", REGISTRY),
        ("admission policies", "admission.policy", ADMISSION_POLICIES),
        ("limit recommenders", "limits.recommender", RECOMMENDER_REGISTRY),
        ("migration orders", "migrations.order", ORDERS),
        ("lifetime sources", "migrations.lifetimes", LIFETIME_SOURCES),
    )
    for number, (heading, key, registry) in enumerate(registries):
        gap = "\n" if number else ""
        out.print(f"{gap}[bold underline]{heading}[/bold underline] ({key})")
        for entry in registry:
            _print_entry(entry.name, entry.summary, entry.args)


def _print_entry(name: str, summary: str, args: type[BaseModel]) -> None:
    out.print(f"[bold]{name}[/bold]: {summary}")
    for field_name, info in args.model_fields.items():
        default = info.get_default(call_default_factory=True)
        out.print(f"    {field_name}: {info.description or ''} (default {default!r})")


def config_check_command(
    path: Annotated[Path, typer.Argument(help="TOML configuration file")],
    replay: Annotated[
        bool,
        typer.Option(
            "--replay",
            help="check for `lavad replay` (which also runs the oracles), not for `lavad run`",
        ),
    ] = False,
) -> None:
    """Validate a configuration file (and LAVAD_* environment overrides) as `lavad run` would.

    Prints the settings as read, secrets masked.
    """
    settings = settings_or_exit(path, live=not replay)
    out.print_json(settings.model_dump_json())


@cache
def build_app(*, offline: bool = True) -> typer.Typer:
    """The ``lavad`` command line.

    ``offline``: with the offline studies' commands (evaluate, report) when
    lavad.evaluation is installed; the daemon's image leaves it out
    (docker/Dockerfile), and there ``evaluate`` is absent.
    """
    app = typer.Typer(
        name="lavad",
        help="Online scheduler daemon for cloud data centers.",
        no_args_is_help=True,
        add_completion=False,
    )
    trace_app = typer.Typer(help="Inspect and convert recorded traces.", no_args_is_help=True)
    config_app = typer.Typer(help="Check configuration files.", no_args_is_help=True)
    app.add_typer(trace_app, name="trace")
    app.add_typer(config_app, name="config")
    topics_app = typer.Typer(help="Create lavad's Kafka topics.", no_args_is_help=True)
    app.add_typer(topics_app, name="topics")
    topics_app.command("create")(topics_create_command)

    app.command("run")(run_command)
    app.command("produce")(produce_command)
    app.command("demo")(demo_command)
    app.command("broker")(broker_command)
    app.command("tail")(tail_command)
    app.add_typer(shadow_app, name="shadow")
    if offline:
        _add_offline_commands(app)
    app.command(
        "federation",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(federation_command)
    app.command("replay")(replay_command)
    trace_app.command("info")(trace_info_command)
    trace_app.command("convert")(trace_convert_command)
    app.command("policies")(policies_command)
    config_app.command("check")(config_check_command)
    return app


def _add_offline_commands(app: typer.Typer) -> None:
    try:
        from lavad.evaluation.cli import evaluate_app  # noqa: PLC0415
        from lavad.evaluation.report_cli import report_command  # noqa: PLC0415
    except ModuleNotFoundError as missing:
        if not (missing.name or "").startswith("lavad.evaluation"):
            raise
    else:
        app.add_typer(evaluate_app, name="evaluate")
        app.command("report")(report_command)


def __getattr__(name: str) -> typer.Typer:
    # `app`, the whole command line, for tests and the reference pages; built on
    # first use, so that importing this module for main() builds nothing.
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: ``argv`` without the program name (default: sys.argv's)."""
    args = sys.argv[1:] if argv is None else list(argv)
    build_app(offline=not (args and args[0] in LIVE_COMMANDS))(args=argv)
