"""The decision core: ``Engine.handle(event, now)`` and ``Engine.advance(now)``.

Synchronous and deterministic: it never reads a clock (time is the event time
passed in), does no I/O, and draws randomness only from generators seeded by
the configured seed and the pool name. The replay shell feeds it from trace
files; the live shell (``daemon/live``) feeds it from Kafka the same way, so
both give the same decisions.

``handle`` returns a ``Handled``: the decisions made, and a ``Rejection``
when the event itself was refused. A refusal is a result beside the
decisions, never an exception: the timers that ran up to the event's time
made decisions and moved the state on, and those must be published even when
the event that brought the clock there is dead-lettered. Refused:

* an event whose time is implausible (``InputBounds``): past ``max_time``
  (milliseconds sent as seconds), more than ``max_ahead_s`` ahead of its
  pool's clock, or more than ``max_behind_s`` behind it. These are refused
  *before* any timer runs, so one absurd record cannot drag a pool's clock
  (and every loop driven by it) forward;
* an event of a pool whose name is not allowed, or that would open one pool
  more than ``PoolNames.max_pools``;
* an event that contradicts the state (exit of an unknown VM, a duplicate VM
  id, an unknown host): refused before the event changes anything;
* under ``on_defect = "quarantine"``, an event on which the engine failed for
  a reason it does not know (a defect), and every later event of that pool
  (``quarantine.py``): the other pools go on.

Time going backwards within a pool: an event at most ``max_behind_s`` older
than the pool's clock (the latest event time it handled) is handled at the
pool's clock, as if it had arrived just now; its decisions carry that time.
A pool's state never goes back in time, so timers and metrics stay ordered.

An engine takes an ``EngineStrategy`` at construction, its one extension
point: which handler takes each event type, what a new pool keeps, and what
happens around ``handle`` and ``advance``. ``PlainStrategy`` (the default) is
the engine on its own; shadow mode (``daemon/shadow``) passes one that keeps
the actual cluster beside lavad's pools and marks lavad's decisions as advice.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np

from lavad.core.admission.service import AdmissionConfig, PoolAdmission
from lavad.core.cluster import (
    MAX_VMS_PER_HOST,
    ClusterError,
    ClusterState,
    HostState,
    VmRecord,
)
from lavad.core.input_bounds import NEVER, InputBounds, PoolNames
from lavad.core.limits.replicas import PoolReplicas
from lavad.core.limits.service import LimitsConfig, PoolLimits
from lavad.core.metrics.pool import MetricsConfig, PoolMetrics
from lavad.core.metrics.stranding import warm_up as warm_up_stranding
from lavad.core.migrations.config import LifetimeSource, MigrationsConfig, drains_by_itself
from lavad.core.migrations.lifetimes import (
    LIFETIME_SOURCES,
    RemainingLifetimes,
    policy_tracker,
)
from lavad.core.migrations.orders import build_order
from lavad.core.migrations.planner import MigrationPlanner
from lavad.core.migrations.shadow import ShadowOrder
from lavad.core.placement.framework import (
    Notice,
    Placed,
    PlacementRequest,
    PlacementResult,
    Policy,
    Unfit,
    UniformDraws,
)
from lavad.core.placement.gpa import UsageHooks
from lavad.core.placement.kernels import warm_up as warm_up_kernels
from lavad.core.placement.registry import PolicyArgs, build_policy
from lavad.core.placement.rehearsal import rehearse
from lavad.core.quarantine import DefectPolicy, Quarantine
from lavad.models.limits.decision import LimitDecision
from lavad.models.limits.replicas import ReplicaDecision
from lavad.streams.fastbuild import fast_constructor
from lavad.streams.ids import (
    admission_id,
    limit_id,
    placement_id,
    replicas_id,
    reprediction_id,
)
from lavad.streams.schema import (
    Admission,
    Decision,
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
    HostDown,
    HostDrain,
    HostUp,
    Limit,
    Placement,
    Replicas,
    Reprediction,
    UsageSample,
    VmExit,
    VmPlaced,
    VmRequest,
)

Demand = tuple[float, float, float, float]

# One placement decision per request: built without the frozen __init__.
_placement: Callable[
    [str, float, str, str, str | None, str, str, bool, dict[str, Any]], Placement
] = fast_constructor(
    Placement,
    "decision_id",
    "time",
    "pool",
    "vm_id",
    "host_id",
    "policy",
    "reason",
    "retryable",
    "explanation",
)


class InvalidEvent(Exception):
    """Raised inside the engine when an event contradicts the state; nothing was changed.

    Never leaves ``Engine.handle``: it becomes the ``Rejection`` of a ``Handled``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


