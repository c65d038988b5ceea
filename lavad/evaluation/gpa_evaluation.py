"""Both GPA evaluations of a usage trace, side by side: the paper's and the time-aligned one.

``run_gpa_evaluation`` runs the section 5 resampling sweep (``gpa_sweep``)
and the time-aligned evaluation (``gpa_aligned``) on one trace, and can
write the result as JSON, a markdown table (m and q per capacity and method,
both evaluations side by side) and a PNG of m against q.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from lavad.daemon.plotting import pyplot
from lavad.evaluation.gpa_aligned import (
    LEARNING_FAMILIES,
    AlignedResult,
    AlignedSettings,
    load_aligned_windows,
    run_aligned,
)
from lavad.evaluation.gpa_sweep import (
    PAPER_CAPACITIES,
    PAPER_RHOS,
    SweepResult,
    SweepSettings,
    load_usage_series,
    run_sweep,
)


@dataclass(slots=True)
class GpaEvaluation:
    trace: str
    path: str
    resampled: SweepResult
    aligned: AlignedResult

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "path": self.path,
            "resampled": self.resampled.as_dict(),
            "aligned": self.aligned.as_dict(),
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per (capacity, method): m and q of both evaluations (None where not run)."""
        resampled = {
            (row["capacity"], row["method"]): row
            for row in self.resampled.summary()
            if row["clairvoyance"] == 1.0 or len(self.resampled.settings.clairvoyance) == 1
        }
        aligned = {(row["capacity"], row["method"]): row for row in self.aligned.summary()}
        order = {label: i for i, label in enumerate(self.aligned.settings.method_labels())}
        keys = sorted(
            dict.fromkeys([*resampled, *aligned]),
            key=lambda key: (key[0], order.get(key[1], len(order))),
        )
        rows = []
        for capacity, method in keys:
            r = resampled.get((capacity, method))
            a = aligned.get((capacity, method))
            rows.append(
                {
                    "capacity": capacity,
                    "method": method,
                    "resampled_m": None if r is None else r["m"],
                    "resampled_q": None if r is None else r["q"],
                    "resampled_q_over_rho": None if r is None else r["q_over_rho"],
                    "aligned_m": None if a is None else a["m"],
                    "aligned_q": None if a is None else a["q"],
                    "aligned_q_over_rho": None if a is None else a["q_over_rho"],
                    "aligned_learned": None if a is None else _learned(a),
                }
            )
        return rows


