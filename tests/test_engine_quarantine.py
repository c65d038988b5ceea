"""A defect in one pool quarantines that pool; the others decide as if it never was.

The defect is injected by a small strategy (``live_support.DefectAt``): the request
handler books the VM and then raises, as a defect met half-way would, so the
pool's state is left half-changed. The events are the bundled Azure slice as
two pools.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import pytest
from live_support import DefectAt, OpeningFails, pool_events
from support import PROJECT_ROOT

from lavad.core.engine import Engine, EngineConfig, Handled, PoolRuntime
from lavad.core.input_bounds import PoolNames
from lavad.core.placement.lifetime import LifetimeTracker
from lavad.core.quarantine import MAX_ERROR_CHARS, DefectPolicy, Quarantine
from lavad.daemon.config_file import ConfigError, validate_config
from lavad.daemon.live.shell import live_engine_config
from lavad.daemon.live.state_codec import StateCodecError, dumps, loads
from lavad.daemon.settings import Settings, load_settings
from lavad.streams.codec import encode
from lavad.streams.schema import Event, VmRequest

# Three hours of the slice: LAS's first VMs outlive their predictions.
EVENTS = pool_events(["east", "west"], 14_000)


def _failing_request() -> str:
    """East's first request whose time finds a timer due that decides (a VM outliving
    its prediction): the defect then fails the event after those timers decided."""
    engine = Engine(_config())
    for event in EVENTS:
        if event.pool != "east":
            continue
        if isinstance(event, VmRequest) and engine.advance(event.time):
            return event.vm_id
        engine.handle(event, event.time)
    raise AssertionError("no timer decided on a request of the slice")


def _config(on_defect: DefectPolicy = "quarantine") -> EngineConfig:
    """LAS (it has timers: refits, VMs outliving their predictions) on grown hosts."""
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    config = settings.engine_config("las", trace_has_hosts=False)
    return dataclasses.replace(config, on_defect=on_defect)


FAILING = _failing_request()


def _run(engine: Engine, events: Iterable[Event]) -> list[tuple[Event, Handled]]:
    return [(event, engine.handle(event, event.time)) for event in events]


def _decided(results: list[tuple[Event, Handled]], pool: str) -> list[bytes]:
    return [encode(d) for _, handled in results for d in handled.decisions if d.pool == pool]


def test_stop_lets_the_defect_out_of_the_engine() -> None:
    engine = Engine(_config(on_defect="stop"), DefectAt("east", FAILING))
    with pytest.raises(RuntimeError, match="injected defect"):
        _run(engine, EVENTS)


def test_a_defect_quarantines_its_pool_and_the_other_pool_decides_as_if_alone() -> None:
    engine = Engine(_config(), DefectAt("east", FAILING))
    results = _run(engine, EVENTS)
    alone = _run(Engine(_config()), [e for e in EVENTS if e.pool == "west"])
    assert _decided(results, "west") == _decided(alone, "west")

    east = [(event, handled) for event, handled in results if event.pool == "east"]
    at = next(i for i, (event, _) in enumerate(east) if getattr(event, "vm_id", None) == FAILING)
    # Before the defect east decided as it does without one.
    clean = _run(Engine(_config()), [event for event, _ in east[:at]])
    assert _decided(east[:at], "east") == _decided(clean, "east")
    assert all(handled.rejection is None for _, handled in east[:at])
    failed = east[at][1]
    # What the timers due at its time decided is published; the event's own is not.
    timers = Engine(_config())
    _run(timers, [event for event, _ in east[:at]])
    due = [encode(d) for d in timers.advance(east[at][0].time)]
    assert due
    assert [encode(d) for d in failed.decisions] == due
    assert failed.rejection is not None and failed.rejection.stage == "defect"
    assert "RuntimeError: injected defect after booking" in failed.rejection.reason
    later = east[at + 1 :]
    assert len(later) > 1_000
    assert {h.rejection.stage for _, h in later if h.rejection is not None} == {"quarantined"}
    assert all(h.rejection is not None and not h.decisions for _, h in later)

    quarantine = engine.pools["east"].quarantine
    assert quarantine is not None
    assert quarantine.during == "vm.request event"
    assert quarantine.time == east[at][0].time
    assert "half_way" in quarantine.trace
    assert engine.take_defects() == [("east", quarantine)]
    assert engine.take_defects() == []
    assert engine.summary(EVENTS[-1].time)["east"] == {
        "quarantine": {
            "time": quarantine.time,
            "during": "vm.request event",
            "error": quarantine.error,
        }
    }


def test_the_time_check_comes_before_the_quarantine() -> None:
    """An absurd time is refused as such, so the shell does not let it move the watermark."""
    engine = Engine(_config(), DefectAt("east", FAILING))
    _run(engine, EVENTS)
    far = VmRequest(time=1e20, pool="east", vm_id="far", cores=1.0, memory_gib=1.0)
    handled = engine.handle(far, far.time)
    assert handled.time_refused
    near = dataclasses.replace(far, time=EVENTS[-1].time)
    refused = engine.handle(near, near.time).rejection
    assert refused is not None and refused.stage == "quarantined"
    assert "rebuild its state from the input topics" in refused.reason


def test_a_defect_in_a_pools_timers_quarantines_it_and_the_other_pools_timers_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LAS refits every hour of event time: east's refit fails, west's still runs."""
    half = len(EVENTS) // 2
    engine = Engine(_config())
    _run(engine, EVENTS[:half])
    hooks = engine.pools["east"].policy.hooks
    assert isinstance(hooks, LifetimeTracker)

    def failing(*_: object) -> None:
        raise ZeroDivisionError("injected in the refit")

    monkeypatch.setattr(hooks, "advance", failing)
    # Past both pools' next refit.
    later = max(hooks.next_deadline, engine.pools["west"].policy.hooks.next_deadline) + 1.0
    decided = engine.advance(later)
    assert engine.pools["east"].quarantine is not None
    assert engine.pools["east"].quarantine.during == "timers"
    # The time its timers ran to, past its last event.
    assert engine.pools["east"].quarantine.time == later
    assert all(d.pool == "west" for d in decided)
    assert engine.pools["west"].policy.hooks.next_deadline > later
    # A quarantined pool's timers are never due again.
    assert engine.next_deadline == min(
        engine.pools["west"].policy.hooks.next_deadline,
        engine.pools["west"].migrations.next_deadline,
    )
    ((pool, quarantine),) = engine.take_defects()
    assert pool == "east" and quarantine.error == "ZeroDivisionError: injected in the refit"


