"""Drains by live migration (LARS, LAVA paper 4.4), worked out by hand through the engine."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from lavad.core.cluster import ClusterState
from lavad.core.engine import Engine, EngineConfig, HostShape, PoolSetup
from lavad.core.migrations import planner as planner_module
from lavad.core.migrations.config import (
    DefragConfig,
    LifetimeSource,
    MigrationsConfig,
    OrderName,
    RollingConfig,
)
from lavad.core.migrations.orders import Queued, RandomOrder
from lavad.core.migrations.triggers import RollingDrains, choose_hosts_to_drain
from lavad.core.placement.framework import UniformDraws
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.cli import app
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.replay import ReplayResult, replay
from lavad.models.lifetime.features import ORACLE_FEATURE
from lavad.streams.adapters import open_trace
from lavad.streams.oracle import exit_times, with_true_lifetimes
from lavad.streams.schema import (
    Decision,
    HostDrain,
    HostUp,
    Migration,
    Placement,
    VmExit,
    VmPlaced,
    VmRequest,
)

MINUTE = 60.0
HOUR = 3600.0

# The drained host's VMs, all placed at t=0 in this (arrival) order, with the
# time each exits. The drain starts at t=0; 3 migrations at a time, 20 min each.
LIFETIMES = {
    "a": 5 * HOUR,
    "b": 4 * HOUR,
    "c": 3 * HOUR,
    "d": 10 * MINUTE,
    "e": 30 * MINUTE,
    "f": 50 * MINUTE,
    "g": 70 * MINUTE,
    "h": 90 * MINUTE,
}


def _engine(order: OrderName, **migrations: object) -> Engine:
    return Engine(
        EngineConfig(
            policy="bestfit",
            policy_args=validate_policy_args("bestfit", {"tie_break": "first"}),
            pools=PoolSetup(),
            migrations=MigrationsConfig(order=order, lifetimes="oracle", **migrations),  # type: ignore[arg-type]
        )
    )


def _run_drain(order: OrderName) -> tuple[Engine, list[Decision]]:
    """h0 holds the eight VMs and drains at t=0; h1 is a large empty target."""
    engine = _engine(order)
    decisions: list[Decision] = []
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=16.0, memory_gib=64.0), 0.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=64.0, memory_gib=256.0), 0.0)
    for vm_id, lifetime in LIFETIMES.items():
        placed = VmPlaced(
            time=0.0,
            pool="p",
            vm_id=vm_id,
            host_id="h0",
            cores=1.0,
            memory_gib=2.0,
            features={ORACLE_FEATURE: lifetime},
        )
        decisions += engine.handle(placed, 0.0).decisions
    decisions += engine.handle(HostDrain(time=0.0, pool="p", host_id="h0"), 0.0).decisions
    for vm_id, lifetime in sorted(LIFETIMES.items(), key=lambda item: item[1]):
        decisions += engine.handle(VmExit(time=lifetime, pool="p", vm_id=vm_id), lifetime).decisions
    return engine, decisions


def _migrated(decisions: list[Decision]) -> list[tuple[float, str]]:
    return [
        (d.time, d.vm_id or "")
        for d in decisions
        if isinstance(d, Migration) and d.action == "migrate"
    ]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        # LARS, longest remaining first. t=0: a (5h), b (4h), c (3h) start.
        # d exits at 10 min, before its turn. t=20: remaining e 10m, f 30m,
        # g 50m, h 70m -> h, g, f start. e exits at 30 min, queued. 6 moves.
        ("lars", [(0, "a"), (0, "b"), (0, "c"), (20, "h"), (20, "g"), (20, "f")]),
        # Arrival: a, b, c; then (d gone) e, f, g; then h at t=40. 7 moves.
        (
            "arrival",
            [(0, "a"), (0, "b"), (0, "c"), (20, "e"), (20, "f"), (20, "g"), (40, "h")],
        ),
        # Shortest first: d, e, f; at t=20 g (50m), h (70m), c (2h40m); then
        # b and a at t=40. Every VM is moved: 8.
        (
            "shortest",
            [
                (0, "d"),
                (0, "e"),
                (0, "f"),
                (20, "g"),
                (20, "h"),
                (20, "c"),
                (40, "b"),
                (40, "a"),
            ],
        ),
    ],
)
def test_hand_worked_drain(order: OrderName, expected: list[tuple[float, str]]) -> None:
    engine, decisions = _run_drain(order)
    assert _migrated(decisions) == [(t * MINUTE, vm) for t, vm in expected]
    planner = engine.pools["p"].migrations
    assert planner is not None
    assert planner.counters["migrations"] == len(expected)
    assert planner.counters["exited_before_migration"] == len(LIFETIMES) - len(expected)
    # Every move went to h1, the only open host.
    assert {d.target_host_id for d in decisions if isinstance(d, Migration) and d.vm_id} <= {
        "h1",
        None,
    }


def test_an_exited_vm_is_never_migrated_and_the_plan_says_so() -> None:
    _, decisions = _run_drain("lars")
    migrated = {vm for _, vm in _migrated(decisions)}
    assert not migrated & {"d", "e"}
    plans = [d for d in decisions if isinstance(d, Migration) and d.action == "plan"]
    # At the drain: every VM, longest first, with its remaining lifetime.
    first = plans[0]
    assert [row["vm_id"] for row in first.plan] == list("abchgfed")
    assert first.plan[0]["predicted_remaining_s"] == 5 * HOUR
    # d's exit at 10 min republishes the plan without it: e, f, g, h wait.
    after_d = next(p for p in plans if p.reason.startswith("d exited"))
    assert after_d.time == 10 * MINUTE
    assert [row["vm_id"] for row in after_d.plan] == list("hgfe")
    assert after_d.plan[0]["predicted_remaining_s"] == 80 * MINUTE


def test_the_host_is_ready_once_empty_and_its_last_migration_done() -> None:
    engine, decisions = _run_drain("lars")
    ready = [d for d in decisions if isinstance(d, Migration) and d.action == "host_ready"]
    # The last move (t=20 min) ends at t=40 min; the engine fires it on the
    # next event (a's exit), at its own time.
    assert [(d.time, d.host_id, d.drain) for d in ready] == [(40 * MINUTE, "h0", "maintenance")]
    assert ready[0].explanation["migrated"] == 6
    # Maintenance: the host stays closed until host.up says the work is done.
    cluster = engine.pools["p"].cluster
    assert not cluster.schedulable[cluster.host_index["h0"]]


def test_a_draining_host_receives_no_placements() -> None:
    engine = _engine("lars")
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=16.0, memory_gib=64.0), 0.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=64.0, memory_gib=256.0), 0.0)
    engine.handle(
        VmPlaced(
            time=0.0,
            pool="p",
            vm_id="long",
            host_id="h0",
            cores=15.0,
            memory_gib=8.0,
            features={ORACLE_FEATURE: 10 * HOUR},
        ),
        0.0,
    )
    engine.handle(HostDrain(time=0.0, pool="p", host_id="h0"), 0.0)
    # Best Fit would pick h0 (1 core left after this); it drains, so h1.
    t = 60.0
    for i in range(5):
        request = VmRequest(
            time=t,
            pool="p",
            vm_id=f"new{i}",
            cores=1.0,
            memory_gib=1.0,
            features={ORACLE_FEATURE: 10 * HOUR},
        )
        placements = [d for d in engine.handle(request, t).decisions if isinstance(d, Placement)]
        assert [p.host_id for p in placements] == ["h1"]
        t += 60.0
    # Maintenance done: h0 takes VMs again.
    engine.handle(HostUp(time=t, pool="p", host_id="h0", cores=16.0, memory_gib=64.0), t)
    request = VmRequest(
        time=t, pool="p", vm_id="after", cores=1.0, memory_gib=1.0, features={ORACLE_FEATURE: 1.0}
    )
    (placement,) = [d for d in engine.handle(request, t).decisions if isinstance(d, Placement)]
    # h0 is empty and open (its VM moved); Best Fit prefers the busy h1.
    assert placement.host_id == "h1"
    cluster = engine.pools["p"].cluster
    assert cluster.schedulable[cluster.host_index["h0"]]


def test_defragmentation_drains_the_cheapest_host_and_returns_it_empty() -> None:
    engine = Engine(
        EngineConfig(
            policy="bestfit",
            policy_args=validate_policy_args("bestfit", {"tie_break": "first"}),
            pools=PoolSetup(),
            migrations=MigrationsConfig(
                lifetimes="oracle", defrag=DefragConfig(empty_below=0.5, check_interval_s=60.0)
            ),
        )
    )
    for h in range(4):
        engine.handle(HostUp(time=0.0, pool="p", host_id=f"h{h}", cores=16.0, memory_gib=64.0), 0.0)
    # h0: one VM, h1: two, h2: three, h3: empty (16 cores, 64 GiB each).
    residents = {"h0": ["x0"], "h1": ["y0", "y1"], "h2": ["z0", "z1", "z2"]}
    for host, vms in residents.items():
        for vm in vms:
            engine.handle(
                VmPlaced(
                    time=0.0,
                    pool="p",
                    vm_id=vm,
                    host_id=host,
                    cores=2.0,
                    memory_gib=4.0,
                    features={ORACLE_FEATURE: 100 * HOUR},
                ),
                0.0,
            )
    # Empty open hosts 1 of 4 < 50%: ceil(0.5 * 4) - 1 = 1 host to drain.
    # h0 has the fewest VMs. Its VM goes where Best Fit says: h2, the fullest.
    decisions = engine.advance(60.0) + engine.advance(60.0 + 20 * MINUTE)
    migrations = [d for d in decisions if isinstance(d, Migration)]
    assert [(d.action, d.host_id, d.drain) for d in migrations] == [
        ("plan", "h0", "defragmentation"),
        ("migrate", "h0", "defragmentation"),
        ("host_ready", "h0", "defragmentation"),
    ]
    assert migrations[1].target_host_id == "h2"
    assert migrations[2].time == 60.0 + 20 * MINUTE
    cluster = engine.pools["p"].cluster
    # Back in service and empty: 2 of 4 hosts empty, no further drain.
    assert cluster.schedulable[cluster.host_index["h0"]]
    assert cluster.hosts_empty == 2
    assert not [d for d in engine.advance(10 * HOUR) if isinstance(d, Migration)]


def test_a_vm_that_fits_nowhere_waits_and_is_retried() -> None:
    engine = _engine("lars", retry_s=600.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=16.0, memory_gib=64.0), 0.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=16.0, memory_gib=64.0), 0.0)
    for vm, host in (("big", "h0"), ("blocker", "h1")):
        engine.handle(
            VmPlaced(
                time=0.0,
                pool="p",
                vm_id=vm,
                host_id=host,
                cores=12.0,
                memory_gib=8.0,
                features={ORACLE_FEATURE: 10 * HOUR if vm == "big" else HOUR},
            ),
            0.0,
        )
    decisions = engine.handle(HostDrain(time=0.0, pool="p", host_id="h0"), 0.0).decisions
    assert not _migrated(decisions)
    planner = engine.pools["p"].migrations
    assert planner is not None and planner.retry_at == 600.0
    # The blocker exits at 1 h; the next retry after it (t = 4200 s) moves big.
    decisions = engine.handle(VmExit(time=HOUR, pool="p", vm_id="blocker"), HOUR).decisions
    decisions += engine.advance(2 * HOUR)
    assert _migrated(decisions) == [(4200.0, "big")]


def test_random_order_is_seeded() -> None:
    queue = [Queued(f"v{i}", 0, i) for i in range(20)]

    def ranking(seed: int) -> list[str]:
        order = RandomOrder(UniformDraws(np.random.default_rng(seed)))
        return [q.vm_id for q in order.rank(queue, lambda vm: 0.0)]

    assert ranking(1) == ranking(1)
    assert ranking(1) != ranking(2)
    assert sorted(ranking(1)) == sorted(q.vm_id for q in queue)


def test_a_planner_mid_drain_survives_a_snapshot() -> None:
    engine, _ = _run_drain("lars")
    pool = engine.pools["p"]
    # As the live daemon's snapshots write it: data (state_codec), no pickle.
    restored = loads(dumps(pool))
    assert restored.migrations.summary() == pool.migrations.summary()  # type: ignore[union-attr]


def test_orders_counted_beside_the_acting_one_match_their_own_runs() -> None:
    """The same-drains shadows (the paper's simulator) count what acting orders do.

    On the hand-worked drain every VM finds a target, which is what the
    shadows assume, so each shadow's count equals that order's own run:
    LARS 6, arrival 7, shortest 8.
    """
    engine = _engine(
        "arrival", compare=(("lars", "oracle"), ("arrival", "oracle"), ("shortest", "oracle"))
    )
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=16.0, memory_gib=64.0), 0.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=64.0, memory_gib=256.0), 0.0)
    for vm_id, lifetime in LIFETIMES.items():
        placed = VmPlaced(
            time=0.0,
            pool="p",
            vm_id=vm_id,
            host_id="h0",
            cores=1.0,
            memory_gib=2.0,
            features={ORACLE_FEATURE: lifetime},
        )
        engine.handle(placed, 0.0)
    engine.handle(HostDrain(time=0.0, pool="p", host_id="h0"), 0.0)
    for vm_id, lifetime in sorted(LIFETIMES.items(), key=lambda item: item[1]):
        engine.handle(VmExit(time=lifetime, pool="p", vm_id=vm_id), lifetime)
    summary = engine.summary(6 * HOUR)["p"]["migrations"]
    assert summary["migrations"] == 7
    compared = summary["compared"]
    assert {label: c["migrations"] for label, c in compared.items()} == {
        "lars-oracle": 6,
        "arrival-oracle": 7,
        "shortest-oracle": 8,
    }
    assert all(c["scheduled"] == 8 for c in compared.values())


AZURE_SLICE = Path(__file__).resolve().parents[1] / "data" / "azure-v1-vms-slice"


def _slice_replay(order: OrderName, lifetimes: LifetimeSource) -> tuple[bytes, ReplayResult]:
    """The bundled Azure slice on 440 fixed hosts (its Best Fit peak is ~415), LAS
    placing, defragmenting below 24% empty hosts."""
    trace = open_trace(AZURE_SLICE, seed=0)
    exits = exit_times(open_trace(AZURE_SLICE, seed=0).events())
    assert trace.end_time is not None
    config = EngineConfig(
        policy="las",
        policy_args=validate_policy_args("las", {}),
        pools=PoolSetup(shape=HostShape(48.0, 192.0), initial_hosts=440),
        migrations=MigrationsConfig(
            order=order, lifetimes=lifetimes, defrag=DefragConfig(empty_below=0.24)
        ),
    )
    sink = io.BytesIO()
    result = replay(
        with_true_lifetimes(trace.events(), exits, trace.end_time),
        config,
        end_time=trace.end_time,
        decisions_out=sink,
    )
    return sink.getvalue(), result


def test_a_defragmenting_replay_is_deterministic_and_loses_no_vm() -> None:
    first, result = _slice_replay("lars", "policy")
    second, _ = _slice_replay("lars", "policy")
    assert first == second
    summary = result.pools["default"]["migrations"]
    assert summary["drains"] > 0 and summary["migrations"] > 0
    # Every VM scheduled for migration moved, exited first, or is still waiting.
    assert summary["scheduled"] == (
        summary["migrations"] + summary["exited_before_migration"] + summary["still_queued"]
    )
    decisions = [orjson.loads(line) for line in first.splitlines()]
    moves = [d for d in decisions if d["kind"] == "migration" and d["action"] == "migrate"]
    assert len(moves) == summary["migrations"]
    # No placement lands on a host while it drains.
    draining: set[str] = set()
    for d in decisions:
        if d["kind"] == "migration" and d["action"] == "plan":
            draining.add(d["host_id"])
        elif d["kind"] == "migration" and d["action"] == "host_ready":
            draining.discard(d["host_id"])
        elif d["kind"] == "placement":
            assert d["host_id"] not in draining
        if d["kind"] == "migration" and d["action"] == "migrate":
            assert d["target_host_id"] not in draining


def _ready_host_means(decisions: list[dict[str, object]]) -> float:
    """Migrations per drain that ended with its host ready, counted from the decisions:
    a plan opens a host's drain, each migrate off it counts, host_ready closes it."""
    open_drains: dict[object, int] = {}
    closed: list[int] = []
    for d in decisions:
        if d["kind"] != "migration":
            continue
        if d["action"] == "plan":
            open_drains.setdefault(d["host_id"], 0)
        elif d["action"] == "migrate":
            open_drains[d["host_id"]] += 1
        elif d["action"] == "host_ready":
            closed.append(open_drains.pop(d["host_id"]))
    return sum(closed) / len(closed)


def test_the_drain_log_keeps_the_latest_drains_and_the_means_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon drains hosts for months: the planner keeps only the latest drains,
    and the per-ready-host mean from two counters, not a list per host."""
    whole_stream, whole = _slice_replay("lars", "policy")
    monkeypatch.setattr(planner_module, "DRAIN_LOG_KEPT", 2)
    cut_stream, cut = _slice_replay("lars", "policy")
    # Keeping fewer drains changes no decision.
    assert cut_stream == whole_stream
    summary = cut.pools["default"]["migrations"]
    full = whole.pools["default"]["migrations"]
    assert full["drains"] > 4, "the slice must drain more hosts than the bound keeps"
    assert len(full["drain_log"]) == full["drains"]
    assert summary["drain_log"] == full["drain_log"][-2:]
    assert {k: v for k, v in summary.items() if k != "drain_log"} == {
        k: v for k, v in full.items() if k != "drain_log"
    }
    decisions = [orjson.loads(line) for line in whole_stream.splitlines()]
    assert summary["migrations_per_ready_host"] == pytest.approx(_ready_host_means(decisions))


def test_the_planner_holds_fewer_than_twice_the_kept_drains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Maintenance of one host, over and over: the log stays between the kept
    length and twice it, in order, ending with the latest drain."""
    monkeypatch.setattr(planner_module, "DRAIN_LOG_KEPT", 10)
    engine = _engine("lars")
    drains = 53
    for i in range(drains):
        up = HostUp(time=float(i), pool="p", host_id="h0", cores=16.0, memory_gib=64.0)
        engine.handle(up, float(i))
        engine.handle(HostDrain(time=float(i), pool="p", host_id="h0"), float(i))
    planner = engine.pools["p"].migrations
    assert planner is not None
    assert planner.counters["drains.maintenance"] == drains
    assert 10 <= len(planner.drain_log) < 20
    times = [entry[0] for entry in planner.drain_log]
    assert times == sorted(times) and times[-1] == drains - 1
    assert engine.summary(float(drains))["p"]["migrations"]["drain_log"] == [
        [float(t), "h0", "maintenance"] for t in range(drains - 10, drains)
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LAVAD_MIGRATIONS__LIFETIMES": "oracle"}, "migrations.lifetimes"),
        ({"LAVAD_PLACEMENT__POLICY": "las-oracle"}, "placement.policy"),
    ],
)
def test_the_daemon_refuses_true_lifetimes_at_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code != 0
    assert message in result.output