def _learned(row: dict[str, Any]) -> str:
    """What a learning method settled on: its mean margin, the methods chosen (gpa-online),
    and the migrations per VM-day (gpa-react, gpa-drift; with gpa-drift's resets per VM-day)."""
    if row["family"] not in LEARNING_FAMILIES:
        return ""
    detail = f" ({row['detail']})" if row.get("detail") else ""
    if row["family"] in ("gpa-react", "gpa-drift"):
        detail += f", {row['migrations_per_vm_day']:.3f} moves/VM-day"
    if row["family"] == "gpa-drift":
        detail += f", {row['drift_resets_per_vm_day']:.3f} resets/VM-day"
    return f"x{row['margin']:.2f}{detail}"


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(evaluation: GpaEvaluation) -> str:
    """m and q (and q / rho for GPA) per capacity and method, both evaluations."""
    lines = [
        f"## {evaluation.trace}: resampled (paper, section 5) vs time-aligned",
        "",
        "| c | method | m resampled | q resampled | q/rho | m aligned | q aligned | q/rho "
        "| learned (aligned) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in evaluation.rows():
        lines.append(
            f"| {row['capacity']:g} | {row['method']} "
            f"| {_cell(row['resampled_m'], '.3f')} | {_cell(row['resampled_q'], '.4f')} "
            f"| {_cell(row['resampled_q_over_rho'], '.2f')} "
            f"| {_cell(row['aligned_m'], '.3f')} | {_cell(row['aligned_q'], '.4f')} "
            f"| {_cell(row['aligned_q_over_rho'], '.2f')} | {row['aligned_learned'] or ''} |"
        )
    return "\n".join(lines) + "\n"


FAMILY_COLOURS = {
    "gpa": "tab:red",
    "gpa-cov": "tab:purple",
    "gpa-cal": "tab:brown",
    "gpa-live": "tab:olive",
    "av": "tab:blue",
    "perc": "tab:green",
    "cantelli": "tab:orange",
}


def plot_m_vs_q(evaluation: GpaEvaluation, path: Path) -> None:
    """PNG: m against q per capacity (columns), resampled and aligned (rows)."""
    plt = pyplot()

    panels: list[tuple[str, list[dict[str, Any]]]] = [
        ("resampled", [r for r in evaluation.resampled.summary() if r["clairvoyance"] == 1.0]),
        ("time-aligned", evaluation.aligned.summary()),
    ]
    capacities = sorted({row["capacity"] for _, rows in panels for row in rows})
    figure, axes = plt.subplots(
        len(panels), len(capacities), figsize=(4 * len(capacities), 7), squeeze=False
    )
    for r, (title, rows) in enumerate(panels):
        for c, capacity in enumerate(capacities):
            axis = axes[r][c]
            for family, colour in FAMILY_COLOURS.items():
                points = [
                    row for row in rows if row["capacity"] == capacity and row["family"] == family
                ]
                if not points:
                    continue
                axis.scatter(
                    [p["q"] for p in points],
                    [p["m"] for p in points],
                    color=colour,
                    label=family,
                    s=18,
                )
                for p in points:
                    axis.annotate(f"{p['parameter']:g}", (p["q"], p["m"]), fontsize=6)
            axis.set_xscale("symlog", linthresh=1e-4)
            axis.set_title(f"{title}, c = {capacity:g}", fontsize=9)
            axis.set_xlabel("q (overflow frequency)")
            axis.set_ylabel("m (normalised machines)")
            axis.grid(alpha=0.3)
    for row_axes in axes:
        row_axes[0].legend(fontsize=7)
    figure.suptitle(evaluation.trace)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# Time-aligned studies that can be left out (the live method's comparison needs
# plain GPA, gpa-online and the paper's baselines, which always run).
SKIPPABLE = ("gpa-cov", "gpa-cal", "gpa-live", "gpa-react", "gpa-drift")


@dataclass(frozen=True)
class GpaEvaluationSettings:
    """What ``run_gpa_evaluation`` runs: the sweep's and the time-aligned study's sizes.

    ``part`` "first" or "second": the time-aligned evaluation on that half of
    the trace alone (``load_aligned_windows``). ``resampled`` False skips the
    section 5 resampling (its rows are then empty); ``skip`` leaves out
    time-aligned studies by family (``SKIPPABLE``: gpa-cal's backtest costs
    the most). The time-aligned instances rotate over every day-aligned window
    with at least ``min_window_vms`` usable VMs (or the fullest window if none
    has).
    """

    tasks: int = 200
    instances: int = 5
    realisations: int = 2000
    aligned_tasks: int = 200
    capacities: Sequence[float] = PAPER_CAPACITIES
    rhos: Sequence[float] = PAPER_RHOS
    clairvoyance: Sequence[float] = (1.0,)
    history_steps: int | None = None
    future_steps: int | None = None
    min_window_vms: int = 20
    seed: int = 0
    part: str = "whole"
    resampled: bool = True
    skip: Sequence[str] = ()


def run_gpa_evaluation(
    path: Path,
    settings: GpaEvaluationSettings = GpaEvaluationSettings(),
    *,
    out_dir: Path | None = None,
) -> GpaEvaluation:
    """Run both evaluations on the trace at ``path``; write JSON, table and PNG to ``out_dir``.

    With a ``part`` of the trace, the files are named ``<trace>-<part>-gpa.*``.
    """
    tasks, instances, seed = settings.tasks, settings.instances, settings.seed
    capacities, rhos, skip, part = settings.capacities, settings.rhos, settings.skip, settings.part
    unknown = sorted(set(skip) - set(SKIPPABLE))
    if unknown:
        raise ValueError(f"cannot skip {', '.join(unknown)}: skippable are {', '.join(SKIPPABLE)}")
    for name, value in (("capacities", capacities), ("rhos", rhos)):
        if not value or any(not math.isfinite(v) for v in value):
            raise ValueError(f"{name} must be a non-empty sequence of numbers")
    sweep_settings = SweepSettings(
        tasks=tasks,
        instances=instances,
        realisations=settings.realisations,
        capacities=tuple(capacities),
        clairvoyance=tuple(settings.clairvoyance),
        rhos=tuple(rhos),
        seed=seed,
    )
    aligned_settings = AlignedSettings(
        tasks=settings.aligned_tasks,
        instances=instances,
        capacities=tuple(capacities),
        rhos=tuple(rhos),
        seed=seed,
        covariance_aware="gpa-cov" not in skip,
        calibrated="gpa-cal" not in skip,
        live_factor="gpa-live" not in skip,
        react="gpa-react" not in skip,
        drift="gpa-drift" not in skip,
    )
    windows = load_aligned_windows(path, settings.history_steps, settings.future_steps, part=part)
    if settings.resampled:
        series = load_usage_series(path)
        sweep = run_sweep(series, sweep_settings, path=str(path))
    else:
        sweep = SweepResult(windows[0].trace, str(path), "mean", 0, 0, sweep_settings)
    wide = [w for w in windows if len(w.names) >= settings.min_window_vms]
    aligned = run_aligned(wide or [max(windows, key=lambda w: len(w.names))], aligned_settings)
    evaluation = GpaEvaluation(windows[0].trace, str(path), sweep, aligned)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = evaluation.trace if part == "whole" else f"{evaluation.trace}-{part}"
        (out_dir / f"{stem}-gpa.json").write_bytes(
            orjson.dumps(evaluation.as_dict(), option=orjson.OPT_INDENT_2)
        )
        (out_dir / f"{stem}-gpa.md").write_text(markdown_table(evaluation))
        plot_m_vs_q(evaluation, out_dir / f"{stem}-gpa.png")
    return evaluation
