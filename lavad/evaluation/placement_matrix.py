"""Placement policies on a matrix of conditions: the yardstick defaults are chosen by.

A default is chosen by its worst cell, never by one cell's mean, so this
replays every policy in every cell of:

* windows: each half of an Azure V1 split replayed alone (``azure-head``,
  ``azure-tail``: a month split in two is the nearest to a period never seen),
  the whole split as one replay (``azure-whole``, as ``lavad replay`` runs it),
  OpenB on a GPU-bound host shape, DLRM on a host shape of our choosing, each
  read from a folder laid out as ``../shared/data`` (``Sources``): ours, or
  held-back traces of the same kinds;
* host shapes (Azure: the default 48/192 and 64/256, 32/128, 32/256);
* fleets: grown on demand, and fixed at 5% and 15% headroom over the first
  policy's peak in the same window, shape and seed;
* seeds (the trace's sampled lifetimes and every tie-break; with
  ``keep_vms``, also which VMs the replay keeps, ``evaluation.vm_sample``:
  OpenB's seeds otherwise only draw ties).

Per cell and policy: empty hosts in pp over the first policy (Best Fit), the
share of the oracle's gain, and stranded CPU and memory in pp over the first
policy's (the inflation metric, ``metrics.stranding``). The summary gives each
policy's mean and spread over seeds per condition, and its worst condition.

Policies are variants (``evaluation.variants``: ``name:key=value;key=value``);
``VARIANT+hindsight`` replays a lifetime policy with the tables ``VARIANT``'s
own run of the cell ended with, frozen (``evaluation.hindsight``), and
``VARIANT+hindsight-features`` the same without the VM's owner group, which
holds its own exit and its batch's. Cells run in worker processes, one
(window, shape, seed) each.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lavad.core.engine import Engine
from lavad.core.placement.registry import needs_true_lifetimes
from lavad.daemon import heap
from lavad.daemon.oracle_share import MIN_ORACLE_GAIN_PP
from lavad.daemon.replay import ReplayResult, on_common_pool, replay
from lavad.daemon.settings import HostSettings, Settings
from lavad.evaluation import hindsight
from lavad.evaluation.variants import parse_variant, with_variant
from lavad.evaluation.vm_sample import sample_vms
from lavad.streams.adapters import open_trace
from lavad.streams.adapters.azure_vms import BATCH_SIZE_MAP, FLAVOR_MAP, INTERVAL_MAP, AzureV1Vms
from lavad.streams.adapters.base import TraceFormatError
from lavad.streams.oracle import exit_times, with_true_lifetimes

AZURE_SHAPES = ("48/192", "64/256", "32/128", "32/256")
FLEETS = ("grown", "fixed+5%", "fixed+15%")
PAPER_ORACLE = "las-oracle:waste_guard=false;deployment_affinity=false"
DEFAULT_POLICIES = (
    "bestfit",
    "waste",
    "las",
    "lava",
    # The paper's oracles, without the waste guard and the deployment affinity
    # the learned defaults run under: the shares are of what the paper's rule
    # gains with true lifetimes.
    PAPER_ORACLE,
    "lava-oracle:waste_guard=false;deployment_affinity=false",
)
# The goal a lifetime policy is held to in every condition: at least half of
# the oracle's gain over the first policy (the LAVA paper's LAS keeps 64%),
# and no more than this much more stranded CPU or memory than the first policy.
GOAL_SHARE = 0.5
GOAL_STRAND_PP = 0.25


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    # The shapes this window is replayed on: cores/memory[/gpus[/disk]].
    shapes: tuple[str, ...]
    options: tuple[tuple[str, object], ...] = ()


WINDOWS: dict[str, Window] = {
    "azure-head": Window("azure-head", AZURE_SHAPES),
    "azure-tail": Window("azure-tail", AZURE_SHAPES),
    # The whole split in one replay, the model learning from an empty pool
    # through both halves: what ``lavad replay`` on the split measures.
    "azure-whole": Window("azure-whole", AZURE_SHAPES),
    # OpenB's most common GPU node (96 cores, 384 GiB, 8 GPUs): GPUs bind first.
    "openb": Window("openb", ("96/384/8",), (("hosts", False),)),
    # OpenB's other pod list, sampled from the default one with half its pods
    # CPU-only: a workload of the same kind that chose nothing, same host shape.
    "openb-cpu050": Window("openb-cpu050", ("96/384/8",), (("hosts", False), ("pods", "cpu050"))),
    # DLRM lists no hosts: a GPU node large enough for its biggest instance.
    "dlrm": Window("dlrm", ("192/1024/8/100000",)),
}


class EmptyWindow(ValueError):
    """A window whose events end before the metrics' warm-up does: no figure to compare."""


