"""The migration planner of one pool: drains, the pool-wide queue, slots and plans.

A drain (maintenance event or the defragmentation trigger) marks its host
closed to placement and queues every VM on it. Whenever a migration slot is
free (at most ``max_concurrent`` in flight), the order (``orders.py``) ranks
the whole queue and the first VM the placement policy finds a target for
starts moving. The move books the VM on its target at once (its resources
are taken there for the whole migration) and the slot stays busy for
``duration_s``; the source host counts as busy until then too, so a drained
host is only "ready" once it has no VM and no migration out of it in flight.
A queued VM that exits before its turn is simply dropped: one migration
fewer, which is what LARS is after.

What the paper leaves open, and what we chose:

* A VM exiting while it is being migrated still holds its slot until the
  migration's time is up: the paper's simulation keeps both hosts busy for a
  fixed 20 minutes.
* When no queued VM fits anywhere, the planner looks again ``retry_s`` later
  (and at every freed slot): "unfit, may retry", never a lost VM.
* A defragmented host is back in service the moment it is ready; a host in
  maintenance stays closed until a host.up event says the work is done.
* A relieved host (``[migrations.relief]``, GPA pools only) queues only the
  VMs the relief chose (``relief.py``: the fewest, largest excess first)
  and is closed to placement until they are gone, then back in service with
  the VMs that stayed. Its targets are the placement policy's, whose GPA
  fit test reads the same method and margin as the relief. A maintenance
  drain of a relieved host queues the rest of its VMs.

The planner never reads a clock: every entry point takes ``now``, and the
engine fires its timers (``next_deadline``) at their own times, so a replay
and the live daemon plan the same migrations.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import numpy as np

from lavad.core.cluster import ClusterState, HostState, VmRecord
from lavad.core.migrations.config import MigrationsConfig
from lavad.core.migrations.lifetimes import RemainingLifetimes
from lavad.core.migrations.orders import Queued, build_order
from lavad.core.migrations.relief import (
    drift_broken_hosts,
    enable_host_drift,
    plan_host_relief,
)
from lavad.core.migrations.shadow import ShadowOrder
from lavad.core.migrations.triggers import (
    DrainTrigger,
    EmptyShareTrigger,
    NoTrigger,
    RecordedDrains,
    RollingDrains,
)
from lavad.core.placement.framework import UniformDraws
from lavad.core.placement.gpa import UsageHooks
from lavad.streams.ids import migration_id
from lavad.streams.schema import Migration, VmPlaced, VmRequest

# A plain int: numpy compares an IntEnum member by asking it for array
# attributes first (three Enum __getattr__ misses a booking).
_DRAINING = int(HostState.DRAINING)

DrainReason = Literal["defragmentation", "maintenance", "relief"]
DRAIN_REASONS: Final[tuple[DrainReason, ...]] = ("defragmentation", "maintenance", "relief")
# The latest drains a summary lists. A daemon drains hosts for months, and the
# log is kept in every snapshot; a thousand holds a month of the rolling
# maintenance the migrations evaluation runs (5 hosts every 6 h: 600 drains).
DRAIN_LOG_KEPT: Final = 1_000


class MigrationMover(Protocol):
    """What the engine does for the planner: choose a target, move a VM.

    Passed in on every call rather than kept, so a planner snapshots (state_codec)
    without the engine.
    """

    def target(self, record: VmRecord, now: float) -> int | None:
        """The host the placement policy picks for the running VM (None: none fits)."""

    def move(self, record: VmRecord, target: int, now: float) -> None:
        """Book the VM on ``target`` and off its host, telling every hook."""


@dataclass(slots=True)
class Drain:
    host: int
    reason: DrainReason
    # Back in service once empty: defragmentation and rolling maintenance;
    # a host.drain (maintenance) waits for its host.up.
    returns: bool
    started: float
    scheduled: int
    queued: int = 0
    in_flight: int = 0
    migrated: int = 0
    exited: int = 0


class MigrationPlanner:
    # Relief state (class defaults: a planner restored from a snapshot taken
    # before relief existed reads as relief off).
    usage_hooks: UsageHooks | None = None
    relief_at = float("inf")

    def __init__(
        self,
        pool: str,
        config: MigrationsConfig,
        lifetimes: RemainingLifetimes,
        rng: np.random.Generator,
        shadows: list[ShadowOrder] | None = None,
        usage_hooks: UsageHooks | None = None,
    ) -> None:
        self.pool = pool
        self.config = config
        self.lifetimes = lifetimes
        self.order = build_order(config.order, UniformDraws(rng))
        self.shadows = shadows or []
        # Every distinct lifetime source that learns from bookings, each fed once.
        self._sources: list[RemainingLifetimes] = []
        for source in [lifetimes, *(shadow.lifetimes for shadow in self.shadows)]:
            if source.fed and all(source is not known for known in self._sources):
                self._sources.append(source)
        self.trigger: DrainTrigger
        if config.drain_schedule is not None:
            self.trigger = RecordedDrains(config.drain_schedule)
        elif config.rolling is not None:
            self.trigger = RollingDrains(config.rolling)
        elif config.defrag.empty_below > 0:
            self.trigger = EmptyShareTrigger(config.defrag)
        else:
            self.trigger = NoTrigger()
        # The GPA hooks whose scored windows say which hosts need relief.
        if config.relief.enabled:
            if usage_hooks is None:
                raise ValueError(
                    "migrations.relief.enabled: relief needs a pool placed by gpa"
                    " (its hooks score each host's windows)"
                )
            usage_hooks.enable_relief(config.relief)
            enable_host_drift(usage_hooks, config.relief)
            self.usage_hooks = usage_hooks
            self.relief_at = float("-inf")
        self.queue: dict[str, Queued] = {}
        self.drains: dict[int, Drain] = {}
        # (finish, sequence, vm id, source, target): a heap of migrations in flight.
        self.in_flight: list[tuple[float, int, str, int, int]] = []
        self.retry_at = float("inf")
        self._sequence = 0
        self._decisions = 0
        self.counters: Counter[str] = Counter()
        # The latest drains that started: (time, host id, reason), at most
        # ``DRAIN_LOG_KEPT`` of them (``_log_drain``); the counters count all.
        self.drain_log: list[tuple[float, str, str]] = []
        # The earliest time ``advance`` has work to do (inf: none).
        self.next_deadline = float("inf")
        self._refresh_deadline()

    # ---------------------------------------------------------------- timers

    def _refresh_deadline(self) -> None:
        """Recompute ``next_deadline``: the engine reads it on every event, and
        only ``advance`` and ``drain`` move a timer."""
        first = self.in_flight[0][0] if self.in_flight else self.retry_at
        for shadow in self.shadows:
            first = min(first, shadow.next_deadline)
        self.next_deadline = min(first, self.trigger.next_check, self.retry_at, self.relief_at)

    def advance(self, cluster: ClusterState, now: float, mover: MigrationMover) -> list[Migration]:
        """Fire the timers due by ``now`` (the engine calls it at each timer's own time)."""
        out: list[Migration] = []
        for shadow in self.shadows:
            if shadow.next_deadline <= now:
                shadow.advance(cluster, now)
        while self.in_flight and self.in_flight[0][0] <= now:
            _, _, _, source, _ = heapq.heappop(self.in_flight)
            drain = self.drains.get(source)
            if drain is not None:
                drain.in_flight -= 1
                out.extend(self._ready_if_empty(cluster, drain, now))
        if self.trigger.next_check <= now:
            draining = sum(1 for d in self.drains.values() if d.reason == "defragmentation")
            reason: DrainReason = (
                "maintenance" if isinstance(self.trigger, RollingDrains) else "defragmentation"
            )
            for host in self.trigger.due(cluster, now, draining):
                cluster.drain_host(cluster.host_ids[host])
                out.extend(self._start_drain(cluster, host, now, reason, returns=True))
        if self.relief_at <= now:
            out.extend(self._relieve(cluster, now))
        if self.retry_at <= now:
            self.retry_at = float("inf")
        out.extend(self._dispatch(cluster, now, mover))
        self._refresh_deadline()
        return out

    # ------------------------------------------------------------ entry points

    def drain(
        self, cluster: ClusterState, host: int, now: float, mover: MigrationMover
    ) -> list[Migration]:
        """A maintenance drain (the host is already closed to placement)."""
        drain = self.drains.get(host)
        if drain is not None:
            # Already draining (defragmentation, relief): it now stays closed when empty.
            if drain.reason == "relief":
                queued = {q.vm_id for q in self.queue.values() if q.host == host}
                for vm_id in sorted(
                    cluster.host_vms[host], key=lambda vm: (cluster.vms[vm].placed_at, vm)
                ):
                    if vm_id not in queued:
                        self._enqueue(vm_id, drain)
                        drain.scheduled += 1
                        self.counters["scheduled"] += 1
            drain.reason, drain.returns = "maintenance", False
            self.counters["drain_of_draining_host"] += 1
            out = self._dispatch(cluster, now, mover)
            self._refresh_deadline()
            return out
        out = self._start_drain(cluster, host, now, "maintenance", returns=False)
        out.extend(self._dispatch(cluster, now, mover))
        self._refresh_deadline()
        return out

    def on_vm_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: VmRequest | VmPlaced
    ) -> list[Migration]:
        """A VM was booked. One booked onto a draining host (by another scheduler,
        in shadow mode) joins the queue."""
        for source in self._sources:
            source.on_booked(cluster, record, now, event)
        host = record.host
        if cluster.state[host] != _DRAINING:
            return []
        self.counters["booked_on_draining_host"] += 1
        drain = self.drains.get(host)
        if drain is None:
            # Emptied and closed for maintenance: it drains again.
            out = self._start_drain(cluster, host, now, "maintenance", returns=False)
        else:
            self._enqueue(record.vm_id, drain)
            out = [self._plan(cluster, drain, now, f"{record.vm_id} was placed on the host")]
        # A free slot takes it at once: the engine's next look at the timers.
        self.retry_at = min(self.retry_at, now)
        self._refresh_deadline()
        return out

    def on_vm_moved(
        self, cluster: ClusterState, before: VmRecord, after: VmRecord, now: float
    ) -> None:
        for source in self._sources:
            source.on_moved(cluster, before, after, now)

    def on_vm_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> list[Migration]:
        """A VM left its host: it ``exited``, or was evicted (its host went down).

        A queued VM that exited will never be migrated; an evicted one leaves
        the queue uncounted.
        """
        for source in self._sources:
            source.on_released(cluster, record, now, exited=exited)
        vm_id = record.vm_id
        for shadow in self.shadows:
            shadow.on_released(vm_id, exited=exited)
        if not self.queue:
            return []
        if not exited:
            queued = self.queue.pop(vm_id, None)
            if queued is not None:
                self.drains[queued.host].queued -= 1
            return []
        queued = self.queue.pop(vm_id, None)
        if queued is None:
            return []
        drain = self.drains[queued.host]
        drain.queued -= 1
        drain.exited += 1
        self.counters["exited_before_migration"] += 1
        out = [self._plan(cluster, drain, now, f"{record.vm_id} exited before its turn")]
        out.extend(self._ready_if_empty(cluster, drain, now))
        return out

    def forget_host(self, host: int) -> None:
        """The host went down or came back from maintenance: its drain ends here.

        Its queued VMs leave the queue uncounted (evicted, or staying put).
        """
        for shadow in self.shadows:
            shadow.forget_host(host)
        drain = self.drains.pop(host, None)
        if drain is None:
            return
        self.counters["drains_ended_early"] += 1
        for vm_id in [q.vm_id for q in self.queue.values() if q.host == host]:
            del self.queue[vm_id]

    # -------------------------------------------------------------- internals

    def _start_drain(
        self,
        cluster: ClusterState,
        host: int,
        now: float,
        reason: DrainReason,
        *,
        returns: bool,
    ) -> list[Migration]:
        residents = sorted(cluster.host_vms[host], key=lambda vm: (cluster.vms[vm].placed_at, vm))
        drain = Drain(host, reason, returns, now, scheduled=len(residents))
        self.drains[host] = drain
        for vm_id in residents:
            self._enqueue(vm_id, drain)
        self.counters[f"drains.{reason}"] += 1
        self.counters["scheduled"] += len(residents)
        self._log_drain(now, cluster.host_ids[host], reason)
        for shadow in self.shadows:
            shadow.on_drain(cluster, host, residents, now)
        out = [self._plan(cluster, drain, now, f"{reason}: drain started")]
        out.extend(self._ready_if_empty(cluster, drain, now))
        return out

    def _relieve(self, cluster: ClusterState, now: float) -> list[Migration]:
        """Start a relief on each host the GPA hooks find due (bounded: those hosts only)."""
        hooks = self.usage_hooks
        relief = self.config.relief
        self.relief_at = now + relief.check_interval_s
        if hooks is None:
            return []
        out: list[Migration] = []
        # Hosts whose VM changed regime and now fail the fit test go too,
        # before their overflows reject rho.
        for host in sorted({*hooks.relief_due(), *drift_broken_hosts(hooks, cluster)}):
            if host in self.drains or not cluster.schedulable[host]:
                continue
            moves = plan_host_relief(hooks, cluster, host, relief.max_moves)
            movers = [vm_id for vm_id, target in moves if target is not None]
            if len(movers) < len(moves):
                self.counters["relief_without_target"] += len(moves) - len(movers)
            if not movers:
                continue
            cluster.drain_host(cluster.host_ids[host])
            drain = Drain(host, "relief", True, now, scheduled=len(movers))
            self.drains[host] = drain
            for vm_id in movers:
                self._enqueue(vm_id, drain)
            self.counters["drains.relief"] += 1
            self.counters["scheduled"] += len(movers)
            self._log_drain(now, cluster.host_ids[host], "relief")
            out.append(
                self._plan(
                    cluster,
                    drain,
                    now,
                    f"relief: {len(movers)} of {int(cluster.vm_count[host])} VMs leave"
                    " (realised overflows reject rho)",
                )
            )
        return out

    def _enqueue(self, vm_id: str, drain: Drain) -> None:
        self._sequence += 1
        self.queue[vm_id] = Queued(vm_id, drain.host, self._sequence)
        drain.queued += 1

    def _remaining(self, cluster: ClusterState, now: float) -> dict[str, float]:
        lifetimes = self.lifetimes
        return {vm: lifetimes.remaining(cluster, vm, now) for vm in self.queue}

    def _dispatch(
        self, cluster: ClusterState, now: float, mover: MigrationMover
    ) -> list[Migration]:
        free = self.config.max_concurrent - len(self.in_flight)
        if free <= 0 or not self.queue:
            return []
        remaining = self._remaining(cluster, now)
        ranked = self.order.rank(list(self.queue.values()), remaining.__getitem__)
        out: list[Migration] = []
        for queued in ranked:
            if free == 0:
                break
            record = cluster.vms[queued.vm_id]
            target = mover.target(record, now)
            if target is None:
                self.counters["no_target"] += 1
                continue
            out.append(self._migrate(cluster, queued, record, target, now, remaining, mover))
            free -= 1
        if free and self.queue:
            # Nothing left fits now: look again later ("unfit, may retry").
            self.retry_at = min(self.retry_at, now + self.config.retry_s)
        return out

    def _migrate(
        self,
        cluster: ClusterState,
        queued: Queued,
        record: VmRecord,
        target: int,
        now: float,
        remaining: dict[str, float],
        mover: MigrationMover,
    ) -> Migration:
        del self.queue[queued.vm_id]
        drain = self.drains[queued.host]
        drain.queued -= 1
        drain.in_flight += 1
        drain.migrated += 1
        self.counters["migrations"] += 1
        until = now + self.config.duration_s
        self._sequence += 1
        heapq.heappush(self.in_flight, (until, self._sequence, queued.vm_id, queued.host, target))
        mover.move(record, target, now)
        return self._decision(
            cluster,
            drain,
            now,
            "migrate",
            f"{self.order.name}: next of {len(remaining)} queued",
            vm_id=queued.vm_id,
            target_host_id=cluster.host_ids[target],
            explanation={
                "predicted_remaining_s": (
                    remaining[queued.vm_id] if self.lifetimes.known else None
                ),
                "lifetimes": self.lifetimes.name,
                "queued": len(remaining) - 1,
                "in_flight": len(self.in_flight),
                "until": until,
            },
        )

    def _ready_if_empty(self, cluster: ClusterState, drain: Drain, now: float) -> list[Migration]:
        host = drain.host
        # A relieved host is done when its chosen VMs are; the others stay.
        staying = cluster.vm_count[host] if drain.reason != "relief" else 0
        if staying or drain.in_flight or drain.queued:
            return []
        del self.drains[host]
        self.counters["hosts_ready"] += 1
        # Summed, not listed per host: a daemon drains hosts for months, and
        # the summary needs only the mean.
        self.counters["migrated_off_ready_hosts"] += drain.migrated
        if drain.reason == "relief":
            cluster.undrain_host(cluster.host_ids[host])
            reason = "relieved: back in service with the VMs that stayed"
        elif drain.returns:
            cluster.undrain_host(cluster.host_ids[host])
            reason = "empty: back in service for every lifetime class"
        else:
            reason = "empty: ready for maintenance (closed until host.up)"
        return [
            self._decision(
                cluster,
                drain,
                now,
                "host_ready",
                reason,
                explanation={
                    "migrated": drain.migrated,
                    "exited_before_migration": drain.exited,
                    "scheduled": drain.scheduled,
                    "drain_s": now - drain.started,
                },
            )
        ]

    def _plan(self, cluster: ClusterState, drain: Drain, now: float, reason: str) -> Migration:
        remaining = self._remaining(cluster, now)
        known = self.lifetimes.known
        ranked = self.order.rank(list(self.queue.values()), remaining.__getitem__)
        plan = [
            {
                "vm_id": q.vm_id,
                "predicted_remaining_s": remaining[q.vm_id] if known else None,
                "queue_position": position,
            }
            for position, q in enumerate(ranked)
            if q.host == drain.host
        ]
        return self._decision(cluster, drain, now, "plan", reason, plan=plan)

    def _decision(
        self,
        cluster: ClusterState,
        drain: Drain,
        now: float,
        action: Literal["plan", "migrate", "host_ready"],
        reason: str,
        *,
        vm_id: str | None = None,
        target_host_id: str | None = None,
        plan: list[dict[str, Any]] | None = None,
        explanation: dict[str, Any] | None = None,
    ) -> Migration:
        self._decisions += 1
        host_id = cluster.host_ids[drain.host]
        return Migration(
            decision_id=migration_id(self.pool, host_id, self._decisions),
            time=now,
            pool=self.pool,
            action=action,
            host_id=host_id,
            drain=drain.reason,
            policy=self.order.name,
            reason=reason,
            vm_id=vm_id,
            target_host_id=target_host_id,
            plan=plan or [],
            explanation=explanation or {},
        )

    def _log_drain(self, now: float, host_id: str, reason: str) -> None:
        log = self.drain_log
        log.append((now, host_id, reason))
        # Cut back to the kept length only once it has doubled, so each drain
        # costs O(1) amortised, not a shift of the whole log.
        if len(log) >= 2 * DRAIN_LOG_KEPT:
            del log[:-DRAIN_LOG_KEPT]

    @property
    def has_drained(self) -> bool:
        """Whether any drain ever started (the log keeps only the latest)."""
        counters = self.counters
        return any(counters[f"drains.{reason}"] for reason in DRAIN_REASONS)

    def summary(self) -> dict[str, Any]:
        counters = self.counters
        drains = sum(counters[f"drains.{reason}"] for reason in DRAIN_REASONS)
        ready = counters["hosts_ready"]
        return {
            "order": self.order.name,
            "lifetimes": self.lifetimes.name,
            "drains": drains,
            "scheduled": counters["scheduled"],
            "migrations": counters["migrations"],
            "exited_before_migration": counters["exited_before_migration"],
            "hosts_ready": counters["hosts_ready"],
            "migrations_per_drained_host": counters["migrations"] / drains if drains else None,
            "migrations_per_ready_host": (
                counters["migrated_off_ready_hosts"] / ready if ready else None
            ),
            "still_queued": len(self.queue),
            "counters": dict(counters),
            "drain_log": [list(entry) for entry in self.drain_log[-DRAIN_LOG_KEPT:]],
            "compared": {shadow.label: shadow.summary() for shadow in self.shadows},
        }
