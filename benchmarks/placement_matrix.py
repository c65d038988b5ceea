"""``python -m benchmarks.placement_matrix``: placement policies on a matrix of conditions.

A default is chosen by its worst cell, never by one cell's mean, so this
replays every policy in every cell of:

* windows: each half of the Azure V1 dev split replayed alone (``azure-head``,
  ``azure-tail``: a month split in two is the nearest we hold to a period never
  seen), OpenB on a GPU-bound host shape, DLRM on a host shape of our choosing;
  ``--data`` reads them from another folder laid out as ``../shared/data``
  (held-back traces of the same kinds), and ``--azure-split`` picks its Azure
  split where the folder holds several;
* host shapes (Azure: the default 48/192 and 64/256, 32/128, 32/256);
* fleets: grown on demand, and fixed at 5% and 15% headroom over Best Fit's
  peak in the same window, shape and seed;
* seeds (the trace's sampled lifetimes and every tie-break; with
  ``--keep-vms``, also which VMs the replay keeps, ``lavad.evaluation.vm_sample``:
  OpenB's seeds otherwise only draw ties).

Per cell and policy: empty hosts in pp over Best Fit, the share of
``--oracle``'s gain, and stranded CPU and memory in pp over Best Fit (the
inflation metric, ``metrics.stranding``). The summary gives each policy's
mean and spread over seeds per condition, and its worst condition.

Policies are variants as in ``benchmarks.lifetime_ablation``
(``name:key=value;key=value``); ``VARIANT+hindsight`` replays a lifetime
policy with the tables ``VARIANT``'s own run of the cell ended with, frozen
(``lavad.evaluation.hindsight``). Cells run in ``--jobs`` processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from benchmarks.arguments import at_least_one, at_least_zero
from benchmarks.lifetime_ablation import CONFIG, parse_variant
from lavad.core.engine import Engine
from lavad.core.placement.registry import needs_true_lifetimes
from lavad.daemon import heap
from lavad.daemon.replay import on_common_pool, replay
from lavad.daemon.settings import ConfigError, HostSettings, Settings, load_settings
from lavad.evaluation import hindsight
from lavad.evaluation.vm_sample import sample_vms
from lavad.streams.adapters import open_trace
from lavad.streams.adapters.azure_vms import (
    BATCH_SIZE_MAP,
    FLAVOR_MAP,
    INTERVAL_MAP,
    AzureV1Vms,
)
from lavad.streams.adapters.base import TraceFormatError
from lavad.streams.oracle import exit_times, with_true_lifetimes

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
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


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    # The shapes this window is replayed on: cores/memory[/gpus[/disk]].
    shapes: tuple[str, ...]
    options: tuple[tuple[str, object], ...] = ()


WINDOWS: dict[str, Window] = {
    "azure-head": Window("azure-head", AZURE_SHAPES),
    "azure-tail": Window("azure-tail", AZURE_SHAPES),
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
    """Where the windows' traces are read from: a folder laid out as ``../shared/data``.

    Held-back traces of the same kinds check the defaults on periods they were
    not chosen on, so the matrix reads any such folder, not only ours.
    """

    data: Path = SHARED
    # The Azure V1 split whose halves are the Azure windows; None: the folder's
    # only split (a folder of several must name one).
    azure_split: str | None = None
    # Overrides [metrics] warmup_s: a window shorter than the configuration's
    # day of warm-up measures nothing.
    warmup_s: float | None = None

    def folder(self, window: str) -> Path:
        if window.startswith("azure"):
            return self.data / "azure-v1-vms"
        return self.data / ("alibaba-openb" if window.startswith("openb") else "alibaba-dlrm")

    def azure_trace(self) -> AzureV1Vms:
        """The Azure split, opened: its files and censoring time, or TraceFormatError."""
        return AzureV1Vms(self.folder("azure"), seed=0, pool="default", split=self.azure_split)


def _azure_half(which: str, into: Path, sources: Sources) -> Path:
    """One half of the Azure split's arrival lines (the head the first ``n // 2`` of
    its ``n``, the tail the rest: 500 each of the dev split's 1,000) as a trace folder."""
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
    for path, lines in zip(files, texts, strict=True):
        half = lines[:middle] if which == "head" else lines[middle:]
        target = path.name.replace(f"v1.{split.split}.", f"v1.{split.split}{which}.", 1)
        (folder / target).write_text("".join(half), encoding="utf-8")
    for name in (FLAVOR_MAP, INTERVAL_MAP, BATCH_SIZE_MAP):
        if (split.arrivals.parent / name).is_file():  # the batch sizes are optional
            shutil.copy(split.arrivals.parent / name, folder / name)
    return folder