@dataclass(frozen=True, slots=True)
class Sources:
    """Where the windows' traces are read from: a folder laid out as ``../shared/data``
    (``azure-v1-vms``, ``alibaba-openb``, ``alibaba-dlrm``).

    Held-back traces of the same kinds check the defaults on periods they were
    not chosen on, so the matrix reads any such folder, not only ours.
    """

    data: Path
    # The Azure V1 split whose halves are the Azure windows; None: the folder's
    # only split (a folder of several must name one).
    azure_split: str | None = None

    def folder(self, window: str) -> Path:
        if window.startswith("azure"):
            return self.data / "azure-v1-vms"
        return self.data / ("alibaba-openb" if window.startswith("openb") else "alibaba-dlrm")

    def azure_trace(self) -> AzureV1Vms:
        """The Azure split, opened: its files and censoring time, or TraceFormatError."""
        return AzureV1Vms(self.folder("azure"), seed=0, pool="default", split=self.azure_split)


@dataclass(frozen=True, slots=True)
class MatrixRun:
    """What every cell of one matrix shares."""

    # The configuration each variant overrides (its pool's shape and seed per cell).
    settings: Settings
    sources: Sources
    # Variants; the first is the baseline the others are measured against.
    policies: tuple[str, ...]
    fleets: tuple[str, ...] = FLEETS
    # A seeded share of the VMs to replay (``vm_sample``); 1.0 keeps them all.
    keep_vms: float = 1.0
    # Overrides ``[metrics] warmup_s``: a window shorter than the configured
    # warm-up (a day by default) measures nothing.
    warmup_s: float | None = None


def _azure_part(which: str, into: Path, sources: Sources) -> Path:
    """One part of the Azure split's arrival lines as a trace folder of that split
    alone: the head the first ``n // 2`` of its ``n``, the tail the rest (500 each
    of the dev split's 1,000), the whole all of them."""
    split = sources.azure_trace()
    # One folder per process: cells of one window run in parallel.
    folder = into / f"azure-{which}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    files = (split.arrivals, split.durations)
    texts = [path.read_text(encoding="utf-8").splitlines(keepends=True) for path in files]
    if len(texts[0]) != len(texts[1]):
        # The two files line up line by line (same time bin): halves of unequal
        # files would pair one bin's arrivals with another's lifetimes.
        raise TraceFormatError(
            split.durations,
            f"{len(texts[1])} lines against {len(texts[0])} in {split.arrivals.name}: "
            "the files must line up line by line",
        )
    middle = len(texts[0]) // 2
    start, stop = {"head": (0, middle), "tail": (middle, None), "whole": (0, None)}[which]
    for path, lines in zip(files, texts, strict=True):
        part = lines[start:stop]
        target = path.name.replace(f"v1.{split.split}.", f"v1.{split.split}{which}.", 1)
        (folder / target).write_text("".join(part), encoding="utf-8")
    for name in (FLAVOR_MAP, INTERVAL_MAP, BATCH_SIZE_MAP):
        if (split.arrivals.parent / name).is_file():  # the batch sizes are optional
            shutil.copy(split.arrivals.parent / name, folder / name)
    return folder


def trace_path(window: str, scratch: Path, sources: Sources) -> Path:
    """The trace ``window`` replays (an Azure part is written under ``scratch``)."""
    if window.startswith("azure-"):
        return _azure_part(window.removeprefix("azure-"), scratch, sources)
    return sources.folder(window)


def hosts_of_shape(shape: str, count: int, grow: bool) -> HostSettings:
    """A pool of ``count`` hosts of ``cores/memory[/gpus[/disk]]``, grown on demand or not."""
    parts = [float(p) for p in shape.split("/")]
    cores, memory = parts[0], parts[1]
    gpus = parts[2] if len(parts) > 2 else 0.0
    disk = parts[3] if len(parts) > 3 else 0.0
    return HostSettings(
        source="shape",
        cores=cores,
        memory_gib=memory,
        gpus=gpus,
        disk_gib=disk,
        count=count,
        grow_on_demand=grow,
    )


