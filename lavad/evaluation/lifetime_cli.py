"""``lavad evaluate lifetime``: the lifetime model's F1 by uptime, calibration and latency.

The protocol is ``models/lifetime/evaluation.py``'s; this module reads the
trace, picks the split and prints the tables.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from lavad.daemon.console import fail, out, seed_option, writable_or_exit
from lavad.evaluation.lifetime import (
    FRACTIONS,
    PROTOCOLS,
    LifetimeEvaluation,
    ModelReport,
    OnlineModelSettings,
    evaluate_lifetime_model,
)
from lavad.evaluation.options import options_command
from lavad.models.lifetime.features import DECLARED_CATEGORICAL, ORACLE_FIELDS
from lavad.streams.adapters import TraceFormatError, open_trace
from lavad.streams.schema import VmRequest


def _categorical(spec: str) -> tuple[str, ...]:
    if spec.strip() == "declared":
        return DECLARED_CATEGORICAL
    names = tuple(name.strip() for name in spec.split(",") if name.strip())
    leaked = ORACLE_FIELDS.intersection(names)
    if leaked:
        raise typer.BadParameter(f"{sorted(leaked)} is an oracle field, not a feature")
    return names


@dataclass(frozen=True)
class LifetimeOptions:
    """The options of ``lifetime``, as typer reads them (``options_command``)."""

    path: Annotated[Path, typer.Argument(help="VM trace file or directory")]
    split: Annotated[
        float, typer.Option(help="fraction of the requests learned from before testing (0-1)")
    ] = 0.5
    thresholds_h: Annotated[
        str, typer.Option("--thresholds-h", help="comma-separated 'lives beyond X hours'")
    ] = "1,24"
    settle_days: Annotated[
        float, typer.Option(help="F1 counts VMs requested at least this long before the end")
    ] = 2.0
    min_observations: Annotated[
        int, typer.Option(help="observations a group needs before it is used")
    ] = 30
    categorical: Annotated[
        str,
        typer.Option(
            help="comma-separated class-valued features that key the groups ('declared': those "
            "the adapters declare; '': none)"
        ),
    ] = ""
    json_out: Annotated[Path | None, typer.Option("--json", help="write the results as JSON")] = (
        None
    )
    seed: Annotated[int, seed_option("seed for sampled trace fields")] = 0
    river: Annotated[
        bool, typer.Option(help="also evaluate the river classifier (learns from exits only)")
    ] = True
    models: Annotated[
        str,
        typer.Option(
            help="comma-separated online lifetime models: tables, shrunk, tables-calibrated, "
            "shrunk-calibrated, mixture, frailty, frailty-banded, mixture-frailty"
        ),
    ] = "tables,shrunk"
    prior_strength: Annotated[
        float, typer.Option(help="model 'shrunk': each level's prior, in VMs at risk")
    ] = 10.0
    half_life_h: Annotated[
        float | None,
        typer.Option("--half-life-h", help="observations count half after this (default: never)"),
    ] = None
    calibration_half_life_h: Annotated[
        float,
        typer.Option(
            "--calibration-half-life-h",
            help="models '*-calibrated': resolved predictions count half after this",
        ),
    ] = 168.0
    frailty_half_life_h: Annotated[
        float,
        typer.Option(
            "--frailty-half-life-h",
            help="models '*frailty': an owner's deaths and expected hazard count half after this",
        ),
    ] = 24.0
    protocol: Annotated[
        str,
        typer.Option(
            help="'split': the model is frozen at the split; 'online': it keeps learning in "
            "event time and predicts each test VM as it stands at its request (the daemon's way)"
        ),
    ] = "split"


def run_lifetime(options: LifetimeOptions) -> None:
    """F1 of "lives beyond X" at uptimes 0-90% of the lifetime, calibration, latency."""
    writable_or_exit("--json", options.json_out)
    if not 0.0 < options.split < 1.0:
        raise fail(f"--split must be in (0, 1), got {options.split}")
    chosen_protocol = next((known for known in PROTOCOLS if known == options.protocol), None)
    if chosen_protocol is None:
        raise fail(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {options.protocol!r}")
    try:
        thresholds = tuple(float(x) * 3600.0 for x in options.thresholds_h.split(","))
    except ValueError:
        raise fail(
            f"--thresholds-h must be numbers separated by commas, got {options.thresholds_h!r}"
        ) from None
    try:
        trace = open_trace(options.path, seed=options.seed)
        times = [item.time for item in trace.events() if isinstance(item, VmRequest)]
    except TraceFormatError as exc:
        raise fail(str(exc)) from None
    if len(times) < 2 or times[-1] <= times[0]:
        raise fail(f"{options.path}: needs VM requests spread over time")
    end = trace.end_time if trace.end_time is not None else times[-1]
    # By count, not by time: a sampled trace (OpenB) requests most of its
    # VMs in a short part of its span.
    split_time = times[int(options.split * (len(times) - 1))]
    try:
        result = evaluate_lifetime_model(
            open_trace(options.path, seed=options.seed).events(),
            split_time=split_time,
            end_time=end,
            thresholds_s=thresholds,
            # At most half the test period, so that short recordings keep a test set.
            settle_s=min(options.settle_days * 86_400.0, (end - split_time) / 2.0),
            river_seed=options.seed if options.river else None,
            categorical=_categorical(options.categorical),
            models=tuple(name.strip() for name in options.models.split(",") if name.strip()),
            protocol=chosen_protocol,
            settings=OnlineModelSettings(
                min_observations=options.min_observations,
                prior_strength=options.prior_strength,
                half_life_s=None if options.half_life_h is None else options.half_life_h * 3600.0,
                calibration_half_life_s=options.calibration_half_life_h * 3600.0,
                frailty_half_life_s=options.frailty_half_life_h * 3600.0,
            ),
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    print_evaluation(trace.name, result)
    if options.json_out is not None:
        options.json_out.write_bytes(
            orjson.dumps(asdict(result), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        )
        out.print(f"results written to {options.json_out}")


lifetime_command = options_command(LifetimeOptions, run_lifetime)


def print_evaluation(name: str, result: LifetimeEvaluation) -> None:
    if result.protocol == "online":
        learned = (
            f"learned online throughout, each VM requested after {result.split_time:,.0f} s "
            f"predicted by the model as it stood then ({result.train_exits:,} exits, "
            f"{result.train_censored:,} VMs running at the end, {result.groups:,} groups)"
        )
    else:
        learned = (
            f"learned online until {result.split_time:,.0f} s, then frozen "
            f"({result.train_exits:,} exits, {result.train_censored:,} running VMs censored, "
            f"{result.groups:,} groups)"
        )
    out.print(
        f"[bold]{name}[/bold]: {learned}; F1 on {result.test_vms:,} VMs requested after "
        f"the split, at least {result.settle_s / 86_400:.2g} days before the end, and exited"
    )
    for model in result.models:
        _print_model(model)


def _print_model(model: ModelReport) -> None:
    f1 = Table(
        title=f'{model.name}: F1 of "lives beyond X" by uptime (fraction of the true lifetime)'
    )
    f1.add_column("uptime")
    for report in model.thresholds:
        hours = report.threshold_s / 3600.0
        f1.add_column(f"X={hours:g}h all", justify="right")
        f1.add_column(f"X={hours:g}h undecided (n)", justify="right")
    for fraction in FRACTIONS:
        cells = [f"{fraction:.0%}"]
        for report in model.thresholds:
            cells.append(f"{report.f1[fraction]:.3f}")
            cells.append(f"{report.f1_undecided[fraction]:.3f} ({report.undecided[fraction]:,})")
        f1.add_row(*cells)
    out.print(f1)
    for report in model.thresholds:
        table = Table(
            title=(
                f"{model.name}: calibration of P(T > {report.threshold_s / 3600:g} h) at "
                f"creation, {report.calibration_vms:,} VMs, "
                f"ECE {report.expected_calibration_error:.3f}"
            )
        )
        for column in ("predicted", "VMs", "mean predicted", "observed"):
            table.add_column(column, justify="right")
        for row in report.calibration:
            table.add_row(
                f"{row.predicted_low:.1f}-{row.predicted_high:.1f}",
                f"{row.count:,}",
                f"{row.mean_predicted:.3f}",
                f"{row.observed:.3f}",
            )
        out.print(table)
    out.print(
        f"{model.name}: log score at creation {model.log_score:.3f} (lower is better); "
        f"prediction at creation median {model.predict_us_median:.1f} us, "
        f"p99 {model.predict_us_p99:.1f} us per call; reprediction E[T_r|T_u] "
        f"{model.repredict_us_per_vm:.3f} us per VM in batches of 1,000"
    )
