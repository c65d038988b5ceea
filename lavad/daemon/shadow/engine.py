"""Two sides of one pool: the actual cluster, following the existing scheduler, and lavad's.

Shadow mode is a strategy the core ``Engine`` takes at construction
(``Engine(config, Shadow(config))``, or ``shadow_engine(config)``): the
engine keeps its interface, so a shell takes it and changes nothing else.

* the **actual** side is a second engine, built with the ``Following``
  strategy: it books every ``vm.placed`` where the existing scheduler put it,
  sees the exits and the hosts, and never places anything itself. A
  ``vm.request`` it sees is a request the existing scheduler has not placed
  yet: counted as a placement failure until its ``vm.placed`` arrives (or
  for good, if the VM exits unplaced). The ``Shadow`` strategy owns it and
  hands it every event before lavad's side.
* **lavad's** side is the engine the strategy is passed to, with the
  configured policy: a ``vm.request`` is placed as usual, and a
  ``vm.placed`` of a VM it has not seen requested is placed as the request it
  answers (same shape, tenant, deployment, features). Exits, hosts, usage
  and deployments as usual.

Every decision of lavad's side is *advice*: its id starts ``advice/``, its
reason ``advice:``, its explanation carries ``"advice": true`` (and, for a
VM the existing scheduler placed, where it went), and the live shell routes
it to the shadow topic, never to the placements topic. The actual side's
own decisions (it has no timers that decide, but a drain would plan) are
counted and dropped: lavad does not act on the actual cluster. A limit of
that: the stream has no event for the existing scheduler's own migrations,
so on a ``host.drain`` the actual side's planner empties the host as First
Fit would (moves counted in ``actual_decisions_dropped``, never published),
which may not be what the existing scheduler did.

Agreement, per VM both sides placed: the same host id, and (when lavad's
policy keeps LAVA host classes) the same class, both read in lavad's pool
after the placement: the class lavad gave its own host against the class
lavad's pool gives the host the existing scheduler chose.

A pool's two sides are one ``ShadowPool`` (lavad's ``PoolRuntime`` with the
actual one attached), so a partition snapshot holds and restores both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from lavad.core.engine import (
    Engine,
    EngineConfig,
    Handled,
    Handlers,
    InvalidEvent,
    PlainStrategy,
    PoolRuntime,
    book_placed,
    forget_least_recent,
    placed_host,
)
from lavad.core.limits.service import LimitsConfig
from lavad.core.migrations.config import MigrationsConfig
from lavad.core.placement.lava import NO_CLASS, LavaHosts
from lavad.core.placement.registry import validate_policy_args
from lavad.streams.schema import (
    Decision,
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
    Placement,
    UsageSample,
    VmExit,
    VmPlaced,
    VmRequest,
)

ADVICE_PREFIX: Final = "advice/"
ADVICE_REASON: Final = "advice: "
# The policy of the actual side: it never places (its VMs come placed), so
# the cheapest one, without hooks that learn.
ACTUAL_POLICY: Final = "firstfit"
# Events only lavad's side has a use for (the actual side keeps no usage
# model and admits nothing).
_LAVAD_ONLY: Final = (UsageSample, DeploymentArrival, DeploymentScaleOut, DeploymentScaleIn)

_P = TypeVar("_P", bound=PoolRuntime)


@dataclass(slots=True)
class FollowedPool(PoolRuntime):
    """The actual cluster's pool: requests awaiting the existing scheduler's placement."""

    # VM id -> time of its request, while no vm.placed has answered it.
    awaited: dict[str, float] = field(default_factory=dict)

    def forgotten(self) -> dict[str, int]:
        """The refused VMs, and the requests awaited past ``[pools] max_refused``. An
        awaited request is remembered as refused too (its exit may come first), so a
        flood of them is counted under both."""
        return {
            **PoolRuntime.forgotten(self),
            "awaited_requests": self.counters["awaited_forgotten"],
        }


@dataclass(slots=True)
class Agreement:
    """How often lavad would have done what the existing scheduler did, per VM both placed."""

    compared: int = 0
    same_host: int = 0
    # Only when lavad's policy keeps LAVA host classes.
    class_compared: int = 0
    same_class: int = 0
    # Placed by the existing scheduler, refused by lavad's side (and the reverse).
    actual_only: int = 0
    lavad_only: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "same_host_rate": self.same_host / self.compared if self.compared else None,
            "same_class_rate": (
                self.same_class / self.class_compared if self.class_compared else None
            ),
        }


@dataclass(slots=True)
class ShadowPool(PoolRuntime):
    """Lavad's side of a pool (the ``PoolRuntime`` fields) with the actual side attached."""

    actual: FollowedPool | None = None
    # lavad's host (None: refused) for VMs requested, not yet placed by the existing scheduler.
    advised: dict[str, str | None] = field(default_factory=dict)
    agreement: Agreement = field(default_factory=Agreement)
    # Decisions the actual side made (drain plans, ...): never published.
    actual_decisions_dropped: int = 0

    def drop_samples_before(self, cutoff: float) -> int:
        """Both sides' samples: the comparison reads the two series over the same times."""
        dropped = self.metrics.drop_samples_before(cutoff)
        if self.actual is not None:
            dropped += self.actual.metrics.drop_samples_before(cutoff)
        return dropped