def shape_error(raw: str) -> str | None:
    """Why ``raw`` is no host shape ``cores/memory[/gpus[/disk]]``, or None if it is one."""
    want = "want cores/memory[/gpus[/disk]] with cores and memory above 0"
    if not 2 <= len(raw.split("/")) <= 4:
        return f"{want}, got {raw!r}"
    try:
        hosts_of_shape(raw, 0, True)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        return f"{want}, got {raw!r}: {where}: {error['msg']}"
    except ValueError:  # a part that is not a number
        return f"{want}, got {raw!r}"
    return None


def _pool(result: ReplayResult) -> dict[str, Any]:
    pool: dict[str, Any] = next(iter(result.as_dict()["pools"].values()))
    return pool


def _run_fleet(
    trace: Path, window: Window, shape: str, seed: int, count: int, grow: bool, run: MatrixRun
) -> list[dict[str, Any]]:
    options = dict(window.options)
    hosts = hosts_of_shape(shape, count, grow)
    settings = run.settings.model_copy(update={"seed": seed, "hosts": hosts})
    if run.warmup_s is not None:
        metrics = dataclasses.replace(settings.metrics, warmup_s=run.warmup_s)
        settings = settings.model_copy(update={"metrics": metrics})
    keep_vms = run.keep_vms
    true_exits: dict[tuple[str, str], float] | None = None
    results = []
    fitted: dict[str, hindsight.FittedModels] = {}
    for spec in run.policies:
        plain, in_hindsight = hindsight.split(spec)
        name, args = parse_variant(plain)
        variant = with_variant(settings, name, args)
        opened = open_trace(trace, seed=seed, **options)  # type: ignore[arg-type]
        events: Any = sample_vms(opened.events(), seed, keep_vms)
        if needs_true_lifetimes(name):
            if true_exits is None:
                again = open_trace(trace, seed=seed, **options)  # type: ignore[arg-type]
                true_exits = exit_times(sample_vms(again.events(), seed, keep_vms))
            end = opened.end_time if opened.end_time is not None else math.inf
            events = with_true_lifetimes(events, true_exits, end)
        config = variant.engine_config(name, trace_has_hosts=opened.has_hosts)
        engine = Engine(config)
        if in_hindsight is not None:
            hindsight.install(engine, fitted[plain], in_hindsight)
        # Each replay from a settled heap, under the collector schedule
        # ``lavad replay`` sets (``tune_collector`` in ``run_unit``).
        heap.settle()
        result = replay(events, config, end_time=opened.end_time, engine=engine)
        if hindsight.wanted(spec, list(run.policies)):
            # Kept only for a hindsight variant of it: a model holds a window's tables.
            fitted[spec] = hindsight.fitted_models(engine)
        results.append(result)
    on_common_pool(results)
    rows = []
    for spec, result in zip(run.policies, results, strict=True):
        pool = _pool(result)
        if pool["measured_until_s"] <= pool["measured_from_s"]:
            raise EmptyWindow(
                f"window {window.name} measured nothing: its averages would open "
                f"{pool['warmup_s']:.0f} s after the first event, at "
                f"{pool['measured_from_s']:.0f} s, and close at the "
                f"{pool['measured_until'].replace('_', ' ')}, at {pool['measured_until_s']:.0f} s;"
                " pass --warmup-s below the window's span"
            )
        rows.append(
            {
                "policy": spec,
                "empty_pct": pool["empty_hosts_pct"],
                "stranded_cpu_pct": pool["stranded_cpu_pct"],
                "stranded_memory_pct": pool["stranded_memory_pct"],
                "failed_pct": pool["placement_failure_pct"],
                "peak": pool["hosts_used_peak"],
                "events_per_s": result.events_per_second,
            }
        )
    return rows


