"""What a pool keeps is bounded: a flood of requests or ids cannot take every byte.

Every host keeps its column for as long as its pool lives. Without a bound a
pool grown on demand opens a host for each request that fits none, and a
stream of host.up records with new ids adds one each: memory and each
placement's scan grow with the flood. Likewise a VM refused for good may
never exit, and the pool remembered each one for ever. The cases replay the
bundled real slices under small bounds.
"""

from __future__ import annotations

from pathlib import Path

from lavad.core.engine import Engine, EngineConfig, HostShape, PoolSetup, forget_least_recent
from lavad.core.input_bounds import PoolNames
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.shadow.engine import FollowedPool, shadow_engine, shadow_of
from lavad.streams.adapters import open_trace
from lavad.streams.schema import HostDown, HostUp, Placement, VmRequest

ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"
OPENB_SLICE = ROOT / "data" / "alibaba-openb-slice"
REQUESTS = 400


def _config(pools: PoolSetup, max_refused: int = 1_000_000) -> EngineConfig:
    return EngineConfig(
        policy="bestfit",
        policy_args=validate_policy_args("bestfit", {"tie_break": "first"}),
        pools=pools,
        pool_names=PoolNames(max_refused=max_refused),
    )


def _engine(pools: PoolSetup) -> Engine:
    return Engine(_config(pools))


def _grown(max_hosts: int) -> tuple[Engine, list[Placement]]:
    """The slice's first ``REQUESTS`` requests (and the exits among them), grown on demand."""
    engine = _engine(
        PoolSetup(shape=HostShape(48.0, 192.0), grow_on_demand=True, max_hosts=max_hosts)
    )
    placements: list[Placement] = []
    requests = 0
    for event in open_trace(AZURE_SLICE, seed=0).events():
        if isinstance(event, VmRequest):
            requests += 1
            if requests > REQUESTS:
                break
        handled = engine.handle(event, event.time)
        assert handled.rejection is None, handled.rejection
        placements += [d for d in handled.decisions if isinstance(d, Placement)]
    return engine, placements


def test_a_pool_grown_on_demand_stops_at_the_bound_and_refuses_for_now() -> None:
    free, _ = _grown(100_000)
    grown = free.pools["default"].cluster.n_hosts
    bound = grown // 2
    assert bound >= 2, grown  # the slice's requests need more hosts than the bound
    engine, placements = _grown(bound)
    assert engine.pools["default"].cluster.n_hosts == bound
    refused = [p for p in placements if p.host_id is None]
    assert refused
    for placement in refused:
        # A host of the shape would hold it: the pool may take it once VMs exit.
        assert placement.retryable
        assert f"hosts.max_hosts = {bound}" in placement.reason
    assert len(placements) - len(refused) < REQUESTS


def test_a_host_up_past_the_bound_is_dead_lettered_naming_it() -> None:
    bound = 100
    engine = _engine(PoolSetup(max_hosts=bound))
    reasons = []
    ups = 0
    for event in open_trace(OPENB_SLICE, seed=0).events():
        if not isinstance(event, HostUp):
            continue
        ups += 1
        handled = engine.handle(event, event.time)
        if handled.rejection is not None:
            reasons.append(handled.rejection.reason)
    assert ups > bound
    assert len(reasons) == ups - bound
    assert all(f"holds {bound} hosts, hosts.max_hosts = {bound}" in r for r in reasons)
    assert engine.pools["default"].cluster.n_hosts == bound


def test_a_host_that_went_down_comes_back_at_the_bound() -> None:
    engine = _engine(PoolSetup(max_hosts=1))
    up = HostUp(time=0.0, pool="p", host_id="h", cores=8.0, memory_gib=32.0)
    assert engine.handle(up, 0.0).rejection is None
    assert engine.handle(HostDown(time=1.0, pool="p", host_id="h"), 1.0).rejection is None
    # Its column is kept while it is down: a new id would be a second one.
    other = HostUp(time=2.0, pool="p", host_id="g", cores=8.0, memory_gib=32.0)
    refused = engine.handle(other, 2.0).rejection
    assert refused is not None and "hosts.max_hosts = 1" in refused.reason
    back = HostUp(time=3.0, pool="p", host_id="h", cores=8.0, memory_gib=32.0)
    assert engine.handle(back, 3.0).rejection is None
    assert engine.pools["p"].cluster.hosts_up == 1