RejectionStage = Literal["time", "pool", "engine", "defect", "quarantined"]


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an event was refused: ``stage`` "time" (implausible event time), "pool"
    (pool name not allowed, or too many pools), "engine" (contradicts the state),
    "defect" (the engine failed on it, or on opening its pool, and quarantined the
    pool) or "quarantined" (its pool is)."""

    stage: RejectionStage
    reason: str


@dataclass(frozen=True, slots=True)
class Handled:
    """What ``Engine.handle`` did with one event.

    ``decisions`` are to be published whether or not the event was refused
    (timers due before it ran and may have decided); ``rejection`` says why
    the event itself was refused, for the shell to dead-letter it.
    """

    decisions: list[Decision]
    rejection: Rejection | None = None

    @property
    def time_refused(self) -> bool:
        """The event's time was implausible: it must not move a shell's timer clock either."""
        return self.rejection is not None and self.rejection.stage == "time"


@dataclass(frozen=True, slots=True)
class HostShape:
    cores: float
    memory_gib: float
    disk_gib: float = 0.0
    gpus: float = 0.0

    def as_capacity(self) -> Demand:
        return (self.cores, self.memory_gib, self.disk_gib, self.gpus)

    def holds(self, demand: Demand) -> bool:
        return all(need <= have for need, have in zip(demand, self.as_capacity(), strict=True))


@dataclass(frozen=True, slots=True)
class PoolSetup:
    """How a pool gets hosts: ``initial_hosts`` of ``shape`` at start, and/or on demand.

    With ``grow_on_demand`` a request that fits no host gets a new empty host
    of ``shape`` (the LAVA simulations' open-ended pool); the metrics then
    report how many hosts were used. Hosts may also arrive as host.up events.
    """

    shape: HostShape | None = None
    initial_hosts: int = 0
    grow_on_demand: bool = False
    # Every host keeps its column for as long as the pool lives, so a flood of
    # requests (grown on demand) or of host.up ids cannot take every byte:
    # beyond this the pool grows no host and a new host.up is dead-lettered.
    max_hosts: int = 100_000
    # The VMs one host runs at most: at it the host takes no VM, whatever the
    # VMs ask (``ClusterState.max_vms``).
    max_vms: int = MAX_VMS_PER_HOST

    def __post_init__(self) -> None:
        if self.max_hosts < 1:
            raise ValueError(f"max_hosts must be >= 1, got {self.max_hosts}")
        if self.max_vms < 1:
            raise ValueError(f"max_vms must be >= 1, got {self.max_vms}")
        if self.initial_hosts > self.max_hosts:
            raise ValueError(
                f"initial_hosts ({self.initial_hosts}) above max_hosts ({self.max_hosts})"
            )


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """Pools whose names match ``pattern`` (fnmatch) are placed by ``policy``, with ``args``,
    instead of the engine's policy: a fleet's GPU pools by Best Fit, say, where lifetime
    awareness does not pay (docs/results/placement-matrix.md), its CPU pools by LAS."""

    pattern: str
    policy: str
    args: PolicyArgs


@dataclass(frozen=True, slots=True)
class EngineConfig:
    policy: str
    policy_args: PolicyArgs
    # The first whose pattern matches a pool's name places it; none: ``policy``.
    pool_policies: tuple[PoolPolicy, ...] = ()
    pools: PoolSetup = field(default_factory=PoolSetup)
    seed: int = 0
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # None: deployment events are counted, not decided.
    admission: AdmissionConfig | None = None
    migrations: MigrationsConfig = field(default_factory=MigrationsConfig)
    input: InputBounds = field(default_factory=InputBounds)
    pool_names: PoolNames = field(default_factory=PoolNames)
    # What a host.down does to the VMs on it: "evict" publishes each eviction
    # (a placement with no host); "replace" also places each VM again.
    on_host_down: Literal["evict", "replace"] = "evict"
    # What an exception the engine does not know does (``quarantine.py``).
    on_defect: DefectPolicy = "stop"

    def policies(self) -> dict[str, PolicyArgs]:
        """Every policy that may place a pool, once each, with its arguments: ``policy``
        and each of ``pool_policies`` (a name given twice keeps its first arguments: what
        compiling its kernels and asking for true lifetimes read is the name)."""
        named = {self.policy: self.policy_args}
        for chosen in self.pool_policies:
            named.setdefault(chosen.policy, chosen.args)
        return named


@dataclass(slots=True)
class PoolRuntime:
    name: str
    cluster: ClusterState
    policy: Policy
    metrics: PoolMetrics
    # Drains (maintenance, defragmentation) and their live migrations.
    migrations: MigrationPlanner
    # VMs that were refused (or evicted) and how often: their exits are
    # expected and absorbed (counted), and a retry gets a fresh decision id.
    refused: dict[str, int] = field(default_factory=dict)
    auto_hosts: int = 0
    counters: Counter[str] = field(default_factory=Counter)
    # Numbers the pool's reprediction decisions, so their ids are deterministic.
    repredictions: int = 0
    # Limit recommendations from the usage stream (None when turned off).
    limits: PoolLimits | None = None
    # Replica recommendations per deployment (None unless [limits] horizontal).
    replicas: PoolReplicas | None = None
    admission: PoolAdmission | None = None
    # Numbers the pool's admission decisions, so their ids are deterministic.
    admissions: int = 0
    # The latest event time the pool handled: its state never goes back.
    clock: float = float("-inf")
    # Numbers evictions by host.down, so their ids are deterministic.
    evictions: int = 0
    # Each placed VM's request, kept only when a host.down places its VMs
    # again (on_host_down = "replace"), so the new placement sees the request.
    requests: dict[str, VmRequest] | None = None
    # Set when a defect stopped the pool (``quarantine.py``): it decides no more.
    quarantine: Quarantine | None = None

    def drop_samples_before(self, cutoff: float) -> int:
        """The metrics' samples before ``cutoff`` dropped (``PoolMetrics``); how many."""
        return self.metrics.drop_samples_before(cutoff)

    def forgotten(self) -> dict[str, int]:
        """What the pool forgot to stay bounded, by what it was (the ``state`` label
        ``lavad_state_evicted_total`` carries): every pool refuses VMs, so the count is
        there from the start, and an alert on its increase sees the first forgetting."""
        return {"refused_vms": self.counters["refused_forgotten"]}

    def remember_refused(self, vm_id: str, attempts: int, bound: int) -> None:
        """Remember a VM that has no host, to absorb its exit and number its retry.

        A VM refused for good may never exit (it never ran), so past ``bound``
        the least recently refused half is forgotten (``forget_least_recent``).
        A forgotten VM's exit is then dead-lettered as unknown, and its retry
        takes its first decision id again.
        """
        self.refused[vm_id] = attempts
        forgotten = forget_least_recent(self.refused, bound)
        if forgotten:
            self.counters["refused_forgotten"] += forgotten


def forget_least_recent(entries: dict[str, Any], bound: int) -> int:
    """Past ``bound`` entries, drop the first inserted half; how many were dropped.

    Half at once, since dropping a dict's first entry one at a time rescans
    the slots already dropped: this keeps the cost per entry constant.
    """
    if len(entries) <= bound:
        return 0
    forgotten = len(entries) - (bound - bound // 2)
    for old in list(itertools.islice(entries, forgotten)):
        del entries[old]
    return forgotten


def pool_policy(config: EngineConfig, pool: str) -> tuple[str, PolicyArgs]:
    """The policy that places ``pool`` and its arguments: the first of ``pool_policies``
    whose pattern matches the name, else the engine's own."""
    for chosen in config.pool_policies:
        if fnmatch.fnmatchcase(pool, chosen.pattern):
            return chosen.policy, chosen.args
    return config.policy, config.policy_args


def _stable_seed(seed: int, pool: str, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(pool.encode()), stream])


# How an engine takes one event type: (pool, event, event time) -> decisions.
# It raises InvalidEvent, before changing anything, for an event that
# contradicts the pool's state.
Handler = Callable[[PoolRuntime, Any, float], list[Decision]]
Handlers = Mapping[type[Event], Handler]


class EngineStrategy(Protocol):
    """What an engine does beyond deciding by its own policy: its one extension point.

    The engine asks it once for its handlers, once per pool it opens, and
    around every ``handle`` and ``advance``; pools and timers the strategy
    keeps itself (shadow mode's actual cluster) come and go with the engine's.
    """

    def handlers(self, plain: Handlers) -> Handlers:
        """The handler per event type: ``plain`` (the engine's own), some replaced."""
        ...

    def open_pool(self, pool: PoolRuntime) -> PoolRuntime:
        """What the engine keeps for a pool it just built: ``pool``, or a runtime around it."""
        ...

    def handle(self, engine: Engine, event: Event, now: float) -> Handled:
        """One event; ``engine.decide`` is the engine's own handling of it."""
        ...

    def advance(self, engine: Engine, now: float) -> list[Decision]:
        """The timers due by ``now``; ``engine.decide_timers`` runs the engine's own."""
        ...

    @property
    def next_deadline(self) -> float:
        """The earliest timer the strategy keeps itself (inf when none)."""
        ...

    def take_pools(self, names: list[str]) -> None:
        """The pools of these names leave the engine (their partition moved)."""
        ...

    def adopt_pools(self, pools: Mapping[str, PoolRuntime]) -> None:
        """Restored pools join the engine; ValueError when they are not the strategy's kind."""
        ...

    def identity(self, config: EngineConfig) -> str:
        """What identifies the engine's state: a snapshot made under another is refused."""
        ...


class PlainStrategy:
    """The engine on its own: its handlers, its pools, its timers."""

    def handlers(self, plain: Handlers) -> Handlers:
        return plain

    def open_pool(self, pool: PoolRuntime) -> PoolRuntime:
        return pool

    def handle(self, engine: Engine, event: Event, now: float) -> Handled:
        return engine.decide(event, now)

    def advance(self, engine: Engine, now: float) -> list[Decision]:
        return engine.decide_timers(now)

    @property
    def next_deadline(self) -> float:
        return float("inf")

    def take_pools(self, names: list[str]) -> None:
        return None

    def adopt_pools(self, pools: Mapping[str, PoolRuntime]) -> None:
        return None

    def identity(self, config: EngineConfig) -> str:
        return repr(config)


class Engine:
    def __init__(self, config: EngineConfig, strategy: EngineStrategy | None = None) -> None:
        self.config = config
        self.strategy: EngineStrategy = PlainStrategy() if strategy is None else strategy
        self.pools: dict[str, PoolRuntime] = {}
        plain: dict[type[Event], Handler] = {
            VmRequest: self._on_request,
            VmExit: self._on_exit,
            VmPlaced: self._on_placed,
            HostUp: self._on_host_up,
            HostDown: self._on_host_down,
            HostDrain: self._on_host_drain,
            UsageSample: self._on_usage,
            DeploymentArrival: self._on_deployment,
            DeploymentScaleOut: self._on_deployment,
            DeploymentScaleIn: self._on_deployment,
        }
        self._handlers: dict[type[Event], Handler] = dict(self.strategy.handlers(plain))
        # Pools quarantined since the shell last asked (``take_defects``).
        self._defects: list[tuple[str, Quarantine]] = []
        # Pools whose opening raised: no state to keep, so not in ``pools`` or
        # a snapshot (an instance that takes them tries again), but refused
        # until then like a quarantined pool, and counted against max_pools.
        self._unopened: dict[str, Quarantine] = {}

    # ------------------------------------------------------------ interface

    def handle(self, event: Event, now: float) -> Handled:
        """Decide on one event at event time ``now``; see the module docstring on refusals."""
        return self.strategy.handle(self, event, now)

    def decide(self, event: Event, now: float) -> Handled:
        """The engine's own handling of one event (``handle`` under the plain strategy)."""
        pool = self.pools.get(event.pool)
        clock = NEVER if pool is None else pool.clock
        implausible = self.config.input.time_refusal(now, clock, event.pool)
        if implausible is not None:
            return Handled([], Rejection("time", implausible))
        if pool is None:
            refused = self._refuse_pool(event.pool)
            if refused is not None:
                return Handled([], refused)
            try:
                pool = self._open_pool(event.pool)
            except Exception as exc:  # noqa: BLE001 - a defect: re-raised or the pool refused
                quarantine = self._unopenable(event.pool, exc, now)
                return Handled([], Rejection("defect", quarantine.defect(event.pool)))
        elif pool.quarantine is not None:
            return Handled([], Rejection("quarantined", pool.quarantine.refusal(pool.name)))
        # Late events are handled at the pool's clock (the pool never goes back).
        if now >= pool.clock:
            pool.clock = now
        else:
            pool.counters["late_events"] += 1
            now = pool.clock
        timed: list[Decision] = []
        during = "timers"
        try:
            timed = self._timers_before(pool, now)
            during = f"{event.type} event"
            return self._apply(pool, event, now, timed)
        except Exception as exc:  # noqa: BLE001 - a defect: re-raised or quarantined (_defect)
            quarantine = self._defect(pool, exc, during, now)
            # What the timers decided before the event failed stands, as for
            # an event refused; nothing of the failing step is published.
            return Handled(timed, Rejection("defect", quarantine.defect(pool.name)))

    def _timers_before(self, pool: PoolRuntime, now: float) -> list[Decision]:
        """The pool's own timers due by ``now``, run before its event at ``now``.

        Whatever the shell's watermark says: a pool then decides the same in
        a replay and in the live daemon. What they decide comes out first
        too, before the event's decisions, as if the shell had advanced the
        engine to ``now`` before the event (replay does, the live intake does
        not): a LAVA deadline falling on an event's time is published in one
        order by both shells.
        """
        hooks = pool.policy.hooks
        if now < hooks.next_deadline and now < pool.migrations.next_deadline:
            return []
        timed = self._run_timers(pool, now)
        early = hooks.take_notices()
        if early:
            timed = self._notices_first(pool, early, now, timed)
        return timed

    def _apply(self, pool: PoolRuntime, event: Event, now: float, timed: list[Decision]) -> Handled:
        """The event in its pool at ``now``, after the timers that decided ``timed``."""
        metrics = pool.metrics
        if metrics.last is None or now > metrics.last:
            # Metrics advance lazily, per pool: its state held since its last event.
            metrics.advance(pool.cluster, now)
        handler = self._handlers.get(type(event))
        rejection: Rejection | None = None
        decisions: list[Decision]
        if handler is None:
            # Every event type has a handler; this guards a future one.
            pool.counters[f"unconsumed.{event.type}"] += 1
            decisions = []
        else:
            try:
                decisions = handler(pool, event, now)
            except InvalidEvent as exc:
                decisions, rejection = [], Rejection("engine", exc.reason)
        if timed:
            decisions = timed + decisions
        notices = pool.policy.hooks.take_notices()
        if notices:
            decisions = self._notices_first(pool, notices, now, decisions)
        return Handled(decisions, rejection)

    def _refuse_pool(self, name: str) -> Rejection | None:
        """Why a new pool may not open, or None. Each pool holds state for good
        (tens of KB at least), so an open-ended stream of names would exhaust memory."""
        unopened = self._unopened.get(name)
        if unopened is not None:
            return Rejection("quarantined", unopened.refusal(name))
        names = self.config.pool_names
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in names.allow):
            return Rejection(
                "pool", f"pool {name!r} matches none of pools.allow {list(names.allow)!r}"
            )
        held = len(self.pools) + len(self._unopened)
        if held >= names.max_pools:
            return Rejection(
                "pool",
                f"pool {name!r} would be pool {held + 1} of this instance "
                f"(pools.max_pools = {names.max_pools})",
            )
        return None

    def _run_timers(self, pool: PoolRuntime, now: float) -> list[Decision]:
        """The pool's timers due by ``now``, each at its own time.

        Migration timers (finished migrations, defragmentation checks) run in
        time order with the policy's (repredictions, LAVA deadlines): the
        policy catches up to each migration timer before it picks a target.
        """
        hooks = pool.policy.hooks
        planner = pool.migrations
        out: list[Decision] = []
        if now >= planner.next_deadline:
            mover = _PoolMover(pool)
            metrics = pool.metrics
            while (due := planner.next_deadline) <= now:
                if due == float("-inf"):
                    due = now  # a first look "at once" (the defragmentation trigger)
                if due >= hooks.next_deadline:
                    hooks.advance(pool.cluster, due)
                if metrics.last is None or due > metrics.last:
                    metrics.advance(pool.cluster, due)
                out.extend(planner.advance(pool.cluster, due, mover))
        if now >= hooks.next_deadline:
            hooks.advance(pool.cluster, now)
        return out

    @property
    def next_deadline(self) -> float:
        """The earliest time ``advance`` has work to do (inf when no timer is set)."""
        earliest = self.strategy.next_deadline
        for pool in self.pools.values():
            if pool.quarantine is None:
                hooks = pool.policy.hooks
                earliest = min(earliest, hooks.next_deadline, pool.migrations.next_deadline)
        return earliest

    def advance(self, now: float) -> list[Decision]:
        """Run timers due by ``now`` and return their decisions.

        Timers: lifetime refits, VMs outliving their predictions, LAVA
        deadlines (repredictions); migrations finishing, defragmentation
        checks (migrations). Before the earliest of them nothing runs, so a
        shell may call this as often as its clock moves and an engine
        without timers costs nothing.

        Pool metrics do not need this: they catch up lazily on each pool's
        next event and in ``summary``.
        """
        if now < self.next_deadline:
            return []
        return self.strategy.advance(self, now)

    def decide_timers(self, now: float) -> list[Decision]:
        """The engine's own timers due by ``now`` (``advance`` under the plain strategy)."""
        out: list[Decision] = []
        # A copy: a quarantine replaces its pool with a husk (``_mark``).
        for pool in list(self.pools.values()):
            if pool.quarantine is not None:
                continue
            try:
                timed = self._run_timers(pool, now)
                notices = pool.policy.hooks.take_notices()
                if notices:
                    timed = self._notices_first(pool, notices, now, timed)
            except Exception as exc:  # noqa: BLE001 - a defect: re-raised or quarantined (_defect)
                # What the failing pool decided in this call is withheld with it.
                self._defect(pool, exc, "timers", now)
                continue
            out.extend(timed)
        return out

    def _defect(self, pool: PoolRuntime, exc: Exception, during: str, now: float) -> Quarantine:
        """``exc`` raised again under ``on_defect = "stop"``; else ``pool`` quarantined for it."""
        if self.config.on_defect == "stop":
            raise exc
        quarantine = Quarantine.of(exc, now, during)
        self._mark(pool, quarantine)
        return quarantine

    def quarantine_pool(self, name: str, quarantine: Quarantine) -> None:
        """Quarantine pool ``name`` (opened if new) for a defect a strategy met beside the
        engine: shadow mode's actual side, which is one pool with this one."""
        if name in self._unopened:
            return
        try:
            pool = self.pool(name)
        except Exception:  # noqa: BLE001 - opening it failed too: refused unopened
            self._unopened[name] = quarantine
            self._defects.append((name, quarantine))
            return
        if pool.quarantine is None:
            self._mark(pool, quarantine)

    def _unopenable(self, name: str, exc: Exception, now: float) -> Quarantine:
        """``exc`` raised again under ``on_defect = "stop"``; else pool ``name``, whose
        opening raised it, refused from now on in this instance."""
        if self.config.on_defect == "stop":
            raise exc
        quarantine = Quarantine.of(exc, now, "opening the pool")
        self._unopened[name] = quarantine
        self._defects.append((name, quarantine))
        return quarantine

    def holds(self, name: str) -> bool:
        """Whether this engine keeps anything of pool ``name``: its state, or the refusal
        of its records after its opening raised."""
        return name in self.pools or name in self._unopened

    def quarantined(self) -> dict[str, Quarantine]:
        """Every pool a defect stopped in this instance, opened or not."""
        held = {name: pool.quarantine for name, pool in self.pools.items() if pool.quarantine}
        return {**held, **self._unopened}

    def _mark(self, pool: PoolRuntime, quarantine: Quarantine) -> None:
        """Quarantine ``pool``: its state gives way to a husk that holds the quarantine.

        The half-changed state is never decided on again, and it may hold what
        the snapshot codec cannot write (a defect is often a value of a kind
        nothing expected): kept, it would fail every snapshot of the partition
        and stop the daemon at each restart, the crash loop the quarantine is
        there to end. The husk is the pool as newly opened, at the failed
        pool's clock so its time checks are those it had. The failing record
        (dead letter), its trace (log) and the input topics keep what is needed
        to reproduce the defect.
        """
        husk = pool
        try:
            husk = self._open_pool(pool.name)
        except Exception as exc:  # noqa: BLE001 - the failed state stays, marked, and said so
            self.pools[pool.name] = pool
            quarantine = quarantine.without_husk(exc)
        husk.clock = pool.clock
        husk.quarantine = quarantine
        self._defects.append((pool.name, quarantine))

    def take_defects(self) -> list[tuple[str, Quarantine]]:
        """The pools quarantined since the last call, for the shell to log and count."""
        defects, self._defects = self._defects, []
        return defects

    def _notices_first(
        self, pool: PoolRuntime, notices: list[Notice], now: float, decisions: list[Decision]
    ) -> list[Decision]:
        """Timer notices (before ``now``) precede the event's decisions; the event's follow."""
        earlier = [n for n in notices if n.time < now]
        later = [n for n in notices if n.time >= now]
        return self._repredictions(pool, earlier) + decisions + self._repredictions(pool, later)

    def _repredictions(self, pool: PoolRuntime, notices: list[Notice]) -> list[Decision]:
        out: list[Decision] = []
        policy = pool.policy.name
        for notice in notices:
            pool.repredictions += 1
            out.append(
                Reprediction(
                    reprediction_id(
                        pool.name, notice.subject, notice.subject_id, pool.repredictions
                    ),
                    notice.time,
                    pool.name,
                    notice.subject,
                    notice.subject_id,
                    policy,
                    notice.reason,
                    notice.explanation,
                )
            )
        return out

    def summary(self, end: float) -> dict[str, Any]:
        return {name: self.pool_summary(pool, end) for name, pool in sorted(self.pools.items())}

    @staticmethod
    def pool_summary(pool: PoolRuntime, end: float) -> dict[str, Any]:
        """One pool's metrics, counters and policy summary, up to ``end``."""
        quarantine = pool.quarantine
        if quarantine is not None:
            # Its state may be half-changed: only why and when it stopped is told.
            return {
                "quarantine": {
                    "time": quarantine.time,
                    "during": quarantine.during,
                    "error": quarantine.error,
                }
            }
        summary = {
            **pool.metrics.summary(pool.cluster, end),
            "counters": dict(pool.counters),
            **pool.policy.hooks.summary(),
        }
        if pool.migrations.has_drained:
            summary["migrations"] = pool.migrations.summary()
        if pool.admission is not None:
            summary["admission"] = {
                **pool.admission.counters,
                "scale_out_failure_rate": pool.admission.scale_out_failure_rate,
            }
        if pool.replicas is not None:
            summary["replicas"] = pool.replicas.summary()
        return summary

    # ----------------------------------------------------------------- pools

    @property
    def fingerprint(self) -> str:
        """Identifies the configuration a pool's state was built under.

        A snapshot taken under another policy, seed or host setup would resume
        a different run; the live shell refuses it instead of mixing the two.
        """
        # What a defect does changes no decision: a snapshot carries over.
        identity = self.strategy.identity(replace(self.config, on_defect="stop"))
        return hashlib.sha256(identity.encode()).hexdigest()[:16]

    def take_pools(self, names: Iterable[str]) -> dict[str, PoolRuntime]:
        """Remove and return pools (their partition moved to another instance)."""
        names = list(names)
        for name in names:
            self._unopened.pop(name, None)  # the instance that takes it tries again
        self.strategy.take_pools(names)
        return {name: self.pools.pop(name) for name in names if name in self.pools}

    def adopt_pools(self, pools: dict[str, PoolRuntime]) -> None:
        """Resume pools restored from a snapshot; their RNG streams continue where they were."""
        self.strategy.adopt_pools(pools)
        clash = sorted(set(pools) & set(self.pools))
        if clash:
            raise ValueError(f"pools already held by this engine: {', '.join(clash)}")
        self.pools.update(pools)

    def _on_deployment(
        self,
        pool: PoolRuntime,
        event: DeploymentArrival | DeploymentScaleOut | DeploymentScaleIn,
        now: float,
    ) -> list[Decision]:
        admission = pool.admission
        if admission is None:
            pool.counters[f"unconsumed.{event.type}"] += 1
            return []
        if isinstance(event, DeploymentScaleIn):
            admission.on_scale_in(event, now)
            return []
        verdict = (
            admission.on_arrival(event, now)
            if isinstance(event, DeploymentArrival)
            else admission.on_scale_out(event, now)
        )
        if verdict is None:
            return []
        pool.admissions += 1
        return [
            Admission(
                decision_id=admission_id(pool.name, verdict.deployment_id, pool.admissions),
                time=verdict.time,
                pool=pool.name,
                deployment_id=verdict.deployment_id,
                request=verdict.request,
                admitted=verdict.admitted,
                cores=verdict.cores,
                policy=verdict.policy,
                reason=verdict.reason,
                explanation=verdict.explanation,
            )
        ]

    def _on_usage(self, pool: PoolRuntime, event: UsageSample, now: float) -> list[Decision]:
        hooks = pool.policy.hooks
        observed = hooks.observes_usage
        # A usage-aware policy (gpa) learns first; its risk notices follow.
        hooks.observe(pool.cluster, event)
        limits = pool.limits
        replicas = pool.replicas
        if limits is None and replicas is None:
            if not observed:
                pool.counters["unconsumed.usage"] += 1
            return []
        out: list[Decision] = []
        # Windows that ended before this sample are complete: decide on them
        # first (this sample belongs to a later window).
        if limits is not None:
            decided = limits.close_before(now)
            limits.on_usage(event)
            out.extend(_limit_decision(pool.name, d) for d in decided)
        if replicas is not None:
            scaled = replicas.close_before(now)
            record = pool.cluster.vms.get(event.vm_id)
            replicas.on_usage(event, "" if record is None else record.deployment)
            out.extend(_replicas_decision(pool.name, d) for d in scaled)
        return out

    def warm_up(self) -> None:
        """Compile (or load from numba's cache) the kernels the pools will run, now
        (``warm_up_policies`` for the configured policies)."""
        warm_up_policies(self.config.policies())

    def pool(self, name: str) -> PoolRuntime:
        """The pool of this name, opened if new.

        For a strategy whose pools go with the engine's: the name is not held
        against ``[pools]`` here, the engine that opened its own pool of that
        name did that.
        """
        pool = self.pools.get(name)
        return self._open_pool(name) if pool is None else pool

    def _open_pool(self, name: str) -> PoolRuntime:
        config = self.config
        policy_name, args = pool_policy(config, name)
        policy = build_policy(policy_name, args, _stable_seed(config.seed, name, 0))
        pool = PoolRuntime(
            name=name,
            cluster=ClusterState(max_vms=config.pools.max_vms),
            policy=policy,
            metrics=PoolMetrics(config.metrics, _stable_seed(config.seed, name, 1)),
            migrations=_migration_planner(name, config, policy),
            limits=None if config.limits.recommender == "off" else PoolLimits(config.limits),
            replicas=(
                PoolReplicas(config.limits.max_deployments, config.limits.scaler.horizontal())
                if config.limits.horizontal
                else None
            ),
            admission=None if config.admission is None else PoolAdmission(config.admission),
            requests={} if config.on_host_down == "replace" else None,
        )
        setup = config.pools
        if setup.shape is not None:
            for i in range(setup.initial_hosts):
                pool.cluster.add_host(f"{name}/h{i:05d}", setup.shape.as_capacity())
        kept = self.strategy.open_pool(pool)
        self.pools[name] = kept
        return kept

    # -------------------------------------------------------------- handlers

    def _on_request(self, pool: PoolRuntime, event: VmRequest, now: float) -> list[Decision]:
        cluster = pool.cluster
        vm_id = event.vm_id
        if vm_id in cluster.vms:
            where = cluster.host_ids[cluster.vms[vm_id].host]
            raise InvalidEvent(f"duplicate VM id {vm_id!r}: already placed on host {where!r}")
        attempt = pool.refused.pop(vm_id, 0)
        demand: Demand = (event.cores, event.memory_gib, event.disk_gib, event.gpus)
        pool.metrics.observe_request(demand, now)
        decision_id = placement_id(pool.name, vm_id, f"retry{attempt}" if attempt else "")
        return [self._place(pool, event, demand, attempt, decision_id, now, "")]

    def _place(
        self,
        pool: PoolRuntime,
        event: VmRequest,
        demand: Demand,
        attempt: int,
        decision_id: str,
        now: float,
        why: str,
    ) -> Placement:
        """Place one VM by the policy and book it; the decision says where, or why nowhere."""
        cluster = pool.cluster
        vm_id = event.vm_id
        request = PlacementRequest(vm_id, demand, event.deployment, event.max_per_host, now, event)
        result = self._place_or_grow(pool, request)
        host_id: str | None
        if isinstance(result, Unfit):
            pool.remember_refused(vm_id, attempt + 1, self.config.pool_names.max_refused)
            if result.retryable:
                pool.metrics.unfit_retryable += 1
            else:
                pool.metrics.unfit_final += 1
            host_id, reason, retryable = None, result.reason, result.retryable
            explanation: dict[str, Any] = {"rejected_by": result.rejected_by}
        else:
            record = cluster.book(vm_id, result.host, demand, event.deployment, now)
            if pool.requests is not None:
                pool.requests[vm_id] = event
            # Never onto a draining host, so nothing joins a migration queue.
            booked(pool, record, now, event)
            host_id, retryable = cluster.host_ids[result.host], False
            reason = (
                f"{pool.policy.name}: best score"
                if result.ties
                else "no host fit: opened a new host"
            )
            explanation = {"scores": result.scores, "ties": result.ties}
        if why:
            reason = f"{why}; {reason}"
        return _placement(
            decision_id,
            now,
            pool.name,
            vm_id,
            host_id,
            pool.policy.name,
            reason,
            retryable,
            explanation,
        )

    def _on_exit(self, pool: PoolRuntime, event: VmExit, now: float) -> list[Decision]:
        vm_id = event.vm_id
        if vm_id in pool.cluster.vms:
            record = pool.cluster.release(vm_id)
            if pool.requests is not None:
                pool.requests.pop(vm_id, None)
            pool.policy.hooks.on_released(pool.cluster, record, now, exited=True)
            return [*pool.migrations.on_vm_released(pool.cluster, record, now, exited=True)]
        if pool.refused.pop(vm_id, None) is not None:
            pool.counters["exit_of_unplaced_vm"] += 1
            return []
        raise InvalidEvent(f"exit of unknown VM {vm_id!r}")

    def _on_placed(self, pool: PoolRuntime, event: VmPlaced, now: float) -> list[Decision]:
        host = placed_host(pool, event)
        pool.refused.pop(event.vm_id, None)
        pool.metrics.observe_request(
            (event.cores, event.memory_gib, event.disk_gib, event.gpus), now
        )
        return book_placed(pool, host, event, now)

    def _on_host_up(self, pool: PoolRuntime, event: HostUp, now: float) -> list[Decision]:
        cluster = pool.cluster
        index = cluster.host_index.get(event.host_id)
        if index is not None and cluster.state[index] == HostState.DRAINING:
            # Maintenance is done (or called off): the host takes VMs again.
            pool.migrations.forget_host(index)
            cluster.undrain_host(event.host_id)
            return []
        bound = self.config.pools.max_hosts
        if index is None and cluster.n_hosts >= bound:
            raise InvalidEvent(
                f"host {event.host_id!r} refused: pool {pool.name!r} holds"
                f" {cluster.n_hosts} hosts, hosts.max_hosts = {bound}"
            )
        try:
            pool.cluster.add_host(
                event.host_id, (event.cores, event.memory_gib, event.disk_gib, event.gpus)
            )
        except ClusterError as exc:
            raise InvalidEvent(str(exc)) from None
        return []

    def _on_host_down(self, pool: PoolRuntime, event: HostDown, now: float) -> list[Decision]:
        planner = pool.migrations
        index = pool.cluster.host_index.get(event.host_id)
        try:
            evicted = pool.cluster.remove_host(event.host_id)
        except ClusterError as exc:
            raise InvalidEvent(str(exc)) from None
        if index is not None:
            planner.forget_host(index)
        hooks = pool.policy.hooks
        decisions: list[Decision] = []
        policy = pool.policy.name
        for record in evicted:
            vm_id = record.vm_id
            pool.remember_refused(vm_id, 1, self.config.pool_names.max_refused)
            pool.counters["evicted_by_host_down"] += 1
            hooks.on_released(pool.cluster, record, now, exited=False)
            planner.on_vm_released(pool.cluster, record, now, exited=False)
            pool.evictions += 1
            why = f"evicted: host {event.host_id!r} went down"
            decisions.append(
                _placement(
                    placement_id(pool.name, vm_id, f"evict{pool.evictions}"),
                    now,
                    pool.name,
                    vm_id,
                    None,
                    policy,
                    why,
                    True,
                    {"evicted_from": event.host_id, "placed_at": record.placed_at},
                )
            )
        if pool.requests is not None:
            # Placed again in the order they were evicted (by VM id), each as
            # its own request would have been: same shape, features, tenant.
            for record in evicted:
                request = pool.requests.pop(record.vm_id, None)
                if request is None:
                    continue  # booked by another scheduler (shadow mode): its to re-place
                attempt = pool.refused.pop(record.vm_id, 0)
                pool.counters["replaced_after_host_down"] += 1
                decisions.append(
                    self._place(
                        pool,
                        request,
                        record.demand,
                        attempt,
                        placement_id(pool.name, record.vm_id, f"replace{pool.evictions}"),
                        now,
                        f"replaced after host {event.host_id!r} went down",
                    )
                )
        return decisions

    def _on_host_drain(self, pool: PoolRuntime, event: HostDrain, now: float) -> list[Decision]:
        try:
            host = pool.cluster.drain_host(event.host_id)
        except ClusterError as exc:
            raise InvalidEvent(str(exc)) from None
        return [*pool.migrations.drain(pool.cluster, host, now, _PoolMover(pool))]

    def _place_or_grow(self, pool: PoolRuntime, request: PlacementRequest) -> PlacementResult:
        """The policy's choice; in a pool that grows on demand, a new host when none fits."""
        cluster = pool.cluster
        result = pool.policy.place(cluster, request)
        setup = self.config.pools
        if (
            isinstance(result, Unfit)
            and setup.grow_on_demand
            and setup.shape is not None
            and setup.shape.holds(request.demand)
        ):
            if cluster.n_hosts >= setup.max_hosts:
                # A host of the shape would hold it: exits may free one.
                return Unfit(
                    f"{result.reason}; the pool holds hosts.max_hosts = {setup.max_hosts}"
                    " hosts and grows no more",
                    retryable=True,
                    rejected_by=result.rejected_by,
                )
            host = cluster.add_host(
                f"{pool.name}/auto{pool.auto_hosts:05d}", setup.shape.as_capacity()
            )
            pool.auto_hosts += 1
            pool.metrics.hosts_added_on_demand += 1
            return Placed(host=host, ties=0, scores={})
        return result