def _extend(base: PoolRuntime, kind: type[_P], **extra: Any) -> _P:
    """``base`` as an instance of the subclass ``kind`` (same field values, plus ``extra``)."""
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(PoolRuntime)}
    return kind(**values, **extra)


def actual_config(config: EngineConfig) -> EngineConfig:
    """The actual side's engine: lavad's hosts and metrics, no policy of consequence.

    Same pools setup (the actual cluster starts with the hosts lavad's side
    starts with), but it never grows (its hosts are those host.up announces
    and those present from the start), keeps no limits, admits nothing and
    drains nothing by itself: it only mirrors what the existing scheduler did.
    """
    return dataclasses.replace(
        config,
        policy=ACTUAL_POLICY,
        policy_args=validate_policy_args(ACTUAL_POLICY, {}),
        pool_policies=(),
        pools=dataclasses.replace(config.pools, grow_on_demand=False),
        limits=LimitsConfig(recommender="off"),
        admission=None,
        migrations=MigrationsConfig(),
    )


class Following(PlainStrategy):
    """The actual cluster's strategy: books what the existing scheduler placed; places nothing.

    A request the existing scheduler never places may never exit either, so
    the requests awaited are bounded as the refused are (``max_awaited``:
    ``[pools] max_refused``), the least recent half forgotten past it.
    """

    def __init__(self, max_awaited: int) -> None:
        self.max_awaited = max_awaited

    def handlers(self, plain: Handlers) -> Handlers:
        placed, exited = plain[VmPlaced], plain[VmExit]
        bound = self.max_awaited

        def on_request(pool: PoolRuntime, event: VmRequest, now: float) -> list[Decision]:
            return _on_awaited(pool, event, now, bound)

        def on_placed(pool: PoolRuntime, event: VmPlaced, now: float) -> list[Decision]:
            assert isinstance(pool, FollowedPool)
            host = placed_host(pool, event)
            if pool.awaited.pop(event.vm_id, None) is not None:
                # Its request was counted (and counted unplaced) when it came.
                pool.metrics.unfit_retryable -= 1
                pool.refused.pop(event.vm_id, None)
                return book_placed(pool, host, event, now)
            return placed(pool, event, now)

        def on_exit(pool: PoolRuntime, event: VmExit, now: float) -> list[Decision]:
            assert isinstance(pool, FollowedPool)
            if pool.awaited.pop(event.vm_id, None) is not None:
                pool.counters["exit_never_placed"] += 1
            return exited(pool, event, now)

        return {**plain, VmRequest: on_request, VmPlaced: on_placed, VmExit: on_exit}

    def open_pool(self, pool: PoolRuntime) -> PoolRuntime:
        return _extend(pool, FollowedPool)


def _on_awaited(pool: PoolRuntime, event: VmRequest, now: float, bound: int) -> list[Decision]:
    """A request the existing scheduler has not placed (yet): counted unplaced until it does."""
    assert isinstance(pool, FollowedPool)
    vm_id = event.vm_id
    if vm_id in pool.cluster.vms:
        raise InvalidEvent(f"duplicate VM id {vm_id!r}: already placed")
    if vm_id in pool.awaited:
        pool.counters["repeated_request"] += 1
        return []
    pool.metrics.observe_request((event.cores, event.memory_gib, event.disk_gib, event.gpus), now)
    pool.awaited[vm_id] = now
    forgotten = forget_least_recent(pool.awaited, bound)
    if forgotten:
        # A forgotten request's late vm.placed is booked as one never requested.
        pool.counters["awaited_forgotten"] += forgotten
    # Unplaced until its vm.placed: absorbed like a refused VM's if it exits first.
    pool.remember_refused(vm_id, 1, bound)
    pool.metrics.unfit_retryable += 1
    return []