def _fixed_fleet(max_refused: int) -> tuple[Engine, list[Placement], list[str]]:
    """The whole slice on 20 hosts that never grow: most requests are refused."""
    engine = Engine(_config(PoolSetup(shape=HostShape(48.0, 192.0), initial_hosts=20), max_refused))
    placements: list[Placement] = []
    dead: list[str] = []
    for event in open_trace(AZURE_SLICE, seed=0).events():
        handled = engine.handle(event, event.time)
        placements += [d for d in handled.decisions if isinstance(d, Placement)]
        if handled.rejection is not None:
            dead.append(handled.rejection.reason)
        assert len(engine.pools["default"].refused) <= max_refused
    return engine, placements, dead


def test_a_pool_remembers_at_most_max_refused_vms_and_dead_letters_the_forgotten_exits() -> None:
    bound = 64
    whole, placements, dead = _fixed_fleet(1_000_000)
    refused = sum(p.host_id is None for p in placements)
    assert refused > 4 * bound and not dead
    absorbed = whole.pools["default"].counters["exit_of_unplaced_vm"]
    # The slice ends before some refused VMs exit: they stay remembered.
    assert absorbed + len(whole.pools["default"].refused) == refused
    engine, bounded, dead = _fixed_fleet(bound)
    counters = engine.pools["default"].counters
    # The decisions do not change: only what the pool remembers of the refused.
    assert bounded == placements
    forgotten = counters["refused_forgotten"]
    assert 0 < len(dead) <= forgotten
    # Each exit of a refused VM is absorbed, or dead-lettered as unknown once
    # the VM is forgotten: none is lost.
    assert all(reason.startswith("exit of unknown VM") for reason in dead)
    assert counters["exit_of_unplaced_vm"] + len(dead) == absorbed


def test_remember_refused_forgets_the_least_recently_refused_half() -> None:
    engine = _engine(PoolSetup(max_hosts=1))
    up = HostUp(time=0.0, pool="p", host_id="h", cores=8.0, memory_gib=32.0)
    engine.handle(up, 0.0)
    pool = engine.pools["p"]
    for vm in "abcd":
        pool.remember_refused(vm, 1, 4)
    assert list(pool.refused) == ["a", "b", "c", "d"]
    # "b" refused again moves to the end: "a" is now the least recent.
    pool.refused.pop("b")
    pool.remember_refused("b", 2, 4)
    # A fifth is one past the bound: 5 - ceil(4 / 2) = 3 go (a, c, d), 2 stay.
    pool.remember_refused("e", 1, 4)
    assert pool.refused == {"b": 2, "e": 1}
    assert pool.counters["refused_forgotten"] == 3
    # A bound of one keeps the VM just refused.
    pool.remember_refused("f", 1, 1)
    assert pool.refused == {"f": 1}


def test_shadow_modes_awaited_requests_are_bounded_too() -> None:
    """The existing scheduler places none of the slice's requests: each is awaited."""
    bound = 64
    engine = shadow_engine(
        _config(PoolSetup(shape=HostShape(48.0, 192.0), initial_hosts=440), bound)
    )
    dead = []
    for event in open_trace(AZURE_SLICE, seed=0).events():
        handled = engine.handle(event, event.time)
        if handled.rejection is not None:
            dead.append(handled.rejection.reason)
        actual = shadow_of(engine).follower.pools["default"]
        assert isinstance(actual, FollowedPool)
        assert len(actual.awaited) <= bound and len(actual.refused) <= bound
    assert actual.counters["awaited_forgotten"] > 0
    # An exit of a forgotten request is dead-lettered as unknown, never lost.
    assert dead and all(reason.startswith("exit of unknown VM") for reason in dead)


def test_absurd_bounds_hold_nothing_back_and_cost_no_more() -> None:
    # A bound larger than any count: nothing is forgotten, whatever the size.
    entries = {str(i): i for i in range(10)}
    assert forget_least_recent(entries, 2**63) == 0 and len(entries) == 10
    # The largest bound a host count can meet: the pool grows as without one.
    engine, placements = _grown(2**63 - 1)
    assert all(p.host_id is not None for p in placements)
    assert engine.pools["default"].cluster.n_hosts == 13