def test_the_quarantine_survives_a_snapshot_and_the_restored_pool_refuses_records() -> None:
    engine = Engine(_config(), DefectAt("east", FAILING))
    _run(engine, EVENTS)
    before = engine.pools["east"].quarantine
    restored = Engine(_config())
    restored.adopt_pools(loads(dumps(engine.take_pools(["east", "west"]))))
    assert restored.pools["east"].quarantine == before
    assert restored.pools["west"].quarantine is None
    after = EVENTS[-1].time
    event = VmRequest(time=after, pool="east", vm_id="after", cores=1.0, memory_gib=1.0)
    rejection = restored.handle(event, after).rejection
    assert rejection is not None and rejection.stage == "quarantined"
    assert loads(dumps(before)) == before


def test_a_quarantined_pool_is_a_husk_whatever_the_defect_left_in_its_state() -> None:
    """The defect leaves a value the snapshot codec refuses: had the quarantined pool kept
    its state, every snapshot of its partition would fail and the daemon would stop at
    each restart. Its state gave way to a husk, so the snapshot is written."""
    unwritable = object()
    with pytest.raises(StateCodecError):
        dumps({"left by the defect": unwritable})
    engine = Engine(_config(), DefectAt("east", FAILING, leaves=unwritable))
    results = _run(engine, EVENTS)
    failed_at = next(e.time for e, _ in results if getattr(e, "vm_id", None) == FAILING)
    east = engine.pools["east"]
    assert east.quarantine is not None
    assert "left by the defect" not in east.counters
    # The husk holds no VM and keeps the failed pool's clock for its time checks.
    assert not east.cluster.vms
    assert east.clock == failed_at
    restored = Engine(_config())
    restored.adopt_pools(loads(dumps(engine.take_pools(["east", "west"]))))
    assert restored.pools["east"].quarantine == east.quarantine
    assert restored.pools["east"].clock == failed_at
    assert restored.pools["west"].cluster.vms