def warm_up_policies(policies: Mapping[str, PolicyArgs]) -> None:
    """Compile (or load from numba's cache) what pools placed by ``policies`` run: Best
    Fit's kernels, the pools' hourly stranding sample's, and each policy's through a
    throwaway instance taken through one VM's life (``rehearsal``: refits and releases
    call kernels no placement does).

    Left to the stream, a fresh install's compile (about 45 s for LAS or LAVA)
    would hold a live daemon's event loop mid-stream (group heartbeats,
    scrapes) or count in a replay's time. The Docker image calls this with
    every registered policy, to cache them all at build time.
    """
    warm_up_kernels()
    warm_up_stranding()
    for name, args in policies.items():
        # Its own generator: no pool's seeded draws are taken by the throwaway.
        rehearse(build_policy(name, args, np.random.default_rng(0)))


def booked(
    pool: PoolRuntime, record: VmRecord, now: float, event: VmRequest | VmPlaced
) -> list[Decision]:
    """Tell every hook a VM was booked; one booked onto a draining host (shadow mode) is queued."""
    pool.metrics.placed += 1
    pool.metrics.observe_hosts_used(pool.cluster)
    pool.policy.hooks.on_booked(pool.cluster, record, now, event)
    return [*pool.migrations.on_vm_booked(pool.cluster, record, now, event)]