def trace_path(window: str, scratch: Path, sources: Sources | None = None) -> Path:
    sources = sources or Sources()
    if window in ("azure-head", "azure-tail"):
        return _azure_half(window.removeprefix("azure-"), scratch, sources)
    return sources.folder(window)


def _hosts(shape: str, count: int, grow: bool) -> HostSettings:
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


def _with_variant(settings: Settings, name: str, args: dict[str, object]) -> Settings:
    """``settings`` with policy ``name``'s arguments overridden by ``args``."""
    policies = dict(settings.policies)
    policies[name] = {**policies.get(name, {}), **args}
    return settings.model_copy(update={"policies": policies})


def _pool(result: Any) -> dict[str, Any]:
    pool: dict[str, Any] = next(iter(result.as_dict()["pools"].values()))
    return pool


def _run_fleet(
    trace: Path,
    window: Window,
    shape: str,
    seed: int,
    count: int,
    grow: bool,
    policies: list[str],
    keep_vms: float,
    warmup_s: float | None = None,
) -> list[dict[str, Any]]:
    base = load_settings(CONFIG)
    options = dict(window.options)
    settings = base.model_copy(update={"seed": seed, "hosts": _hosts(shape, count, grow)})
    if warmup_s is not None:
        metrics = dataclasses.replace(settings.metrics, warmup_s=warmup_s)
        settings = settings.model_copy(update={"metrics": metrics})
    true_exits: dict[tuple[str, str], float] | None = None
    results = []
    fitted: dict[str, hindsight.FittedModels] = {}
    for spec in policies:
        plain, in_hindsight = hindsight.split(spec)
        name, args = parse_variant(plain)
        variant = _with_variant(settings, name, args)
        opened = open_trace(trace, seed=seed, **options)
        events: Any = sample_vms(opened.events(), seed, keep_vms)
        if needs_true_lifetimes(name):
            if true_exits is None:
                true_exits = exit_times(
                    sample_vms(open_trace(trace, seed=seed, **options).events(), seed, keep_vms)
                )
            end = opened.end_time if opened.end_time is not None else math.inf
            events = with_true_lifetimes(events, true_exits, end)
        config = variant.engine_config(name, trace_has_hosts=opened.has_hosts)
        engine = Engine(config)
        if in_hindsight:
            hindsight.install(engine, fitted[plain])
        # Each replay from a settled heap, under the collector schedule
        # ``lavad replay`` sets (``tune_collector`` in ``run_unit``).
        heap.settle()
        result = replay(events, config, end_time=opened.end_time, engine=engine)
        if spec + hindsight.SUFFIX in policies:
            # Kept only for a hindsight variant of it: a model holds a window's tables.
            fitted[spec] = hindsight.fitted_models(engine)
        results.append(result)
    on_common_pool(results)
    rows = []
    for spec, result in zip(policies, results, strict=True):
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
    fleets: list[str],
    policies: list[str],
    scratch: str,
    keep_vms: float = 1.0,
    sources: Sources | None = None,
) -> list[dict[str, Any]]:
    """Every fleet of one (window, shape, seed): the grown pool first, for Best Fit's peak."""
    heap.tune_collector()  # in the worker process, which runs the replays
    window = WINDOWS[window_name]
    trace = trace_path(window_name, Path(scratch), sources)
    cells = []
    sources = sources or Sources()
    warmup_s = sources.warmup_s
    grown = _run_fleet(trace, window, shape, seed, 0, True, policies, keep_vms, warmup_s)
    peak = next(row["peak"] for row in grown if row["policy"] == policies[0])
    for fleet in fleets:
        if fleet == "grown":
            rows = grown
        else:
            headroom = float(fleet.removeprefix("fixed+").removesuffix("%")) / 100.0
            count = math.ceil(peak * (1.0 + headroom))
            rows = _run_fleet(
                trace, window, shape, seed, count, False, policies, keep_vms, warmup_s
            )
        cells.append(
            {
                "window": window_name,
                "shape": shape,
                "fleet": fleet,
                "seed": seed,
                "keep_vms": keep_vms,
            }
        )
        cells[-1]["rows"] = rows
        # Each cell's figures as it ends, so an interrupted matrix keeps them.
        figures = ", ".join(
            f"{row['policy']} {row['empty_pct']:.2f}% empty, CPU {row['stranded_cpu_pct']:.2f}%"
            f" mem {row['stranded_memory_pct']:.2f}% stranded"
            for row in rows
        )
        print(
            f"  {window_name} {shape} {fleet} seed {seed}: {figures}", file=sys.stderr, flush=True
        )
    return cells


