"""``lavad evaluate limits PATH``: Autopilot's recommenders against the VPA baseline.

Wire into ``daemon/cli.py`` as ``lifetime`` is:
``evaluate_app.command("limits")(limits_command)`` and
``evaluate_app.command("limits-sweep")(limits_sweep_command)``, for
``lavad evaluate limits PATH...`` and ``lavad evaluate limits-sweep PATH`` (the
documented hyperparameter sweep). ``app`` holds both commands. The protocol
is ``lavad.evaluation.limits``'s.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from lavad.daemon.console import fail, out, plot_or_exit, seed_option, writable_or_exit
from lavad.evaluation.limits import (
    DEFAULT_WARMUP_S,
    LimitsEvaluation,
    Resource,
    default_recommenders,
    dominates,
    evaluate_jobs,
    evaluate_limits,
    plot_pareto,
    sweep_ml,
    training_jobs,
)
from lavad.evaluation.limits_dominance import (
    HALVES,
    Cell,
    cells_as_dicts,
    evaluate_cells,
    summarise,
)
from lavad.evaluation.limits_horizontal import evaluate_horizontal
from lavad.models.limits.horizontal import HorizontalConfig
from lavad.models.limits.ml import MlConfig
from lavad.streams.adapters import TraceFormatError
from lavad.streams.seeds import seed_refusal

# ML's limit changes per job-day may be at most this many times the VPA's.
CHANGE_RATIO = 2.0

app = typer.Typer(help="Limits: Autopilot moving-window and ML recommenders vs. Kubernetes VPA.")


def limits_command(
    paths: Annotated[list[Path], typer.Argument(help="usage trace folders (one or more)")],
    jobs: Annotated[int, typer.Option(help="jobs sampled per trace (0: all of them)", min=0)] = 20,
    seed: Annotated[
        int,
        seed_option("seed for the job sample and sampled fields"),
    ] = 0,
    warmup_h: Annotated[float, typer.Option(help="hours before scoring starts", min=0)] = (
        DEFAULT_WARMUP_S / 3600
    ),
    ml_cpu_w_u: Annotated[
        float | None, typer.Option(help="ML underrun weight for CPU (default: the tuned one)")
    ] = None,
    ml_memory_w_u: Annotated[
        float | None, typer.Option(help="ML underrun weight for memory (default: the tuned one)")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="PNG Pareto plot of slack vs overruns")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write the scores as JSON")
    ] = None,
    part: Annotated[
        str, typer.Option(help="whole trace, or each job's windows in its first or second half")
    ] = "whole",
    seeds: Annotated[
        str | None,
        typer.Option(help="comma-separated seeds: ml against the VPA on each (dominance report)"),
    ] = None,
    halves: Annotated[
        bool, typer.Option(help="dominance report on each trace's first and second half alone")
    ] = False,
) -> None:
    """Relative/absolute slack, overrun rate, clean job-days and limit changes per recommender.

    With --seeds or --halves: ml against the VPA alone on every (trace, resource, seed,
    half), and per pair how many cells dominate, the worst one and a 95% t-interval of
    the differences over the cells.
    """
    plot_or_exit("--plot", plot)
    writable_or_exit("--json", json_out)
    overrides: dict[str, MlConfig] = {}
    try:
        if ml_cpu_w_u is not None:
            overrides["cpu"] = replace(MlConfig.for_resource("cpu"), w_u=ml_cpu_w_u)
        if ml_memory_w_u is not None:
            overrides["memory"] = replace(MlConfig.for_resource("memory"), w_u=ml_memory_w_u)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if seeds is not None or halves:
        try:
            seed_list = [seed] if seeds is None else [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            raise fail(f"--seeds must be comma-separated integers, got {seeds!r}") from None
        if not seed_list:
            raise fail("--seeds names no seed")
        for listed in seed_list:
            refusal = seed_refusal(listed)
            if refusal is not None:
                raise fail(f"--seeds: {refusal}")
        _dominance_report(
            paths,
            seed_list,
            list(HALVES) if halves else [part],
            jobs=jobs or None,
            warmup_s=warmup_h * 3600.0,
            ml=overrides,
            json_out=json_out,
        )
        return
    results: list[LimitsEvaluation] = []
    for path in paths:
        try:
            ev = evaluate_limits(
                path,
                max_jobs=jobs or None,
                seed=seed,
                ml=overrides,
                warmup_s=warmup_h * 3600.0,
                part=part,
            )
        except (TraceFormatError, ValueError) as exc:
            raise fail(f"{path}: {exc}") from None
        if not ev.jobs:
            # Every column is a mean over job-days: with no job, an empty table would say "done".
            raise fail(f"{path}: holds no job with usage samples to recommend limits for")
        results.append(ev)
        table = Table(title=f"{ev.trace}: {ev.jobs} jobs, seed {ev.seed}")
        for column in (
            "resource",
            "recommender",
            "job-days",
            "rel. slack mean",
            "rel. slack median",
            "demand slack mean",
            "abs. slack",
            "overrun rate",
            "days w/o overrun",
            "changes/job-day",
        ):
            table.add_column(column)
        for s in ev.scores:
            table.add_row(
                s.resource,
                s.recommender,
                str(s.job_days),
                f"{s.relative_slack_mean:.1%}",
                f"{s.relative_slack_median:.1%}",
                f"{s.demand_slack_mean:.1%}",
                f"{s.absolute_slack_mean:.4f}",
                f"{s.overrun_rate:.3%}",
                f"{s.days_without_overrun:.1%}",
                f"{s.changes_per_job_day:.2f}",
            )
        out.print(table)
        for resource in ("cpu", "memory"):
            ml, vpa = ev.get(resource, "ml"), ev.get(resource, "vpa")
            if ml is not None and vpa is not None:
                # Both axes no worse, one better, and changes within 2x of the VPA's.
                verdict = (
                    "dominates"
                    if dominates(ml, vpa, change_ratio=CHANGE_RATIO)
                    else "does NOT dominate"
                )
                out.print(
                    f"{ev.trace} {resource}: ML {verdict} VPA (changes/job-day"
                    f" {ml.changes_per_job_day:.2f} against {vpa.changes_per_job_day:.2f})"
                )
    if plot is not None:
        plot_pareto(results, plot)
        out.print(f"plot: {plot}")
    if json_out is not None:
        json_out.write_bytes(
            orjson.dumps([r.as_dict() for r in results], option=orjson.OPT_INDENT_2)
        )


def _pct(value: float) -> str:
    return f"{100 * value:+.3f}"


def _dominance_report(
    paths: list[Path],
    seeds: list[int],
    parts: list[str],
    *,
    jobs: int | None,
    warmup_s: float,
    ml: dict[str, MlConfig],
    json_out: Path | None,
) -> None:
    """ml against the VPA on every (trace, resource, seed, part); per pair a summary."""
    cells: list[Cell] = []
    for path in paths:
        try:
            cells.extend(
                evaluate_cells(
                    path,
                    seeds=seeds,
                    parts=parts,
                    max_jobs=jobs,
                    warmup_s=warmup_s,
                    change_ratio=CHANGE_RATIO,
                    recommenders=default_recommenders(ml),
                )
            )
        except (TraceFormatError, ValueError) as exc:
            raise fail(f"{path}: {exc}") from None
    table = Table(title="ml against the VPA per (trace, resource, seed, half)")
    for column in (
        "trace",
        "resource",
        "seed",
        "part",
        "jobs",
        "ml slack",
        "vpa slack",
        "ml overruns",
        "vpa overruns",
        "ml changes",
        "vpa changes",
        "dominates",
    ):
        table.add_column(column)
    for c in cells:
        table.add_row(
            c.trace,
            c.resource,
            str(c.seed),
            c.part,
            str(c.jobs),
            f"{c.ml.relative_slack_mean:.2%}",
            f"{c.vpa.relative_slack_mean:.2%}",
            f"{c.ml.overrun_rate:.3%}",
            f"{c.vpa.overrun_rate:.3%}",
            f"{c.ml.changes_per_job_day:.2f}",
            f"{c.vpa.changes_per_job_day:.2f}",
            "yes" if c.dominates else "NO",
        )
    out.print(table)
    summaries = summarise(cells)
    pairs = Table(title="per pair: ml - vpa, mean over cells with its 95% t-interval (points)")
    for column in (
        "trace",
        "resource",
        "dominated cells",
        "slack diff",
        "slack 95% CI",
        "overrun diff",
        "overrun 95% CI",
        "worst cell",
    ):
        pairs.add_column(column)
    for p in summaries:
        w = p.worst
        pairs.add_row(
            p.trace,
            p.resource,
            f"{p.dominated}/{p.cells}",
            _pct(p.slack_diff.mean),
            f"[{_pct(p.slack_diff.low)}, {_pct(p.slack_diff.high)}]",
            _pct(p.overrun_diff.mean),
            f"[{_pct(p.overrun_diff.low)}, {_pct(p.overrun_diff.high)}]",
            f"seed {w.seed} {w.part}: {_pct(w.slack_diff)} / {_pct(w.overrun_diff)}",
        )
    out.print(pairs)
    total = sum(p.dominated for p in summaries)
    every = sum(p.cells for p in summaries)
    whole = sum(p.all_dominate for p in summaries)
    out.print(
        f"ml dominates the VPA in {total}/{every} cells; on every cell of {whole}/"
        f"{len(summaries)} pairs"
    )
    if json_out is not None:
        json_out.write_bytes(
            orjson.dumps(
                {
                    "cells": cells_as_dicts(cells),
                    "pairs": [
                        {
                            "trace": p.trace,
                            "resource": p.resource,
                            "cells": p.cells,
                            "dominated": p.dominated,
                            "slack_diff": [p.slack_diff.mean, p.slack_diff.half_width],
                            "overrun_diff": [p.overrun_diff.mean, p.overrun_diff.half_width],
                            "worst": {"seed": p.worst.seed, "part": p.worst.part},
                        }
                        for p in summaries
                    ],
                },
                option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY,
            )
        )


def limits_sweep_command(
    path: Annotated[Path, typer.Argument(help="usage trace folder")],
    resource: Annotated[str, typer.Option(help="cpu or memory")] = "cpu",
    w_u: Annotated[str, typer.Option(help="comma-separated ML underrun weights")] = (
        "0.003,0.01,0.03,0.1,0.3"
    ),
    train: Annotated[int, typer.Option(help="training jobs, outside the sample", min=1)] = 8,
    jobs: Annotated[int, typer.Option(help="size of the evaluation sample to avoid", min=1)] = 20,
    seed: Annotated[int, seed_option("seed (as for `limits`)")] = 0,
) -> None:
    """Sweep the ML underrun weight on jobs held out of `limits`' sample; VPA for reference.

    Pick the weight whose point dominates VPA here, then run `limits` with
    --ml-cpu-w-u / --ml-memory-w-u: the reported numbers stay out-of-sample.
    """
    if resource not in ("cpu", "memory"):
        raise fail(f"--resource must be cpu or memory, got {resource!r}")
    res: Resource = "cpu" if resource == "cpu" else "memory"
    try:
        weights = [float(x) for x in w_u.split(",")]
        base = MlConfig.for_resource(res)
        grid = [replace(base, w_u=w) for w in weights]
        train_set = training_jobs(path, count=train, exclude_sample=jobs, seed=seed)
    except (TraceFormatError, ValueError) as exc:
        raise fail(str(exc)) from None
    [vpa] = evaluate_jobs(train_set, {"vpa": default_recommenders()["vpa"]}, resources=(res,))
    table = Table(title=f"{path.name} {res}: {len(train_set)} training jobs")
    for column in ("ML w_u", "rel. slack mean", "overrun rate", "changes/job-day", "vs VPA"):
        table.add_column(column)
    table.add_row(
        "VPA",
        f"{vpa.relative_slack_mean:.1%}",
        f"{vpa.overrun_rate:.3%}",
        f"{vpa.changes_per_job_day:.2f}",
        "",
    )
    for config, s in sweep_ml(train_set, grid, resource=res):
        table.add_row(
            f"{config.w_u:g}",
            f"{s.relative_slack_mean:.1%}",
            f"{s.overrun_rate:.3%}",
            f"{s.changes_per_job_day:.2f}",
            "dominates" if dominates(s, vpa) else "",
        )
    out.print(table)


def horizontal_command(
    paths: Annotated[list[Path], typer.Argument(help="traces whose requests name deployments")],
    statistic: Annotated[str, typer.Option(help="max or p95 over the horizon")] = "max",
    downscale_delay_h: Annotated[
        float, typer.Option(help="hours a downscale is deferred", min=0)
    ] = 48.0,
) -> None:
    """Autopilot's horizontal scaling against each deployment's recorded instance counts."""
    try:
        config = HorizontalConfig(
            statistic=statistic,  # type: ignore[arg-type]
            downscale_delay_s=downscale_delay_h * 3600.0,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    table = Table(title="horizontal scaling against recorded instance counts")
    for column in (
        "trace",
        "apps",
        "app-days",
        "over-provisioning",
        "shortfall",
        "changes/app-day",
        "recorded changes/app-day",
    ):
        table.add_column(column)
    for path in paths:
        try:
            score = evaluate_horizontal(path, config)
        except (TraceFormatError, ValueError) as exc:
            raise fail(f"{path}: {exc}") from None
        table.add_row(
            path.name,
            str(score.apps),
            f"{score.app_days:.0f}",
            f"{score.over_provisioning:.1%}",
            f"{score.shortfall:.1%}",
            f"{score.recommended_changes_per_app_day:.2f}",
            f"{score.recorded_changes_per_app_day:.2f}",
        )
    out.print(table)


app.command("limits")(limits_command)
app.command("limits-sweep")(limits_sweep_command)
app.command("horizontal")(horizontal_command)
