"""``lavad evaluate gpa PATH``: GPA and the paper's baselines, resampled and time-aligned.

Wire into ``daemon/cli.py`` as the other evaluations are:
``evaluate_app.command("gpa")(gpa_command)`` (``app`` holds the same command).
The protocols are ``lavad.evaluation.gpa_sweep``'s (the paper's
section 5) and ``lavad.evaluation.gpa_aligned``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from lavad.daemon.console import fail, folder_or_exit, out, seed_option
from lavad.evaluation.gpa_evaluation import GpaEvaluationSettings, run_gpa_evaluation
from lavad.evaluation.options import options_command
from lavad.streams.adapters import TraceFormatError

app = typer.Typer(help="GPA stochastic bin packing against the paper's baselines.")


def _floats(name: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise fail(f"--{name}: want comma-separated numbers, got {text!r}") from None


@dataclass(frozen=True)
class GpaOptions:
    """The options of ``gpa``, as typer reads them (``options_command``)."""

    paths: Annotated[list[Path], typer.Argument(help="usage trace folders (one or more)")]
    tasks: Annotated[int, typer.Option(help="tasks per resampled instance", min=1)] = 200
    aligned_tasks: Annotated[
        int, typer.Option(help="tasks per time-aligned instance (at most the trace's VMs)", min=1)
    ] = 200
    instances: Annotated[int, typer.Option(help="instances per evaluation", min=1)] = 5
    realisations: Annotated[int, typer.Option(help="realisations per task", min=3)] = 2000
    capacities: Annotated[str, typer.Option(help="machine capacities")] = "0.5,1,2,5"
    rhos: Annotated[str, typer.Option(help="GPA SLOs rho")] = "0.1,0.05,0.01,0.001"
    history_steps: Annotated[
        int | None, typer.Option(help="aligned history length in 300 s steps (default per trace)")
    ] = None
    future_steps: Annotated[
        int | None, typer.Option(help="aligned future length in 300 s steps (default per trace)")
    ] = None
    min_window_vms: Annotated[
        int, typer.Option(help="aligned windows need this many usable VMs", min=1)
    ] = 20
    seed: Annotated[int, seed_option("seed of the instances")] = 0
    part: Annotated[
        str, typer.Option(help="whole trace, or its first or second half (time-aligned only)")
    ] = "whole"
    resampled: Annotated[
        bool, typer.Option(help="run the paper's resampled sweep too (off: time-aligned only)")
    ] = True
    skip: Annotated[
        str, typer.Option(help="time-aligned studies to leave out, e.g. gpa-cov,gpa-cal,gpa-live")
    ] = ""
    out_dir: Annotated[Path | None, typer.Option(help="write <trace>-gpa.{json,md,png} here")] = (
        None
    )


def run_gpa(options: GpaOptions) -> None:
    """Normalised machines m and overflow frequency q per capacity and method."""
    folder_or_exit("--out-dir", options.out_dir)
    settings = GpaEvaluationSettings(
        tasks=options.tasks,
        instances=options.instances,
        realisations=options.realisations,
        aligned_tasks=options.aligned_tasks,
        capacities=_floats("capacities", options.capacities),
        rhos=_floats("rhos", options.rhos),
        history_steps=options.history_steps,
        future_steps=options.future_steps,
        min_window_vms=options.min_window_vms,
        seed=options.seed,
        part=options.part,
        resampled=options.resampled,
        skip=tuple(name for name in options.skip.split(",") if name),
    )
    for path in options.paths:
        try:
            evaluation = run_gpa_evaluation(path, settings, out_dir=options.out_dir)
        except (TraceFormatError, ValueError) as exc:
            raise fail(f"{path}: {exc}") from None
        table = Table(title=f"{evaluation.trace}: resampled vs time-aligned")
        columns = ("c", "method", "m res.", "q res.", "q/rho", "m al.", "q al.", "q/rho", "learned")
        for column in columns:
            table.add_column(column)

        def cell(value: float | None, spec: str) -> str:
            return "-" if value is None else format(value, spec)

        for row in evaluation.rows():
            table.add_row(
                f"{row['capacity']:g}",
                row["method"],
                cell(row["resampled_m"], ".3f"),
                cell(row["resampled_q"], ".4f"),
                cell(row["resampled_q_over_rho"], ".2f"),
                cell(row["aligned_m"], ".3f"),
                cell(row["aligned_q"], ".4f"),
                cell(row["aligned_q_over_rho"], ".2f"),
                row["aligned_learned"] or "",
            )
        out.print(table)
    if options.out_dir is not None:
        out.print(f"written to {options.out_dir}")


gpa_command = options_command(GpaOptions, run_gpa)


app.command("gpa")(gpa_command)