class Shadow(PlainStrategy):
    """Lavad's side (the engine it is passed to) beside the actual side (``follower``).

    ``config`` is lavad's side's configuration; ``actual`` the actual side's
    (by default ``actual_config(config)``).
    """

    def __init__(self, config: EngineConfig, actual: EngineConfig | None = None) -> None:
        followed = actual if actual is not None else actual_config(config)
        self.follower = Engine(followed, Following(followed.pool_names.max_refused))

    def identity(self, config: EngineConfig) -> str:
        """Both sides' configurations: a snapshot of a plain engine is not a shadow one."""
        actual = dataclasses.replace(self.follower.config, on_defect="stop")
        return f"shadow:{config!r}:{actual!r}"

    def handlers(self, plain: Handlers) -> Handlers:
        request = plain[VmRequest]

        def on_placed_elsewhere(pool: PoolRuntime, event: VmPlaced, now: float) -> list[Decision]:
            """A VM the existing scheduler placed: lavad places its request (unless it saw it)."""
            if event.vm_id in pool.cluster.vms or event.vm_id in pool.refused:
                return []  # requested before (vm.request): lavad's side already decided
            answered = VmRequest(
                time=event.time,
                pool=event.pool,
                vm_id=event.vm_id,
                cores=event.cores,
                memory_gib=event.memory_gib,
                disk_gib=event.disk_gib,
                gpus=event.gpus,
                tenant=event.tenant,
                deployment=event.deployment,
                flavor=event.flavor,
                features=event.features,
            )
            return request(pool, answered, now)

        return {**plain, VmPlaced: on_placed_elsewhere}

    def open_pool(self, pool: PoolRuntime) -> PoolRuntime:
        # The actual side may not have the pool yet: lavad's side saw it first (a usage sample).
        actual = self.follower.pool(pool.name)
        assert isinstance(actual, FollowedPool)
        return _extend(pool, ShadowPool, actual=actual)

    # ------------------------------------------------------------- interface

    def handle(self, engine: Engine, event: Event, now: float) -> Handled:
        if isinstance(event, _LAVAD_ONLY):
            handled = engine.decide(event, now)
            return Handled(_advised(handled.decisions), handled.rejection)
        followed = self.follower.handle(event, now)
        self._share_defects(engine)
        if followed.rejection is not None:
            # The actual cluster refused it (unknown host, duplicate VM, absurd
            # time): lavad's side mirrors that cluster, so it skips it too.
            return Handled([], followed.rejection)
        handled = engine.decide(event, now)
        pool = engine.pools.get(event.pool)
        if not isinstance(pool, ShadowPool):
            return handled  # refused before the pool opened
        pool.actual_decisions_dropped += len(followed.decisions)
        if isinstance(event, VmPlaced):
            _compare(pool, event, handled.decisions)
        elif isinstance(event, VmRequest):
            placed = _placement_of(event.vm_id, handled.decisions)
            if placed is not None:
                pool.advised[event.vm_id] = placed.host_id
        elif isinstance(event, VmExit) and pool.advised.pop(event.vm_id, None) is not None:
            # Placed by lavad, never by the existing scheduler (its entry went at vm.placed).
            pool.agreement.lavad_only += 1
        return Handled(_advised(handled.decisions, event), handled.rejection)

    def advance(self, engine: Engine, now: float) -> list[Decision]:
        dropped = self.follower.advance(now)
        self._share_defects(engine)
        if dropped:
            for pool in engine.pools.values():
                if isinstance(pool, ShadowPool):
                    pool.actual_decisions_dropped += sum(1 for d in dropped if d.pool == pool.name)
        return _advised(engine.decide_timers(now))

    def _share_defects(self, engine: Engine) -> None:
        """A pool the actual side quarantined is quarantined on lavad's side too: it is one
        pool, and the shell counts, logs and reports lavad's side's."""
        for name, quarantine in self.follower.take_defects():
            engine.quarantine_pool(name, quarantine)
            # The actual side's pool is now its husk: lavad's side holds that one, even
            # where lavad's side was quarantined first (and so not opened again).
            pool, actual = engine.pools.get(name), self.follower.pools.get(name)
            if isinstance(pool, ShadowPool) and isinstance(actual, FollowedPool):
                pool.actual = actual

    @property
    def next_deadline(self) -> float:
        return self.follower.next_deadline

    def take_pools(self, names: list[str]) -> None:
        self.follower.take_pools(names)

    def adopt_pools(self, pools: Mapping[str, PoolRuntime]) -> None:
        actual: dict[str, PoolRuntime] = {}
        for name, pool in pools.items():
            if not isinstance(pool, ShadowPool) or pool.actual is None:
                raise ValueError(f"pool {name!r} is not a shadow pool (both sides)")
            actual[name] = pool.actual
        self.follower.adopt_pools(actual)

    def sides(self, engine: Engine, end: float) -> dict[str, dict[str, dict[str, Any]]]:
        """Each pool's metrics summary per side, and the agreement, up to ``end``."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, pool in sorted(engine.pools.items()):
            assert isinstance(pool, ShadowPool) and pool.actual is not None
            out[name] = {
                "actual": Engine.pool_summary(pool.actual, end),
                "lavad": Engine.pool_summary(pool, end),
                "agreement": {
                    **pool.agreement.as_dict(),
                    "actual_decisions_dropped": pool.actual_decisions_dropped,
                },
            }
        return out


def shadow_engine(config: EngineConfig, actual: EngineConfig | None = None) -> Engine:
    """An engine in shadow mode: lavad's side configured by ``config``, the actual side beside."""
    return Engine(config, Shadow(config, actual))