class NoRoomForAHusk(DefectAt):
    """``DefectAt``, and opening the pool again (its husk) raises."""

    def open_pool(self, pool: PoolRuntime) -> PoolRuntime:
        if pool.name == self.pool and self.opened:
            raise MemoryError("injected: no room for the husk")
        self.opened = self.opened or pool.name == self.pool
        return pool

    opened = False


def test_a_pool_whose_husk_cannot_open_keeps_its_failed_state_and_says_so() -> None:
    engine = Engine(_config(), NoRoomForAHusk("east", FAILING))
    _run(engine, EVENTS)
    east = engine.pools["east"]
    assert east.quarantine is not None
    assert east.cluster.vms  # the failed state, not a husk
    assert east.quarantine.trace.endswith(
        "The pool's failed state is kept: opening its husk raised"
        " MemoryError: injected: no room for the husk"
    )
    assert "RuntimeError: injected defect" in east.quarantine.trace
    assert engine.take_defects() == [("east", east.quarantine)]


def test_a_pool_whose_opening_fails_is_refused_and_the_other_pool_decides_as_if_alone() -> None:
    with pytest.raises(MemoryError, match="injected while opening"):
        _run(Engine(_config(on_defect="stop"), OpeningFails("east", 1)), EVENTS)
    engine = Engine(_config(), OpeningFails("east", 1))
    results = _run(engine, EVENTS)
    alone = _run(Engine(_config()), [e for e in EVENTS if e.pool == "west"])
    assert _decided(results, "west") == _decided(alone, "west")
    east = [handled for event, handled in results if event.pool == "east"]
    assert all(not handled.decisions for handled in east)
    first, *later = [handled.rejection for handled in east]
    assert first is not None and first.stage == "defect"
    assert "defect in lavad (opening the pool of pool 'east'): MemoryError" in first.reason
    assert len(later) > 1_000
    assert all(r is not None and r.stage == "quarantined" for r in later)
    # Opened once only: the strategy would open it on a second try.
    assert "east" not in engine.pools
    ((pool, quarantine),) = engine.take_defects()
    assert pool == "east" and engine.quarantined() == {"east": quarantine}
    # Its partition moved: the instance that takes it opens it again.
    assert engine.take_pools(["east"]) == {}
    assert engine.quarantined() == {}
    request = VmRequest(time=EVENTS[-1].time, pool="east", vm_id="x", cores=1.0, memory_gib=1.0)
    assert engine.handle(request, request.time).rejection is None


def test_a_pool_whose_opening_failed_counts_against_max_pools() -> None:
    config = dataclasses.replace(_config(), pool_names=PoolNames(allow=("*",), max_pools=2))
    engine = Engine(config, OpeningFails("east", 1))
    _run(engine, EVENTS)
    late = VmRequest(time=EVENTS[-1].time, pool="north", vm_id="n", cores=1.0, memory_gib=1.0)
    refused = engine.handle(late, late.time).rejection
    assert refused is not None and refused.stage == "pool"
    assert "would be pool 3 of this instance (pools.max_pools = 2)" in refused.reason


def test_what_a_defect_does_leaves_the_fingerprint_alone() -> None:
    """Switching live.on_defect keeps the snapshots: it changes no decision."""
    assert Engine(_config(on_defect="stop")).fingerprint == Engine(_config()).fingerprint


def test_the_reason_is_bounded_and_the_trace_keeps_its_end() -> None:
    try:
        raise ValueError("x" * 100_000)
    except ValueError as exc:
        quarantine = Quarantine.of(exc, 5.0, "timers")
    assert len(quarantine.error) == MAX_ERROR_CHARS
    assert quarantine.trace.endswith("x\n")
    assert math.isfinite(quarantine.time)


def test_the_live_daemon_quarantines_by_default_and_the_setting_is_checked() -> None:
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    assert live_engine_config(settings).on_defect == "quarantine"
    assert settings.engine_config(trace_has_hosts=False).on_defect == "stop"
    stopping = settings.model_copy(
        update={"live": settings.live.model_copy(update={"on_defect": "stop"})}
    )
    assert live_engine_config(stopping).on_defect == "stop"
    with pytest.raises(ConfigError, match=r"live\.on_defect"):
        validate_config(Settings, {"live": {"on_defect": "ignore"}})
