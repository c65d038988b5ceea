"""LARS against the baseline migration orders on a replayed trace (LAVA paper, section 6.3).

Two measurements, both on a fixed pool (a trace without hosts gets
``hosts`` of the configured shape, by default the peak a growing Best Fit
pool needed plus ``headroom``: a defragmenter needs room to move VMs to):

* **Same drains** (the paper's section 5.1 protocol). One replay in which
  the defragmentation trigger drains hosts and the arrival order acts,
  while every compared order (``COMPARED``) runs beside it on the same
  drains and the same exits (``core/migrations/shadow.py``): the drains
  are fixed and only the order changes, as in the paper ("LARS does not
  affect which hosts are picked"). Counted: migrations, VMs that exited
  before their turn, and the reduction against each baseline order.
* **Closed loop**. A replay per acting order (arrival, LARS with the
  policy's lifetimes, LARS with true lifetimes), each with its own trigger:
  drains, migrations per drained host, hosts emptied, and the mean share of
  empty hosts against a replay without drains.

Unless given, the defragmentation threshold is the ``quantile`` of the
undrained replay's sampled empty-host share: the trigger then fires on any
trace, in its tighter periods. With ``rolling`` the drains are rolling
maintenance instead (a batch of hosts at a time, round the pool): more VMs
wait in the queue at once, the regime of the paper's maintenance drains.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lavad.core.engine import EngineConfig
from lavad.core.migrations.config import (
    DefragConfig,
    LifetimeSource,
    OrderName,
    RollingConfig,
)
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.replay import ReplayResult, replay
from lavad.streams.codec import BadRecord
from lavad.streams.schema import Event

EventSource = Callable[[], Iterable[Event | BadRecord]]

# Orders counted on the same drains: the baselines, then LARS.
COMPARED: tuple[tuple[OrderName, LifetimeSource], ...] = (
    ("arrival", "policy"),
    ("random", "policy"),
    ("shortest", "policy"),
    ("lars", "policy"),
    ("lars", "oracle"),
)
BASELINES = ("arrival-policy", "random-policy", "shortest-policy")
# Acting orders of the closed-loop replays: (label, order, lifetimes).
ACTING: tuple[tuple[str, OrderName, LifetimeSource], ...] = (
    ("arrival", "arrival", "policy"),
    ("lars", "lars", "policy"),
    ("lars-oracle", "lars", "oracle"),
)


@dataclass(frozen=True, slots=True)
class SameDrains:
    """One order on the drains of the recording replay.

    ``needed``: the migrations performed plus the VMs still queued when the
    recording ends. Those were still running, and the recording cannot tell
    whether they would have exited before their turn, so each counts as a
    migration: the paper's simulator ran its list of migrations to the end.
    It is the conservative count for LARS, which leaves the VMs it expects
    to exit soonest in the queue.
    """

    label: str
    scheduled: int
    migrations: int
    exited_before_migration: int
    still_queued: int

    @property
    def needed(self) -> int:
        return self.migrations + self.still_queued


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """One acting order with its own trigger.

    Its drains differ from the other runs', so ``needed_per_scheduled``
    (migrations plus VMs still queued at the end, per VM scheduled) is the
    figure to compare.
    """

    label: str
    drains: int
    scheduled: int
    migrations: int
    exited_before_migration: int
    still_queued: int
    hosts_ready: int
    migrations_per_drained_host: float | None
    empty_hosts_pct: float | None
    refused: int
    wall_s: float

    @property
    def needed_per_scheduled(self) -> float | None:
        needed = self.migrations + self.still_queued
        return needed / self.scheduled if self.scheduled else None


@dataclass(slots=True)
class MigrationEvaluation:
    trace: str
    pool: str
    policy: str
    hosts: int
    empty_below: float
    # What drained the hosts, in words.
    scenario: str
    baseline_empty_hosts_pct: float | None
    baseline_refused: int
    drains: int
    same_drains: list[SameDrains] = field(default_factory=list)
    closed_loop: list[ClosedLoop] = field(default_factory=list)

    def needed(self, label: str) -> int:
        return next(r.needed for r in self.same_drains if r.label == label)

    def reduction(self, label: str, baseline: str) -> float | None:
        """Fewer migrations needed than ``baseline`` on the same drains, as a fraction of its."""
        base = self.needed(baseline)
        return (base - self.needed(label)) / base if base else None


def _only_pool(result: ReplayResult) -> tuple[str, dict[str, Any]]:
    if len(result.pools) != 1:
        raise ValueError(
            f"the migration evaluation takes a one-pool trace, got pools {sorted(result.pools)}"
        )
    return next(iter(result.pools.items()))


def _refused(pool: dict[str, Any]) -> int:
    return int(pool.get("unfit_retryable", 0)) + int(pool.get("unfit_final", 0))


@dataclass(frozen=True)
class DrainSettings:
    """When the defragmentation drains, and how many hosts at once.

    ``empty_below`` None: the ``quantile`` of the undrained replay's empty-host
    share (the module doc).
    """

    empty_below: float | None = None
    quantile: float = 0.2
    check_interval_s: float = 300.0
    max_draining_hosts: int = 2


def evaluate_migrations(
    events: EventSource,
    base: EngineConfig,
    *,
    trace: str,
    end_time: float | None,
    trace_has_hosts: bool,
    hosts: int | None = None,
    headroom: float = 0.05,
    drain: DrainSettings = DrainSettings(),
    closed_loop: bool = True,
    rolling: RollingConfig | None = None,
    progress: Callable[[str], None] | None = None,
) -> MigrationEvaluation:
    """The protocol of the module doc. ``events`` must yield requests with true lifetimes."""

    def run(label: str, config: EngineConfig) -> ReplayResult:
        if progress is not None:
            progress(label)
        return replay(events(), config, end_time=end_time)

    config = base
    if not trace_has_hosts:
        if base.pools.shape is None:
            raise ValueError("a trace without hosts needs a host shape ([hosts] in the settings)")
        if hosts is None:
            sizing = dataclasses.replace(
                base,
                policy="bestfit",
                policy_args=validate_policy_args("bestfit", {}),
                pool_policies=(),
                # The settings' bounds (hosts, VMs a host) kept.
                pools=dataclasses.replace(base.pools, initial_hosts=0, grow_on_demand=True),
            )
            _, pool = _only_pool(run("sizing (bestfit, growing pool)", sizing))
            hosts = math.ceil(int(pool["hosts_used_peak"]) * (1.0 + headroom))
        config = dataclasses.replace(
            config,
            pools=dataclasses.replace(base.pools, initial_hosts=hosts, grow_on_demand=False),
        )
    migrations = dataclasses.replace(config.migrations, defrag=DefragConfig(), compare=())
    baseline = run("no drains", dataclasses.replace(config, migrations=migrations))
    pool_name, baseline_pool = _only_pool(baseline)
    empty_below = drain.empty_below
    if rolling is not None:
        empty_below = 0.0
    elif empty_below is None:
        shares = [p["empty_hosts_pct"] for p in baseline.series.get(pool_name, [])]
        if not shares:
            raise ValueError("the replay sampled no empty-host share; is the trace too short?")
        empty_below = float(np.quantile(np.asarray(shares), drain.quantile)) / 100.0
    defrag = (
        DefragConfig()
        if rolling is not None
        else DefragConfig(
            empty_below=empty_below,
            check_interval_s=drain.check_interval_s,
            max_draining_hosts=drain.max_draining_hosts,
        )
    )
    evaluation = MigrationEvaluation(
        trace=trace,
        pool=pool_name,
        policy=base.policy,
        hosts=int(baseline_pool["hosts_up_end"]),
        empty_below=empty_below,
        scenario=(
            f"rolling maintenance, {rolling.batch} hosts every {rolling.every_s / 3600:g} h"
            if rolling is not None
            else f"defragmentation below {empty_below:.1%} empty hosts,"
            f" at most {drain.max_draining_hosts} hosts draining"
        ),
        baseline_empty_hosts_pct=baseline_pool.get("empty_hosts_pct"),
        baseline_refused=_refused(baseline_pool),
        drains=0,
    )
    for label, order, lifetimes in ACTING if closed_loop else ACTING[:1]:
        acting = dataclasses.replace(
            migrations,
            order=order,
            lifetimes=lifetimes,
            defrag=defrag,
            rolling=rolling,
            # The arrival replay is also the same-drains one.
            compare=COMPARED if label == "arrival" else (),
        )
        result = run(label, dataclasses.replace(config, migrations=acting))
        _, pool = _only_pool(result)
        summary = pool.get("migrations") or {}
        evaluation.closed_loop.append(
            ClosedLoop(
                label=label,
                drains=int(summary.get("drains", 0)),
                scheduled=int(summary.get("scheduled", 0)),
                migrations=int(summary.get("migrations", 0)),
                exited_before_migration=int(summary.get("exited_before_migration", 0)),
                still_queued=int(summary.get("still_queued", 0)),
                hosts_ready=int(summary.get("hosts_ready", 0)),
                migrations_per_drained_host=summary.get("migrations_per_drained_host"),
                empty_hosts_pct=pool.get("empty_hosts_pct"),
                refused=_refused(pool),
                wall_s=result.wall_seconds,
            )
        )
        if label == "arrival":
            evaluation.drains = int(summary.get("drains", 0))
            for name, compared in summary.get("compared", {}).items():
                evaluation.same_drains.append(
                    SameDrains(
                        label=name,
                        scheduled=int(compared["scheduled"]),
                        migrations=int(compared["migrations"]),
                        exited_before_migration=int(compared["exited_before_migration"]),
                        still_queued=int(compared["still_queued"]),
                    )
                )
    return evaluation