def run_unit(
    window_name: str,
    shape: str,
    seed: int,
    run: MatrixRun,
    scratch: str,
    report: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Every fleet of one (window, shape, seed): the grown pool first, for the first
    policy's peak. ``report`` hears each cell's figures as it ends."""
    heap.tune_collector()  # in the worker process, which runs the replays
    window = WINDOWS[window_name]
    trace = trace_path(window_name, Path(scratch), run.sources)
    cells = []
    grown = _run_fleet(trace, window, shape, seed, 0, True, run)
    peak = next(row["peak"] for row in grown if row["policy"] == run.policies[0])
    for fleet in run.fleets:
        if fleet == "grown":
            rows = grown
        else:
            headroom = float(fleet.removeprefix("fixed+").removesuffix("%")) / 100.0
            count = math.ceil(peak * (1.0 + headroom))
            rows = _run_fleet(trace, window, shape, seed, count, False, run)
        cells.append(
            {
                "window": window_name,
                "shape": shape,
                "fleet": fleet,
                "seed": seed,
                "keep_vms": run.keep_vms,
                "rows": rows,
            }
        )
        if report is not None:
            figures = ", ".join(
                f"{row['policy']} {row['empty_pct']:.2f}% empty, "
                f"CPU {row['stranded_cpu_pct']:.2f}% mem {row['stranded_memory_pct']:.2f}% stranded"
                for row in rows
            )
            report(f"{window_name} {shape} {fleet} seed {seed}: {figures}")
    return cells


def _shapes_of(window: str, shapes: Sequence[str] | None) -> Sequence[str]:
    """The shapes ``window`` is replayed on: ``shapes`` for Azure (default all)."""
    return shapes if shapes and window.startswith("azure") else WINDOWS[window].shapes


def units(
    windows: Sequence[str], shapes: Sequence[str] | None, seeds: int, first_seed: int = 0
) -> Iterator[tuple[str, str, int]]:
    """Each (window, shape, seed) to replay: Azure windows on ``shapes`` (default all)."""
    for name in windows:
        for shape in _shapes_of(name, shapes):
            for seed in range(first_seed, first_seed + seeds):
                yield name, shape, seed


def _print_to_stderr(line: str) -> None:
    # The workers' progress lines: plain text, so that a log keeps them as written.
    os.write(2, f"  {line}\n".encode())


def run_matrix(
    run: MatrixRun,
    windows: Sequence[str],
    shapes: Sequence[str] | None,
    seeds: int,
    first_seed: int,
    jobs: int,
) -> list[dict[str, Any]]:
    """Every cell, each (window, shape, seed) in one of ``jobs`` worker processes.

    Raises EmptyWindow for a window shorter than the warm-up; the cells left
    are cancelled.
    """
    cells: list[dict[str, Any]] = []
    # No more workers than units: the executor forks every worker at once.
    count = sum(len(_shapes_of(name, shapes)) for name in windows) * seeds
    workers = max(1, min(jobs, count))
    # Units are submitted as workers free up, a few ahead of them: memory
    # follows the workers, not --seeds (a count from the command line).
    ahead = 2 * workers
    with tempfile.TemporaryDirectory() as scratch, ProcessPoolExecutor(workers) as pool:
        pending: collections.deque[Future[list[dict[str, Any]]]] = collections.deque()
        try:
            for w, s, seed in units(windows, shapes, seeds, first_seed):
                pending.append(pool.submit(run_unit, w, s, seed, run, scratch, _print_to_stderr))
                if len(pending) >= ahead:
                    cells.extend(pending.popleft().result())
            while pending:
                cells.extend(pending.popleft().result())
        except EmptyWindow:
            for future in pending:
                future.cancel()
            raise
    return cells


def summarise(cells: list[dict[str, Any]], oracle: str) -> tuple[str, dict[str, Any]]:
    """Per condition (window, shape, fleet): each policy's mean and range over seeds,
    as a Markdown table, and each policy's worst condition."""
    conditions: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for cell in cells:
        conditions.setdefault((cell["window"], cell["shape"], cell["fleet"]), []).append(cell)
    policies = [row["policy"] for row in cells[0]["rows"]]
    baseline = policies[0]
    lines = [
        f"pp over {baseline}: mean [min, max] over seeds; share of {oracle}'s mean gain; "
        "stranded CPU / memory in pp over " + baseline,
        "",
    ]
    if oracle not in policies:
        lines += [f"No shares: the oracle {oracle} is not among the policies replayed.", ""]
    lines += [
        "| window | shape | fleet | " + baseline + " empty % | policy | empty pp | share |"
        " CPU strand pp | mem strand pp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worst: dict[str, dict[str, Any]] = {}
    for (window, shape, fleet), group in sorted(conditions.items()):
        by_policy: dict[str, dict[str, list[float]]] = {}
        for cell in group:
            rows = {row["policy"]: row for row in cell["rows"]}
            base = rows[baseline]
            for policy in policies:
                row = rows[policy]
                stats = by_policy.setdefault(policy, {"pp": [], "cpu": [], "mem": []})
                stats["pp"].append(row["empty_pct"] - base["empty_pct"])
                stats["cpu"].append(row["stranded_cpu_pct"] - base["stranded_cpu_pct"])
                stats["mem"].append(row["stranded_memory_pct"] - base["stranded_memory_pct"])
        base_empty = statistics.fmean(
            next(r for r in c["rows"] if r["policy"] == baseline)["empty_pct"] for c in group
        )
        gain = statistics.fmean(by_policy[oracle]["pp"]) if oracle in by_policy else math.nan
        for policy in policies:
            stats = by_policy[policy]
            pp = statistics.fmean(stats["pp"])
            share = pp / gain if gain and gain > 0 else math.nan
            cpu, mem = statistics.fmean(stats["cpu"]), statistics.fmean(stats["mem"])
            lines.append(
                f"| {window} | {shape} | {fleet} | {base_empty:.2f} | {policy} | {pp:+.2f} "
                f"[{min(stats['pp']):+.2f}, {max(stats['pp']):+.2f}] | "
                + ("-" if math.isnan(share) else f"{100 * share:.0f}%")
                + f" | {cpu:+.2f} | {mem:+.2f} |"
            )
            entry = worst.setdefault(
                policy,
                {
                    "share": math.inf,
                    "share_at": "",
                    "strand": -math.inf,
                    "strand_at": "",
                    "conditions": 0,
                    "shown_shares": 0,
                    "goal_shares": 0,
                    "goal_strands": 0,
                },
            )
            entry["conditions"] += 1
            if max(cpu, mem) <= GOAL_STRAND_PP:
                entry["goal_strands"] += 1
            if gain > MIN_ORACLE_GAIN_PP:
                entry["shown_shares"] += 1
                if share >= GOAL_SHARE:
                    entry["goal_shares"] += 1
                if share < entry["share"]:
                    entry["share"], entry["share_at"] = share, f"{window} {shape} {fleet}"
            if max(cpu, mem) > entry["strand"]:
                entry["strand"], entry["strand_at"] = max(cpu, mem), f"{window} {shape} {fleet}"
    lines += [
        "",
        f"Conditions at the goal: at least {100 * GOAL_SHARE:.0f}% of {oracle}'s gain (where it"
        f" gains over {MIN_ORACLE_GAIN_PP} pp), and stranded CPU and memory each within"
        f" {baseline}'s + {GOAL_STRAND_PP} pp.",
        "",
        "| policy | worst share (where) | worst strand pp (where) | share at the goal |"
        " strand at the goal |",
        "|---|---|---|---|---|",
    ]
    for policy in policies:
        entry = worst[policy]
        least = "-" if math.isinf(entry["share"]) else f"{100 * entry['share']:.0f}%"
        lines.append(
            f"| {policy} | {least} ({entry['share_at']}) | "
            f"{entry['strand']:+.2f} ({entry['strand_at']}) | "
            f"{entry['goal_shares']} of {entry['shown_shares']} | "
            f"{entry['goal_strands']} of {entry['conditions']} |"
        )
    return "\n".join(lines), worst


def check_variant(settings: Settings, spec: str) -> None:
    """Raise ConfigError or ValueError, naming the key, for a variant no replay would take:
    checked before any worker starts, not as a traceback from the first cell."""
    plain, _ = hindsight.split(spec)
    name, args = parse_variant(plain)
    with_variant(settings, name, args).engine_config(name, trace_has_hosts=False)


def windows_present(
    sources: Sources, windows: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``windows`` split into those whose folder ``sources`` holds and those it does not."""
    present = tuple(window for window in windows if sources.folder(window).is_dir())
    return present, tuple(window for window in windows if window not in present)


def check_sources(sources: Sources, windows: Sequence[str]) -> None:
    """Raise TraceFormatError, naming the folder, for a window whose trace is not there:
    checked before any worker starts, not as a traceback from the first cell."""
    for window in windows:
        folder = sources.folder(window)
        if not folder.is_dir():
            raise TraceFormatError(folder, f"window {window} reads this folder: not found")
        if window.startswith("azure"):
            sources.azure_trace()
