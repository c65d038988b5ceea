"""``lavad evaluate admission PATH``: zeroth vs first vs second moment admission policies.

Wire into ``daemon/cli.py`` with
``evaluate_app.command("admission")(admission_command)`` (as ``limits`` is).
``app`` runs the same command on its own. The protocol is
``lavad.evaluation.admission``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from lavad.daemon.console import fail, out, seed_option, writable_or_exit
from lavad.evaluation.admission import MomentSettings, TraceName, evaluate_admission
from lavad.streams.adapters import TraceFormatError

app = typer.Typer(help="Admission control: zeroth, first and second moment policies.")


def _trace_name(path: Path) -> TraceName:
    text = str(path)
    if "dlrm" in text:
        return "alibaba-dlrm"
    if "azure" in text:
        return "azure-v1-vms"
    raise ValueError(f"cannot tell the trace of {path}: want alibaba-dlrm or azure-v1-vms")


def admission_command(
    paths: Annotated[list[Path], typer.Argument(help="alibaba-dlrm / azure-v1-vms folders")],
    target: Annotated[
        float, typer.Option(help="scale-out failure rate each threshold is tuned to", min=0)
    ] = 0.01,
    capacity_position: Annotated[
        float,
        typer.Option(help="capacity between reject-all-feasible (0) and admit-all peak (1)"),
    ] = 0.5,
    horizons_h: Annotated[
        str, typer.Option(help="sub-policy horizons in hours, comma-separated; 'paper' for 3y..24h")
    ] = "24,6,1",
    steps: Annotated[int, typer.Option(help="look-ahead times per sub-policy", min=1)] = 100,
    iterations: Annotated[int, typer.Option(help="binary search steps per policy", min=1)] = 8,
    marginal: Annotated[
        float, typer.Option(help="marginal heuristic fraction of capacity (0: off)", min=0)
    ] = 0.0,
    max_arrival_h: Annotated[
        float, typer.Option(help="hours of arrivals kept (0: all)", min=0)
    ] = 0.0,
    seed: Annotated[int, seed_option("seed of the trace adapters")] = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the scores as JSON")
    ] = None,
) -> None:
    """Per policy at its tuned threshold: utilisation, scale-out failure rate, decision latency."""
    writable_or_exit("--json", json_out)
    horizons = (
        None
        if horizons_h == "paper"
        else [float(h) * 3600.0 for h in horizons_h.split(",") if h.strip()]
    )
    results = []
    for path in paths:
        try:
            ev = evaluate_admission(
                path,
                _trace_name(path),
                target_failure_rate=target,
                capacity_position=capacity_position,
                moments=MomentSettings(
                    horizons_s=horizons, steps=steps, marginal_fraction=marginal
                ),
                iterations=iterations,
                max_arrival_s=max_arrival_h * 3600.0 or None,
                seed=seed,
            )
        except (TraceFormatError, ValueError) as exc:
            raise fail(f"{path}: {exc}") from None
        results.append(ev)
        title = f"{ev.trace}: capacity {ev.capacity:.0f} cores"
        table = Table(title=f"{title}, target failure rate {ev.target_failure_rate:.2%}")
        for column in (
            "policy",
            "threshold",
            "utilisation",
            "failure rate",
            "admitted/arrivals",
            "latency p50 ms",
            "latency p99 ms",
            "gain vs zeroth",
        ):
            table.add_column(column)
        names = {s.policy for s in ev.scores}
        for s in ev.scores:
            gain = f"{ev.gain(s.policy):+.1%}" if "zeroth" in names else "-"
            table.add_row(
                s.policy,
                f"{s.threshold:.4g}",
                f"{s.utilisation:.2%}",
                f"{s.failure_rate:.3%}" + ("" if s.meets_target else " (misses)"),
                f"{s.admitted}/{s.arrivals}",
                f"{s.latency_median_ms:.3f}",
                f"{s.latency_p99_ms:.3f}",
                gain,
            )
        out.print(table)
        # The fitted priors, ready for the live daemon's configuration.
        out.print("[admission.priors]  # fitted on " + ev.trace, markup=False)
        for name, (shape, rate) in ev.priors.items():
            out.print(f"{name} = {{ shape = {shape:.6g}, rate = {rate:.6g} }}", markup=False)
    if json_out is not None:
        json_out.write_bytes(
            orjson.dumps([r.as_dict() for r in results], option=orjson.OPT_INDENT_2)
        )


app.command("admission")(admission_command)