def test_choose_hosts_to_drain_needs_room_for_their_vms() -> None:
    cluster = ClusterState()
    for h in range(3):
        cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
    # h0: one 10-core VM; h1: two 2-core VMs; h2: one 2-core VM.
    cluster.book("a", 0, (10.0, 8.0, 0.0, 0.0), "", 0.0)
    cluster.book("b", 1, (2.0, 8.0, 0.0, 0.0), "", 0.0)
    cluster.book("c", 1, (2.0, 8.0, 0.0, 0.0), "", 0.0)
    cluster.book("d", 2, (2.0, 8.0, 0.0, 0.0), "", 0.0)
    # Fewest VMs: h0 and h2 (one each); h2 has more excess (14 of 16 cores
    # free, mean free fraction (14/16 + 56/64)/2 = 0.875 against h0's 0.5625).
    assert choose_hosts_to_drain(cluster, 1) == [2]
    # Both: h2's 2 cores fit in the others' 6 + 12 free; that leaves h1
    # 12 - 2 = 10 free cores, exactly h0's 10-core VM.
    assert choose_hosts_to_drain(cluster, 2) == [2, 0]
    cluster.book("e", 1, (10.0, 8.0, 0.0, 0.0), "", 0.0)
    # h1 now has 2 cores free. h2 still goes (its 2 cores fit in 6 + 2),
    # but then h0's 10 cores would need 10 of h1's 2 - 2 = 0: skipped, and
    # h1 (three VMs, 14 cores) would need them from h0's 6 - 2: skipped too.
    assert choose_hosts_to_drain(cluster, 2) == [2]


