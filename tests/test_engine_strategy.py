"""The engine's one extension point (EngineStrategy) and the one rule on event times."""

from __future__ import annotations

import hashlib
import math

from lavad.core.engine import (
    Engine,
    EngineConfig,
    Handled,
    Handler,
    Handlers,
    HostShape,
    PlainStrategy,
    PoolRuntime,
    PoolSetup,
)
from lavad.core.input_bounds import NEVER, InputBounds
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.shadow.engine import shadow_engine, shadow_of
from lavad.streams.schema import Decision, Event, VmExit, VmRequest


def _config() -> EngineConfig:
    return EngineConfig(
        policy="bestfit",
        policy_args=validate_policy_args("bestfit", {}),
        pools=PoolSetup(shape=HostShape(16.0, 64.0), initial_hosts=2),
    )


class _Counting(PlainStrategy):
    """Counts what the engine asks of it and turns every exit into nothing."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.handled = 0
        self.advanced = 0

    def handlers(self, plain: Handlers) -> Handlers:
        def ignore_exit(pool: PoolRuntime, event: VmExit, now: float) -> list[Decision]:
            pool.counters["ignored_exit"] += 1
            return []

        replaced: Handler = ignore_exit
        return {**plain, VmExit: replaced}

    def open_pool(self, pool: PoolRuntime) -> PoolRuntime:
        self.opened.append(pool.name)
        return pool

    def handle(self, engine: Engine, event: Event, now: float) -> Handled:
        self.handled += 1
        return engine.decide(event, now)

    def advance(self, engine: Engine, now: float) -> list[Decision]:
        self.advanced += 1
        return engine.decide_timers(now)


def test_a_strategy_picks_handlers_sees_each_pool_open_and_wraps_handle() -> None:
    strategy = _Counting()
    engine = Engine(_config(), strategy)
    placed = engine.handle(VmRequest(1.0, "p", "vm1", cores=4.0, memory_gib=8.0), 1.0)
    assert placed.rejection is None and len(placed.decisions) == 1
    engine.handle(VmExit(2.0, "p", "vm1"), 2.0)
    assert strategy.opened == ["p"] and strategy.handled == 2
    pool = engine.pools["p"]
    assert pool.counters["ignored_exit"] == 1 and "vm1" in pool.cluster.vms
    # Best Fit keeps no timers: advance has nothing due and asks the strategy nothing.
    assert engine.next_deadline == math.inf
    assert engine.advance(10.0) == [] and strategy.advanced == 0


def test_fingerprints_are_those_snapshots_were_written_under() -> None:
    config = _config()
    plain = hashlib.sha256(repr(config).encode()).hexdigest()[:16]
    assert Engine(config).fingerprint == plain
    shadow = shadow_engine(config)
    actual = shadow_of(shadow).follower.config
    both = hashlib.sha256(f"shadow:{config!r}:{actual!r}".encode()).hexdigest()[:16]
    assert shadow.fingerprint == both != plain


def test_the_time_rule_by_hand() -> None:
    bounds = InputBounds(max_time=1_000.0, max_ahead_s=100.0, max_behind_s=10.0)
    refusal = bounds.time_refusal
    assert refusal(1_000.0, NEVER, "p") is None  # a first event: max_time only
    assert "max_time" in (refusal(1_000.5, NEVER, "p") or "")
    assert "max_time" in (refusal(math.nan, 500.0, "p") or "")
    assert refusal(600.0, 500.0, "p") is None
    assert "max_ahead_s" in (refusal(600.5, 500.0, "p") or "")
    assert refusal(490.0, 500.0, "p") is None  # late, within max_behind_s
    assert "max_behind_s" in (refusal(489.5, 500.0, "p") or "")
    assert InputBounds(max_ahead_s=0.0).time_refusal(1e9, 0.0, "p") is None  # 0: no bound


def test_a_refusal_for_time_is_told_apart() -> None:
    engine = Engine(_config())
    engine.handle(VmRequest(1.0, "p", "vm1", cores=1.0, memory_gib=1.0), 1.0)
    absurd = engine.handle(VmRequest(1e12, "p", "vm2", cores=1.0, memory_gib=1.0), 1e12)
    assert absurd.time_refused
    duplicate = engine.handle(VmRequest(2.0, "p", "vm1", cores=1.0, memory_gib=1.0), 2.0)
    assert duplicate.rejection is not None and not duplicate.time_refused