def placed_host(pool: PoolRuntime, event: VmPlaced) -> int:
    """The host another scheduler placed a VM on, or InvalidEvent (unknown, down, at its
    VM limit, VM known)."""
    cluster = pool.cluster
    host = cluster.host_index.get(event.host_id)
    if host is None:
        raise InvalidEvent(f"VM {event.vm_id!r} placed on unknown host {event.host_id!r}")
    if cluster.state[host] == HostState.DOWN:
        raise InvalidEvent(f"VM {event.vm_id!r} placed on host {event.host_id!r}, which is down")
    if event.vm_id in cluster.vms:
        raise InvalidEvent(f"duplicate VM id {event.vm_id!r}: already placed")
    if cluster.vm_count[host] >= cluster.max_vms:
        # Past capacity is booked (the books follow reality), past the VM
        # limit is not: the limit is what bounds the work of each exit on the
        # host, whoever placed its VMs, as hosts.max_hosts bounds host.up.
        raise InvalidEvent(
            f"VM {event.vm_id!r} placed on host {event.host_id!r}, which runs"
            f" hosts.max_vms = {cluster.max_vms} VMs already"
        )
    return host


def book_placed(pool: PoolRuntime, host: int, event: VmPlaced, now: float) -> list[Decision]:
    """Book a VM another scheduler placed on ``host`` (checked by ``placed_host``)."""
    cluster = pool.cluster
    demand: Demand = (event.cores, event.memory_gib, event.disk_gib, event.gpus)
    # Shadow mode books what another scheduler did, even past capacity:
    # the books must match reality. Such overcommitment is counted.
    if any(cluster.free[r, host] < demand[r] for r in range(4) if demand[r]):
        pool.counters["shadow_overcommit"] += 1
    record = cluster.book(event.vm_id, host, demand, event.deployment, now)
    return booked(pool, record, now, event)