def units(
    windows: list[str], shapes: list[str] | None, seeds: int, first_seed: int = 0
) -> Iterator[tuple[str, str, int]]:
    for name in windows:
        for shape in shapes if shapes and name.startswith("azure") else WINDOWS[name].shapes:
            for seed in range(first_seed, first_seed + seeds):
                yield name, shape, seed


def summarise(cells: list[dict[str, Any]], oracle: str) -> tuple[str, dict[str, Any]]:
    """Per condition (window, shape, fleet): each policy's mean and range over seeds."""
    conditions: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for cell in cells:
        conditions.setdefault((cell["window"], cell["shape"], cell["fleet"]), []).append(cell)
    policies = [row["policy"] for row in cells[0]["rows"]]
    baseline = policies[0]
    lines = [
        f"pp over {baseline}: mean [min, max] over seeds; share of {oracle}'s mean gain; "
        "stranded CPU / memory in pp over " + baseline,
        "",
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
                policy, {"share": math.inf, "share_at": "", "strand": -math.inf, "strand_at": ""}
            )
            # Cells where the oracle gains under 0.5 pp cannot show a share.
            if gain > 0.5 and share < entry["share"]:
                entry["share"], entry["share_at"] = share, f"{window} {shape} {fleet}"
            if max(cpu, mem) > entry["strand"]:
                entry["strand"], entry["strand_at"] = max(cpu, mem), f"{window} {shape} {fleet}"
    lines += ["", "| policy | worst share (where) | worst strand pp (where) |", "|---|---|---|"]
    for policy in policies:
        entry = worst[policy]
        share = "-" if math.isinf(entry["share"]) else f"{100 * entry['share']:.0f}%"
        lines.append(
            f"| {policy} | {share} ({entry['share_at']}) | "
            f"{entry['strand']:+.2f} ({entry['strand_at']}) |"
        )
    return "\n".join(lines), worst


def _shape(raw: str) -> str:
    """``cores/memory[/gpus[/disk]]`` as the host settings accept it, or the reason not."""
    want = "want cores/memory[/gpus[/disk]] with cores and memory above 0"
    parts = raw.split("/")
    if not 2 <= len(parts) <= 4:
        raise argparse.ArgumentTypeError(f"{want}, got {raw!r}")
    try:
        _hosts(raw, 0, True)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise argparse.ArgumentTypeError(f"{want}, got {raw!r}: {where}: {error['msg']}") from None
    except ValueError:  # a part that is not a number
        raise argparse.ArgumentTypeError(f"{want}, got {raw!r}") from None
    return raw


