"""``lavad evaluate placement DATA``: the placement policies on a matrix of conditions.

The protocol is ``lavad.evaluation.placement_matrix``'s; this module checks
the options, the configuration and the traces before any replay, runs the
cells, and prints the tables (Markdown, as the results pages quote them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import orjson
import typer

from lavad.daemon.config_file import ConfigError
from lavad.daemon.console import (
    err,
    fail,
    out,
    seed_option,
    settings_or_exit,
    writable_or_exit,
)
from lavad.evaluation import hindsight
from lavad.evaluation.options import options_command
from lavad.evaluation.placement_matrix import (
    DEFAULT_POLICIES,
    FLEETS,
    PAPER_ORACLE,
    WINDOWS,
    EmptyWindow,
    MatrixRun,
    Sources,
    check_sources,
    check_variant,
    run_matrix,
    shape_error,
    summarise,
    windows_present,
)
from lavad.streams.adapters.base import TraceFormatError
from lavad.streams.seeds import MAX_SEED


def _chosen(option: str, values: list[str] | None, known: tuple[str, ...]) -> tuple[str, ...]:
    """``values`` (default: every known one), or exit naming the option and the unknown."""
    if not values:
        return known
    unknown = [value for value in values if value not in known]
    if unknown:
        raise fail(f"{option} {unknown[0]!r}: want one of {', '.join(known)}")
    return tuple(values)


@dataclass(frozen=True)
class PlacementOptions:
    """The options of ``placement``, as typer reads them (``options_command``)."""

    data: Annotated[
        Path,
        typer.Argument(
            help="folder of traces laid out as ../shared/data: azure-v1-vms, alibaba-openb, "
            "alibaba-dlrm (each window reads its own)"
        ),
    ]
    window: Annotated[
        list[str] | None,
        typer.Option(
            help=f"window, repeatable: {', '.join(WINDOWS)} (default: all whose folder DATA holds)"
        ),
    ] = None
    shape: Annotated[
        list[str] | None,
        typer.Option(help="Azure host shape cores/memory, repeatable (default 4 shapes)"),
    ] = None
    fleet: Annotated[
        list[str] | None,
        typer.Option(help=f"fleet, repeatable: {', '.join(FLEETS)} (default all)"),
    ] = None
    seeds: Annotated[int, typer.Option(help="seeds per condition", min=1)] = 3
    first_seed: Annotated[int, seed_option("seeds first-seed .. first-seed + seeds - 1")] = 0
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="policy variant name[:key=value;...], repeatable; the first is the baseline "
            f"(default {', '.join(DEFAULT_POLICIES)})"
        ),
    ] = None
    oracle: Annotated[str, typer.Option(help="the variant whose gain the shares are of")] = (
        PAPER_ORACLE
    )
    jobs: Annotated[int, typer.Option(help="worker processes", min=1)] = 2
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write every cell's figures as JSON")
    ] = None
    keep_vms: Annotated[
        float,
        typer.Option(help="replay a seeded share of the VMs (0 < share <= 1)", min=0, max=1),
    ] = 1.0
    warmup_s: Annotated[
        float | None,
        typer.Option(
            help="override \\[metrics] warmup_s: event time after a window's first event left "
            "out of its figures, for windows shorter than the configuration's",
            min=0,
        ),
    ] = None
    azure_split: Annotated[
        str | None,
        typer.Option(
            help="the Azure V1 split whose halves are the Azure windows, v1.<split>.txt "
            "(default: the folder's only split)"
        ),
    ] = None
    config: Annotated[Path | None, typer.Option(help="TOML configuration file")] = None


def run_placement(options: PlacementOptions) -> None:
    """Empty hosts, share of the oracle's gain and stranding per policy, window, shape, fleet."""
    writable_or_exit("--json", options.json_out)
    if options.keep_vms <= 0:
        raise fail(f"--keep-vms must be above 0, got {options.keep_vms}")
    if options.first_seed + options.seeds - 1 > MAX_SEED:
        # Each cell's seed goes into its replay as the configuration's would.
        raise fail(f"--first-seed + --seeds - 1 must be at most {MAX_SEED}")
    windows = _chosen("--window", options.window, tuple(WINDOWS))
    fleets = _chosen("--fleet", options.fleet, FLEETS)
    for shape in options.shape or ():
        reason = shape_error(shape)
        if reason is not None:
            raise fail(f"--shape: {reason}")
    settings = settings_or_exit(options.config)
    policies = tuple(options.policy or DEFAULT_POLICIES)
    try:
        hindsight.check_order(list(policies))
    except ValueError as exc:
        raise fail(str(exc)) from None
    for spec in (*policies, options.oracle):
        try:
            check_variant(settings, spec)
        except (ConfigError, ValueError) as exc:
            raise fail(f"{spec!r}: {exc}") from None
    if not options.data.is_dir():
        raise fail(f"{options.data}: no such folder of traces")
    sources = Sources(options.data, options.azure_split)
    if not options.window:
        # Held-back data may hold one kind of trace: the default measures what
        # the folder has, and says what it leaves out; a window asked for by
        # name is required (check_sources).
        windows, absent = windows_present(sources, windows)
        for window in absent:
            err.print(
                f"window {window} skipped: {sources.folder(window)} not found "
                f"(--window {window} requires it)",
                highlight=False,
                soft_wrap=True,
            )
        if not windows:
            raise fail(
                f"{options.data}: no window's traces here: want azure-v1-vms, "
                "alibaba-openb or alibaba-dlrm"
            )
    try:
        check_sources(sources, windows)
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    run = MatrixRun(settings, sources, policies, fleets, options.keep_vms, options.warmup_s)
    err.print(f"replaying {len(windows)} windows", highlight=False)
    try:
        cells = run_matrix(
            run, windows, options.shape, options.seeds, options.first_seed, options.jobs
        )
    except EmptyWindow as exc:
        raise fail(str(exc)) from None
    table, _ = summarise(cells, options.oracle)
    out.print(table, markup=False, highlight=False, soft_wrap=True)
    if options.json_out is not None:
        options.json_out.write_bytes(orjson.dumps(cells, option=orjson.OPT_INDENT_2))


placement_command = options_command(PlacementOptions, run_placement)
