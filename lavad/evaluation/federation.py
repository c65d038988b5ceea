"""The federation study (Megha's section VI): allocation time and utilisation of a
centralized scheduler, Megha federations and Sparrow on one trace, and fair shares
under contention. The protocol; ``federation_cli`` reads the trace and prints.

Configurations are named: ``centralized`` (1 global scheduler, 1 pool), ``megha-PxG``
(P pools, G global schedulers: each pool cut into G partitions), ``sparrow`` (random
probing, 2 probes per task, late binding). Jobs go to tenant queues round-robin
(``tenants``, default 10), each queue on scheduler ``tenant % G``, so every
configuration serves the same queues.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lavad.daemon.plotting import pyplot
from lavad.federation.fairness import Shares
from lavad.federation.messages import Task
from lavad.federation.simulator import (
    FederationResult,
    FederationSetup,
    FederationSimulator,
    tasks_of,
)
from lavad.federation.sparrow import simulate_sparrow
from lavad.federation.timing import TimingModel
from lavad.federation.topology import uniform_topology
from lavad.federation.trace import Job

_MEGHA = re.compile(r"^megha-(\d+)x(\d+)$")
CONFIG_HELP = "centralized, megha-PxG (P pools, G global schedulers), sparrow"


@dataclass(frozen=True, slots=True)
class Configuration:
    name: str
    pools: int  # 0 for sparrow
    schedulers: int  # 0 for sparrow


def parse_configuration(name: str) -> Configuration:
    """A configuration by name; ``ValueError`` naming what is wrong."""
    if name == "centralized":
        return Configuration(name, 1, 1)
    if name == "sparrow":
        return Configuration(name, 0, 0)
    match = _MEGHA.match(name)
    if match is None:
        raise ValueError(f"unknown configuration {name!r}: want {CONFIG_HELP}")
    pools, schedulers = int(match.group(1)), int(match.group(2))
    if not 1 <= pools <= 1000 or not 1 <= schedulers <= 1000:
        raise ValueError(f"{name}: pools and schedulers must be in 1..1000")
    return Configuration(name, pools, schedulers)


def run_configuration(
    config: Configuration,
    jobs: list[Job],
    workers: int,
    *,
    slots: int = 1,
    tenants: int = 10,
    timing: TimingModel | None = None,
    seed: int = 0,
    max_events: int = 200_000_000,
) -> FederationResult:
    timing = timing if timing is not None else TimingModel()
    tasks = tasks_of(jobs, tenants, (1,))
    if config.name == "sparrow":
        return simulate_sparrow(
            tasks,
            workers,
            slots_per_worker=slots,
            network_delay_s=timing.network_delay_s,
            seed=seed,
            max_events=max_events,
        )
    if workers % config.pools:
        raise ValueError(f"{config.name}: {workers} workers do not split into {config.pools} pools")
    topology = uniform_topology(
        config.pools, workers // config.pools, config.schedulers, host_capacity=(slots,)
    )
    setup = FederationSetup(topology, tuple(t % config.schedulers for t in range(tenants)))
    return FederationSimulator(setup, timing, max_events=max_events).run(tasks)


# -- fairness -------------------------------------------------------------------------------

PAPER_SHARES = (0.10, 0.25, 0.15, 0.50)
PAPER_QUEUES = (0, 1, 1, 2)  # tenant 1 -> GM 1, tenants 2 and 3 -> GM 2, tenant 4 -> GM 3


@dataclass
class FairnessFigures:
    shares: tuple[float, ...]
    workers: int
    pools: int
    times: list[float]
    rows: list[list[float]]  # share per tenant at each time
    rows_unfair: list[list[float]]  # the same without fair shares
    times_unfair: list[float]
    figures: dict[str, Any]
    figures_unfair: dict[str, Any]
    table: list[dict[str, float]] = field(default_factory=list)
    contended_samples: int = 0
    contended_samples_unfair: int = 0


def _contended_means(
    rows: list[list[float]], backlog: list[list[int]], tenants: int, threshold: float
) -> tuple[list[float], int]:
    """Each tenant's mean share over the samples under contention: the cluster full (at
    least ``threshold`` held) and every tenant with tasks waiting."""
    array = np.asarray(rows, dtype=np.float64).reshape(-1, tenants)
    waiting = np.asarray(backlog, dtype=np.int64).reshape(-1, tenants)
    full = (array.sum(axis=1) >= threshold) & (waiting > 0).all(axis=1)
    if not full.any():
        return [float("nan")] * tenants, 0
    return [float(v) for v in array[full].mean(axis=0)], int(full.sum())


def fairness_study(
    jobs: list[Job],
    *,
    workers: int = 200,
    pools: int = 4,
    shares: tuple[float, ...] = PAPER_SHARES,
    queues: tuple[int, ...] = PAPER_QUEUES,
    sample_s: float = 60.0,
    timing: TimingModel | None = None,
    max_events: int = 200_000_000,
) -> FairnessFigures:
    """Replay ``jobs`` with and without fair shares; task ``i`` goes to tenant ``i % 4``, so
    all four stay backlogged while the cluster is full (contention, where Algorithm 2 acts)."""
    timing = timing if timing is not None else TimingModel()
    tenants = len(shares)
    schedulers = max(queues) + 1
    if workers % pools:
        raise ValueError(f"{workers} workers do not split into {pools} pools")
    topology = uniform_topology(pools, workers // pools, schedulers)
    tasks: list[Task] = tasks_of(jobs, tenants, (1,), by="task")
    fair = FederationSetup(topology, queues, Shares(shares), share_sample_s=sample_s)
    unfair = FederationSetup(topology, queues, None, share_sample_s=sample_s)
    with_shares = FederationSimulator(fair, timing, max_events=max_events).run(tasks)
    without = FederationSimulator(unfair, timing, max_events=max_events).run(tasks)
    full = 0.95
    mean_fair, n_fair = _contended_means(
        with_shares.share_rows, with_shares.backlog_rows, tenants, full
    )
    mean_unfair, n_unfair = _contended_means(
        without.share_rows, without.backlog_rows, tenants, full
    )
    per_tenant_starts = np.bincount(
        np.asarray(with_shares.allocation.tenant, dtype=np.int64), minlength=tenants
    )
    table = [
        {
            "tenant": t + 1,
            "share": shares[t],
            "scheduler": queues[t] + 1,
            "mean_share_contended": mean_fair[t],
            "mean_share_contended_no_fairness": mean_unfair[t],
            "starts": int(per_tenant_starts[t]),
        }
        for t in range(tenants)
    ]
    return FairnessFigures(
        shares=shares,
        workers=workers,
        pools=pools,
        times=with_shares.share_times,
        rows=with_shares.share_rows,
        rows_unfair=without.share_rows,
        times_unfair=without.share_times,
        figures=with_shares.figures(),
        figures_unfair=without.figures(),
        table=table,
        contended_samples=n_fair,
        contended_samples_unfair=n_unfair,
    )


def plot_fairness(study: FairnessFigures, png: Path) -> None:
    """Each tenant's share over time, with fair shares and without; dashed: configured."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    panels = [
        (axes[0], study.times, study.rows, "fair shares (Algorithm 2)"),
        (axes[1], study.times_unfair, study.rows_unfair, "no fair shares"),
    ]
    for ax, times, rows, title in panels:
        if not rows:
            continue
        t0 = times[0]
        hours = (np.asarray(times) - t0) / 3600.0
        array = np.asarray(rows)
        for tenant, share in enumerate(study.shares):
            (line,) = ax.plot(hours, array[:, tenant], lw=1, label=f"tenant {tenant + 1}")
            ax.axhline(share, color=line.get_color(), ls="--", lw=0.8)
        ax.set_title(title)
        ax.set_xlabel("hours from the first arrival")
    axes[0].set_ylabel("share of the cluster held")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{study.workers} workers, {study.pools} pools; dashed: configured shares")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