def shadow_of(engine: Engine) -> Shadow:
    """The shadow strategy of an engine built in shadow mode."""
    strategy = engine.strategy
    if not isinstance(strategy, Shadow):
        raise TypeError(f"the engine runs {type(strategy).__name__}, not shadow mode")
    return strategy


def _compare(pool: ShadowPool, event: VmPlaced, decisions: list[Decision]) -> None:
    placed = _placement_of(event.vm_id, decisions)
    if placed is not None:
        lavad_host = placed.host_id
    elif event.vm_id in pool.advised:
        lavad_host = pool.advised.pop(event.vm_id)
    else:
        return  # lavad's side never saw its request (refused, or another pool)
    agreement = pool.agreement
    if lavad_host is None:
        agreement.actual_only += 1
        return
    agreement.compared += 1
    agreement.same_host += lavad_host == event.host_id
    hooks = pool.policy.hooks
    if isinstance(hooks, LavaHosts):
        mine = _host_class(pool, hooks, lavad_host)
        theirs = _host_class(pool, hooks, event.host_id)
        agreement.class_compared += 1
        agreement.same_class += mine == theirs


def _advised(decisions: list[Decision], event: Event | None = None) -> list[Decision]:
    """Mark lavad's side's decisions as advice (id, reason, explanation)."""
    actual_host = event.host_id if isinstance(event, VmPlaced) else None
    return [_as_advice(d, actual_host) for d in decisions]


def _placement_of(vm_id: str, decisions: list[Decision]) -> Placement | None:
    for decision in decisions:
        if isinstance(decision, Placement) and decision.vm_id == vm_id:
            return decision
    return None


def _host_class(pool: PoolRuntime, hooks: LavaHosts, host_id: str) -> int:
    index = pool.cluster.host_index.get(host_id)
    if index is None or index >= len(hooks.host_class):
        return NO_CLASS
    return int(hooks.host_class[index])


def _as_advice(decision: Decision, actual_host: str | None) -> Decision:
    explanation: dict[str, Any] = {**decision.explanation, "advice": True}
    if actual_host is not None and isinstance(decision, Placement):
        explanation["actual_host_id"] = actual_host
    return dataclasses.replace(
        decision,
        decision_id=ADVICE_PREFIX + decision.decision_id,
        reason=ADVICE_REASON + decision.reason,
        explanation=explanation,
    )


def without_advice(decision: dict[str, Any]) -> dict[str, Any]:
    """A decision as its record reads without the advice marking (to compare with a replay)."""
    plain = dict(decision)
    plain["decision_id"] = str(plain["decision_id"]).removeprefix(ADVICE_PREFIX)
    plain["reason"] = str(plain["reason"]).removeprefix(ADVICE_REASON)
    explanation = dict(plain.get("explanation", {}))
    explanation.pop("advice", None)
    explanation.pop("actual_host_id", None)
    plain["explanation"] = explanation
    return plain