def check_variant(spec: str) -> None:
    """Raise ConfigError or ValueError, naming the key, for a variant no replay would take:
    checked before any worker starts, not as a traceback from the first cell."""
    plain, _ = hindsight.split(spec)
    name, args = parse_variant(plain)
    _with_variant(load_settings(CONFIG), name, args).engine_config(name, trace_has_hosts=False)


def check_sources(sources: Sources, windows: list[str]) -> None:
    """Raise TraceFormatError, naming the folder, for a window whose trace is not there:
    checked before any worker starts, not as a traceback from the first cell."""
    for window in windows:
        folder = sources.folder(window)
        if not folder.is_dir():
            raise TraceFormatError(folder, f"window {window} reads this folder: not found")
        if window.startswith("azure"):
            sources.azure_trace()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--window", action="append", choices=sorted(WINDOWS))
    parser.add_argument(
        "--shape", action="append", type=_shape, help="Azure shapes cores/memory (default all)"
    )
    parser.add_argument("--fleet", action="append", choices=FLEETS)
    parser.add_argument("--seeds", type=at_least_one, default=3)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1"
    )
    parser.add_argument("--policy", action="append", help="variants; the first is the baseline")
    parser.add_argument("--oracle", default=PAPER_ORACLE)
    parser.add_argument("--jobs", type=at_least_one, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--keep-vms",
        type=float,
        default=1.0,
        help="replay a seeded share of the VMs (0 < share <= 1; default all)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=SHARED,
        help="the folder of traces, laid out as ../shared/data (azure-v1-vms, alibaba-openb, "
        "alibaba-dlrm): e.g. held-back traces of the same kinds (default: ../shared/data)",
    )
    parser.add_argument(
        "--warmup-s",
        type=at_least_zero,
        help="override [metrics] warmup_s (a day): event time after a window's first event "
        "left out of its figures, for windows shorter than the configuration's",
    )
    parser.add_argument(
        "--azure-split",
        help="the Azure V1 split whose halves are the Azure windows, v1.<split>.txt "
        "(default: the folder's only split)",
    )
    ns = parser.parse_args(argv)
    if not 0.0 < ns.keep_vms <= 1.0:
        parser.error(f"--keep-vms must be in (0, 1], got {ns.keep_vms}")
    policies = ns.policy or list(DEFAULT_POLICIES)
    hindsight.check_order(policies)
    for spec in (*policies, ns.oracle):
        try:
            check_variant(spec)
        except (ConfigError, ValueError) as exc:
            parser.error(f"{spec!r}: {exc}")
    if not ns.data.is_dir():
        sys.exit(f"the placement matrix needs the real traces in {ns.data}: not found")
    sources = Sources(ns.data, ns.azure_split, ns.warmup_s)
    windows = ns.window or list(WINDOWS)
    try:
        check_sources(sources, windows)
    except TraceFormatError as exc:
        sys.exit(f"the placement matrix cannot read its traces: {exc}")
    fleets = ns.fleet or list(FLEETS)
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch, ProcessPoolExecutor(ns.jobs) as pool:
        futures = [
            pool.submit(run_unit, w, s, seed, fleets, policies, scratch, ns.keep_vms, sources)
            for w, s, seed in units(windows, ns.shape, ns.seeds, ns.first_seed)
        ]
        try:
            for future in futures:
                cells.extend(future.result())
        except EmptyWindow as exc:
            for future in futures:
                future.cancel()
            sys.exit(f"the placement matrix has no figure to compare: {exc}")
    table, _ = summarise(cells, ns.oracle)
    print(table)
    if ns.json is not None:
        ns.json.write_bytes(orjson.dumps(cells, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