class _PoolMover:
    """The engine's side of a migration: the placement policy picks, every hook hears."""

    def __init__(self, pool: PoolRuntime) -> None:
        self.pool = pool

    def target(self, record: VmRecord, now: float) -> int | None:
        # A running VM: lifetime policies score it by its repredicted remaining lifetime.
        # A pool that grows on demand does not grow for it: a drain is meant
        # to free a host, not to open another (the VM waits for room instead).
        request = PlacementRequest(record.vm_id, record.demand, record.deployment, None, now, None)
        result = self.pool.policy.place(self.pool.cluster, request)
        return None if isinstance(result, Unfit) else result.host

    def move(self, record: VmRecord, target: int, now: float) -> None:
        pool = self.pool
        cluster = pool.cluster
        before = cluster.release(record.vm_id)
        after = cluster.book(
            record.vm_id, target, before.demand, before.deployment, before.placed_at
        )
        pool.metrics.observe_hosts_used(cluster)
        pool.policy.hooks.on_moved(cluster, before, after, now)
        pool.migrations.on_vm_moved(cluster, before, after, now)


def _migration_planner(pool: str, config: EngineConfig, policy: Policy) -> MigrationPlanner:
    """The pool's planner, and the orders it is compared with, sharing lifetime sources."""
    sources: dict[LifetimeSource, RemainingLifetimes] = {}

    def lifetimes(kind: LifetimeSource) -> RemainingLifetimes:
        source = sources.get(kind)
        if source is None:
            tracker = policy_tracker(policy.hooks)
            source = LIFETIME_SOURCES.build(kind, None, tracker, drains_by_itself(settings))
            sources[kind] = source
        return source

    settings = config.migrations
    shadows = [
        ShadowOrder(
            f"{order}-{kind}",
            build_order(order, UniformDraws(_stable_seed(config.seed, pool, 3 + i))),
            lifetimes(kind),
            max_concurrent=settings.max_concurrent,
            duration_s=settings.duration_s,
        )
        for i, (order, kind) in enumerate(settings.compare)
    ]
    hooks = policy.hooks
    return MigrationPlanner(
        pool,
        settings,
        lifetimes(settings.lifetimes),
        _stable_seed(config.seed, pool, 2),
        shadows,
        usage_hooks=hooks if isinstance(hooks, UsageHooks) else None,
    )