def test_rolling_maintenance_goes_round_the_pool_skipping_empty_hosts() -> None:
    cluster = ClusterState()
    for h in range(5):
        cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
    for h in (0, 1, 3, 4):
        cluster.book(f"v{h}", h, (1.0, 1.0, 0.0, 0.0), "", 0.0)
    rolling = RollingDrains(RollingConfig(batch=2, every_s=3600.0, start_s=100.0))
    assert rolling.next_check == 100.0
    assert rolling.due(cluster, 100.0, 0) == [0, 1]
    assert rolling.next_check == 3700.0
    # h2 is empty: passed over. Then h3.
    assert rolling.due(cluster, 3700.0, 0) == [3]
    assert rolling.skipped == 1
    # h4, then round to h0.
    assert rolling.due(cluster, 7300.0, 0) == [4, 0]


def test_evaluate_migrations_compares_every_order_on_the_same_drains(tmp_path: Path) -> None:
    out = tmp_path / "migrations.json"
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "migrations",
            str(AZURE_SLICE),
            "--policy",
            "las",
            "--hosts",
            "440",
            "--rolling-batch",
            "5",
            "--rolling-every-h",
            "2",
            "--no-closed-loop",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Same" in result.output and "lars-oracle" in result.output
    evaluation = orjson.loads(out.read_bytes())
    same = {row["label"]: row for row in evaluation["same_drains"]}
    assert set(same) == {
        "arrival-policy",
        "random-policy",
        "shortest-policy",
        "lars-policy",
        "lars-oracle",
    }
    scheduled = {row["scheduled"] for row in same.values()}
    assert len(scheduled) == 1 and scheduled.pop() > 0
    for row in same.values():
        assert (
            row["migrations"] + row["exited_before_migration"] + row["still_queued"]
            == row["scheduled"]
        )
    # The acting order is arrival: its own count matches its shadow's unless
    # a VM found no target (the shadow assumes every one does).
    (acting,) = evaluation["closed_loop"]
    assert acting["label"] == "arrival"
    assert acting["migrations"] <= same["arrival-policy"]["migrations"]


def test_a_vm_another_scheduler_puts_on_a_draining_host_is_migrated_too() -> None:
    engine = _engine("lars")
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=16.0, memory_gib=64.0), 0.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=16.0, memory_gib=64.0), 0.0)
    # An empty host drains: ready at once (maintenance: it stays closed).
    engine.handle(HostDrain(time=0.0, pool="p", host_id="h0"), 0.0)
    placed = VmPlaced(
        time=10.0,
        pool="p",
        vm_id="late",
        host_id="h0",
        cores=1.0,
        memory_gib=1.0,
        features={ORACLE_FEATURE: HOUR},
    )
    decisions = engine.handle(placed, 10.0).decisions
    assert [(d.action, d.plan[0]["vm_id"]) for d in decisions if isinstance(d, Migration)] == [
        ("plan", "late")
    ]
    # The next event (or timer sweep) moves it, at the time it was booked.
    assert _migrated(engine.advance(20.0)) == [(10.0, "late")]