def _limit_decision(pool: str, decision: LimitDecision) -> Limit:
    return Limit(
        decision_id=limit_id(pool, decision.job_id, decision.resource, decision.decision_id),
        time=decision.time,
        pool=pool,
        vm_id=decision.job_id,
        resource=decision.resource,
        limit=decision.limit,
        previous=decision.previous,
        policy=decision.recommender,
        reason=decision.explanation(),
        explanation={
            "statistic": decision.statistic,
            "window_s": decision.window_s,
            "half_life_s": decision.half_life_s,
            "margin": decision.margin,
            "model": decision.model,
        },
    )


def _replicas_decision(pool: str, decision: ReplicaDecision) -> Replicas:
    return Replicas(
        decision_id=replicas_id(pool, decision.deployment, decision.digest),
        time=decision.time,
        pool=pool,
        deployment_id=decision.deployment,
        replicas=decision.replicas,
        previous=decision.previous,
        policy="autopilot-horizontal",
        reason=decision.explanation(),
        explanation={
            "observed_replicas": decision.observed_replicas,
            "window_usage": decision.window_usage,
            "statistic": decision.statistic,
            "usage_statistic": decision.usage_statistic,
            "horizon_s": decision.horizon_s,
            "target_utilization": decision.target_utilization,
            "raw": decision.raw,
            "downscale_delay_s": decision.downscale_delay_s,
            "stabilized": decision.stabilized,
            "step": decision.step,
        },
    )
