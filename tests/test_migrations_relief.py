"""Relief of GPA hosts that break their promise: the binomial rule, the moves, gpa-react."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from gpa_support import cpu_sample
from typer.testing import CliRunner

from lavad.core.cluster import ClusterState
from lavad.core.engine import Engine, EngineConfig, PoolSetup
from lavad.core.migrations.config import DefragConfig, MigrationsConfig
from lavad.core.migrations.relief import (
    MIN_OVERFLOWS,
    OverflowEvidence,
    ReliefConfig,
    ReliefMove,
    TailFit,
    new_host_indices,
    overflows_needed,
    plan_host_relief,
    plan_relief,
    promise_rejected,
)
from lavad.core.migrations.relief_rule import overflow_thresholds
from lavad.core.placement.gpa import UsageHooks
from lavad.core.placement.registry import build_policy, validate_policy_args
from lavad.daemon.cli import app
from lavad.daemon.config_file import ConfigError
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.settings import check_live_settings, load_settings
from lavad.evaluation.gpa_react import RunningCumulants, react
from lavad.evaluation.gpa_tail import task_cumulants
from lavad.evaluation.stochastic_packing import Packing
from lavad.models.usage.margin import TailCalibration
from lavad.streams.schema import Decision, HostUp, Migration, VmPlaced

# ------------------------------------------------------------------ the rule


def test_binomial_rule_by_hand_at_rho_0_1_over_10_windows() -> None:
    """K ~ Binomial(10, 0.1) under the promise.

    P(K = 0..4) = 0.3487, 0.3874, 0.1937, 0.0574, 0.0112, so
    P(K >= 4) = 1 - 0.9872 = 0.0128 > 0.01 and P(K >= 5) = 0.0128 - 0.0112
    = 0.0016 <= 0.01: at alpha = 0.01 five overflows in ten windows relieve
    the host, four do not. At alpha = 0.05 four do (0.0128 <= 0.05) and three
    do not (P(K >= 3) = 0.0702).
    """
    assert overflows_needed(10, 0.1, 0.01) == 5
    assert not promise_rejected(4, 10, 0.1, 0.01)
    assert promise_rejected(5, 10, 0.1, 0.01)
    assert overflows_needed(10, 0.1, 0.05) == 4
    assert not promise_rejected(3, 10, 0.1, 0.05)


@pytest.mark.parametrize(("rho", "alpha"), [(0.1, 0.01), (0.01, 0.01), (0.05, 0.3), (0.001, 0.05)])
def test_every_threshold_is_the_smallest_count_the_tail_rejects(rho: float, alpha: float) -> None:
    """The vectorised thresholds against the definition, window count by count:
    P(K >= k) <= alpha, and P(K >= k - 1) > alpha unless k is the floor of
    two, or k = n + 1 when no count can reject."""
    from scipy.stats import binom  # noqa: PLC0415

    thresholds = overflow_thresholds(600, rho, alpha)
    for n, k in enumerate(thresholds.tolist()):
        if k > n:  # no count of n windows relieves: the floor, or no tail is low enough
            assert k in (n + 1, MIN_OVERFLOWS), (n, k)
            assert k <= MIN_OVERFLOWS or binom.sf(n - 1, n, rho) > alpha, (n, k)
            continue
        assert binom.sf(k - 1, n, rho) <= alpha, (n, k)
        assert k == MIN_OVERFLOWS or binom.sf(k - 2, n, rho) > alpha, (n, k)


def test_a_huge_window_count_is_refused_and_the_largest_builds_in_one_pass() -> None:
    with pytest.raises(ValueError, match="recent_windows"):
        ReliefConfig(enabled=True, recent_windows=10**9)
    # A look every nanosecond would make a jump in event time cost 10^15
    # looks: the relief's and the defragmenter's intervals share one floor.
    with pytest.raises(ValueError, match="check_interval_s"):
        ReliefConfig(enabled=True, check_interval_s=1e-9)
    with pytest.raises(ValueError, match="check_interval_s"):
        DefragConfig(empty_below=0.2, check_interval_s=1e-9)
    # The largest allowed: one vectorised pass over the counts, not a tail per count.
    config = ReliefConfig(enabled=True, recent_windows=20_160)
    evidence = OverflowEvidence(0.01, config)
    assert evidence.due(0) is False


def test_one_unlucky_window_never_relieves() -> None:
    """One overflow in one window has probability rho under the promise: at
    alpha >= rho the test alone would reject it; the floor of two does not."""
    assert not promise_rejected(1, 1, 0.1, 0.2)
    assert overflows_needed(1, 0.1, 0.2) == 2  # more than the windows: never
    # Two in a row at rho 0.01: probability 1e-4, rejected at 0.01.
    assert promise_rejected(2, 2, 0.01, 0.01)


def test_a_day_at_rho_0_01_needs_eight_overflows() -> None:
    """The module's example: K ~ Binomial(288, 0.01), P(K >= 8) = 0.0091, P(K >= 7) = 0.027."""
    assert overflows_needed(288, 0.01, 0.01) == 8


def test_evidence_slides_over_the_recent_windows() -> None:
    config = ReliefConfig(enabled=True, recent_windows=10, alpha=0.01)
    evidence = OverflowEvidence(0.1, config, initial_hosts=1)
    host = np.array([3], dtype=np.int64)  # grows past its initial size
    for overflowed in [False] * 10 + [True] * 4:
        assert not len(evidence.record(host, np.array([overflowed])))
    # 4 of the last 10 windows overflowed; the 5th relieves (see the by-hand test).
    assert evidence.record(host, np.array([True])).tolist() == [3]
    assert evidence.due(3)
    # Five quiet windows push out only quiet ones; the sixth drops an overflow.
    for _ in range(5):
        assert evidence.record(host, np.array([False])).tolist() == [3]
    assert not len(evidence.record(host, np.array([False])))
    assert not evidence.due(3)
    evidence.clear(3)
    assert evidence.windows[3] == 0 and evidence.overflows[3] == 0


def test_few_windows_kept_need_fewer_overflows() -> None:
    """Right after a clear, at rho 0.1 and alpha 0.005: 2 overflows in 2 windows
    have probability 0.01 under the promise (kept), 3 in 3 have 0.001 (relieved)."""
    evidence = OverflowEvidence(0.1, ReliefConfig(enabled=True, alpha=0.005), initial_hosts=1)
    host = np.array([0], dtype=np.int64)
    assert not len(evidence.record(host, np.array([True])))
    assert not len(evidence.record(host, np.array([True])))
    assert evidence.record(host, np.array([True])).tolist() == [0]


# ---------------------------------------------------------------- the moves


def _terms(*vms: tuple[float, float]) -> np.ndarray:
    """(4, k) terms of VMs given (mean, variance), no skew."""
    terms = np.zeros((4, len(vms)))
    for index, (mean, variance) in enumerate(vms):
        terms[0, index] = mean
        terms[1, index] = variance
    return terms


def test_relief_moves_the_largest_excess_to_a_host_that_fits() -> None:
    """rho 0.1, normal, margin 1: z = 1.2816, capacity 1.

    Source: A (0.3, 0), B (0.3, 0.04), C (0.2, 0): load 0.8 + 1.2816 x 0.2
    = 1.056 > 1. Left behind if A goes: 0.5 + 0.256 = 0.756; if B goes: 0.5;
    if C goes: 0.856. B goes, and 0.5 passes: nothing else moves. Targets:
    host 1 (0.5, 0) would hold 0.8 + 0.256 = 1.056 > 1 with B, host 2
    (0.2, 0) 0.5 + 0.256 = 0.756: B goes to host 2.
    """
    fit = TailFit(0.1, "normal", 1.0)
    vms = _terms((0.3, 0.0), (0.3, 0.04), (0.2, 0.0))
    hosts = _terms((0.8, 0.04), (0.5, 0.0), (0.2, 0.0))
    capacity = np.ones(3)
    moves = plan_relief(vms, 1.0, hosts, capacity, fit, 8, source=0)
    assert moves == [ReliefMove(1, 2)]
    assert math.isclose(float(fit.load(hosts[:, :1])[0]), 0.8 + 1.2815516 * 0.2, rel_tol=1e-6)


def test_no_vm_moves_to_a_host_that_then_fails_the_fit() -> None:
    fit = TailFit(0.05, "cornish-fisher", 1.3)
    rng = np.random.default_rng(7)
    for _ in range(200):
        k, h = int(rng.integers(2, 7)), int(rng.integers(1, 6))
        vms = np.vstack(
            [
                rng.uniform(0.05, 0.4, k),
                rng.uniform(0.0, 0.02, k),
                rng.uniform(-0.002, 0.004, k),
                rng.uniform(-0.001, 0.001, k),
            ]
        )
        hosts = np.vstack(
            [
                rng.uniform(0.0, 0.8, h),
                rng.uniform(0.0, 0.03, h),
                rng.uniform(-0.002, 0.004, h),
                rng.uniform(-0.001, 0.001, h),
            ]
        )
        capacity = np.ones(h)
        moves = plan_relief(vms, 1.0, hosts, capacity, fit, 8)
        landed = new_host_indices(moves, h)
        after = np.hstack([hosts, np.zeros((4, len(landed)))])
        for move, target in zip(moves, landed, strict=True):
            after[:, target] += vms[:, move.vm]
        used = sorted(set(landed))
        if used:
            assert fit.fits(after[:, used], 1.0).all()
        assert len(moves) <= k - 1  # the last VM stays
        assert len({move.vm for move in moves}) == len(moves)


def test_a_vm_no_host_accepts_opens_a_new_host() -> None:
    """Host 1 is full: the leaver opens a new host (None), the next leaver may share it."""
    fit = TailFit(0.1, "normal", 1.0)
    vms = _terms((0.5, 0.0), (0.4, 0.0), (0.4, 0.0))
    hosts = _terms((1.3, 0.0), (0.95, 0.0))
    moves = plan_relief(vms, 1.0, hosts, np.ones(2), fit, 8, source=0)
    # 1.3: the 0.5 goes first (leaves 0.8, which fits); host 1 cannot take it.
    assert moves == [ReliefMove(0, None)]
    assert new_host_indices(moves, 2) == [2]


def test_live_a_vm_no_host_accepts_goes_to_the_first_empty_host_that_holds_it() -> None:
    """rho 0.1, normal, margin 20 (a pool whose margin a regime change widened to its
    cap): z x 20 = 25.6 sd. Source (capacity 1): A (0.5, 0.01), B (0.4, 0.01), C
    (0.3, 0.01), load 1.2 + 25.6 x 0.173 = 5.6. A leaves first (its departure
    leaves the least load: 0.7 + 25.6 x 0.141 = 4.3, against 4.4 without B and
    4.5 without C), then B (0.3 + 25.6 x 0.1 = 2.86 left, against 2.96 without
    C): the relief stops at max_moves 2. No host passes for either (A alone: 0.5 + 2.56 = 3.06
    > 1). Host 1 is open but runs VMs, host 2 is closed, hosts 3 and 4 are
    empty and open; ``alone`` says host 3 holds A's request and not B's (a
    request of its own cores each), host 4 holds both. A goes to host 3, the
    first that holds it; B to host 4, as host 3 is empty no more."""
    fit = TailFit(0.1, "normal", 20.0)
    vms = _terms((0.5, 0.01), (0.4, 0.01), (0.3, 0.01))
    hosts = _terms((1.2, 0.03), (0.5, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    open_hosts = np.array([True, True, False, True, True])
    alone = np.array(
        [
            [False, False, True, True, True],
            [False, False, True, False, True],
            [False, False, True, True, True],
        ]
    )
    moves = plan_relief(
        vms, 1.0, hosts, np.ones(5), fit, 2, source=0, open_hosts=open_hosts, alone=alone
    )
    assert moves == [ReliefMove(0, 3), ReliefMove(1, 4)]
    # Without ``alone`` (the offline packer) the same VMs open new hosts instead.
    assert plan_relief(vms, 1.0, hosts, np.ones(5), fit, 2, source=0, open_hosts=open_hosts) == [
        ReliefMove(0, None),
        ReliefMove(1, None),
    ]
    with pytest.raises(ValueError, match="alone"):
        plan_relief(vms, 1.0, hosts, np.ones(5), fit, 2, source=0, alone=alone[:, :4])


def test_the_first_vm_moves_even_when_the_model_says_the_host_fits() -> None:
    """The realised overflows already showed the moments wrong: one VM always goes."""
    fit = TailFit(0.1, "normal", 1.0)
    vms = _terms((0.2, 0.0), (0.3, 0.0))
    moves = plan_relief(vms, 1.0, _terms((0.5, 0.0), (0.0, 0.0)), np.ones(2), fit, 8, source=0)
    assert moves == [ReliefMove(1, 1)]


def test_relief_is_deterministic() -> None:
    fit = TailFit(0.01, "normal", 2.0)
    rng = np.random.default_rng(3)
    vms = np.vstack([rng.uniform(0.1, 0.3, 6), rng.uniform(0, 0.01, 6), np.zeros(6), np.zeros(6)])
    hosts = np.vstack([rng.uniform(0, 0.7, 5), rng.uniform(0, 0.01, 5), np.zeros(5), np.zeros(5)])
    first = plan_relief(vms, 1.0, hosts, np.ones(5), fit, 8, source=0)
    second = plan_relief(vms, 1.0, hosts, np.ones(5), fit, 8, source=0)
    assert first == second and first


# ------------------------------------------------------------- gpa-react


def test_running_cumulants_match_task_cumulants() -> None:
    rng = np.random.default_rng(1)
    series = rng.exponential(0.2, (3, 50))
    series[1, 7] = np.nan
    running = RunningCumulants(series[:, :30])
    for step in range(30, 50):
        running.add(series[:, step])
    expected = np.vstack(task_cumulants(series))
    np.testing.assert_allclose(running.terms(), expected, rtol=1e-7, atol=1e-12)


def _jump_series() -> tuple[np.ndarray, np.ndarray]:
    """Four tasks at 0.2 (a small wobble) for 200 steps; in the future task 2 jumps to 0.5
    from step 10 on, so the machine's sum is 1.1 > 1 at every step from then."""
    wobble = 0.01 * np.sin(np.arange(260) * 0.7)
    series = np.tile(0.2 + wobble, (4, 1))
    series[2, 210:] = 0.5
    return series[:, :200], series[:, 200:]


@pytest.mark.parametrize(("migration_steps", "overflows", "running"), [(0, 2, 108), (4, 6, 104)])
def test_gpa_react_moves_the_vm_that_jumped_after_two_overflows(
    migration_steps: int, overflows: int, running: int
) -> None:
    """rho 0.01 on one machine, no score yet (Cantelli, margin 1).

    Overflows at future steps 10 and 11: two in the twelve windows kept is
    P(Binomial(12, 0.01) >= 2) = 0.0062 <= 0.01, so the rule fires after step
    11 (one overflow never does). Task 2 has the largest variance now (its
    jump) and leaves; no other machine exists, so it opens one, booked from
    step 12: machines in use (12 + 2 x 48) / 60. q counts where the task
    runs: with migrations taking no time, from step 12 on the new machine
    (2 overflows in 12 + 2 x 48 = 108 machine-steps); taking 4 steps (the
    live 20 minutes), it still runs on the first until step 15 (overflows at
    10..15: 6 of 16 + 2 x 44 = 104).
    """
    history, future = _jump_series()
    packing = Packing([[0, 1, 2, 3]], np.zeros((4, 4)))
    config = ReliefConfig(enabled=True, recent_windows=288, alpha=0.01)
    outcome = react(history, future, packing, TailCalibration(0.01), 1.0, config, migration_steps)
    assert outcome.migrations == 1 and outcome.reliefs == 1 and outcome.opened == 1
    assert outcome.first_relief_step == 11
    assert outcome.q == pytest.approx(overflows / running)
    assert outcome.machines_mean == pytest.approx((12 + 2 * 48) / 60)
    again = react(history, future, packing, TailCalibration(0.01), 1.0, config, migration_steps)
    assert again == outcome


def test_gpa_react_moves_nothing_when_the_promise_holds() -> None:
    history, future = _jump_series()
    future = future.copy()
    future[2] = future[0]  # no jump
    packing = Packing([[0, 1, 2, 3]], np.zeros((4, 4)))
    outcome = react(
        history, future, packing, TailCalibration(0.01), 1.0, ReliefConfig(enabled=True)
    )
    assert outcome.migrations == 0 and outcome.q == 0.0 and outcome.machines_mean == 1.0


# ------------------------------------------------------------- live hooks


def _overflowing_host() -> tuple[ClusterState, UsageHooks]:
    """Three 4-core VMs on an 8-core host (of two), learnt at 0.2 for 12 windows, then all at
    0.8 (9.6 cores > 8) for 6 windows; relief on at rho 0.05, alpha 0.01."""
    args = {"rho": 0.05, "min_samples": 4, "margin_min_windows": 5, "tie_break": "first"}
    policy = build_policy("gpa", validate_policy_args("gpa", args), np.random.default_rng(0))
    hooks = policy.hooks
    assert isinstance(hooks, UsageHooks)
    hooks.enable_relief(ReliefConfig(enabled=True, alpha=0.01))
    cluster = ClusterState()
    cluster.add_host("h0", (8.0, 128.0, 0.0, 0.0))
    cluster.add_host("h1", (16.0, 128.0, 0.0, 0.0))
    time = 0.0
    for vm in ("a", "b", "c"):
        record = cluster.book(vm, 0, (4.0, 8.0, 0.0, 0.0), "", time)
        hooks.on_booked(cluster, record, time, None)
    for k in range(18):
        time = 300.0 * (k + 1)
        for index, vm in enumerate(("a", "b", "c")):
            level = 0.2 + 0.01 * ((k + index) % 3) if k < 12 else 0.8
            hooks.observe(cluster, cpu_sample(vm, time, level))
    return cluster, hooks


def test_live_hooks_find_the_overflowing_host_and_plan_its_relief() -> None:
    """Windows close when a later one's first sample comes: 17 are scored, the last 5
    overflowed. At the 4th overflow 16 windows are kept: P(Binomial(16, 0.05) >= 4) =
    0.0070 <= 0.01, while the 3rd, of 15, has P(>= 3) = 0.036: the host is due from its
    4th overflow on. The pool has scored 14 windows, fewer than the
    19 a conformal bound at rho 0.05 needs, so it reads hosts through Cantelli's bound
    (mu + 4.36 sigma), and the VMs' current moments mix 12 windows near 0.2 with 6 at
    0.8 (sigma about 0.28 of 4 cores each): two of them still fail 8 cores, so the first
    two in id order (alike otherwise) leave for h1, the empty 16-core host; c stays."""
    cluster, hooks = _overflowing_host()
    assert hooks.tail is not None and hooks.tail.method == "cantelli"
    assert hooks.relief_due() == [0]
    moves = plan_host_relief(hooks, cluster, 0, 8)
    assert moves == [("a", 1), ("b", 1)]
    twin_cluster, twin_hooks = _overflowing_host()
    assert plan_host_relief(twin_hooks, twin_cluster, 0, 8) == moves
    # Moving a VM clears both hosts' evidence: the mix it was about is gone.
    before = cluster.vms["a"]
    cluster.release("a")
    after = cluster.book("a", 1, before.demand, before.deployment, before.placed_at)
    hooks.on_moved(cluster, before, after, 6000.0)
    assert hooks.relief_due() == []


# ---------------------------------------------------------------- the engine


def _relief_engine(enabled: bool = True) -> Engine:
    args = {"rho": 0.05, "min_samples": 4, "margin_min_windows": 5, "tie_break": "first"}
    return Engine(
        EngineConfig(
            policy="gpa",
            policy_args=validate_policy_args("gpa", args),
            pools=PoolSetup(),
            migrations=MigrationsConfig(relief=ReliefConfig(enabled=enabled, alpha=0.01)),
        )
    )


def _run_relief(enabled: bool = True) -> tuple[Engine, list[Decision]]:
    """The hooks test's stream through the engine: a, b, c (4 cores each) placed on h0
    (8 cores) by another scheduler, learnt near 0.2 for 12 windows, then at 0.8 (9.6 cores)."""
    engine = _relief_engine(enabled)
    decisions: list[Decision] = []
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=8.0, memory_gib=128.0), 0.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=16.0, memory_gib=128.0), 0.0)
    for vm_id in ("a", "b", "c"):
        placed = VmPlaced(time=0.0, pool="p", vm_id=vm_id, host_id="h0", cores=4.0, memory_gib=8.0)
        decisions += engine.handle(placed, 0.0).decisions
    for k in range(30):
        time = 300.0 * (k + 1)
        for index, vm_id in enumerate(("a", "b", "c")):
            level = 0.2 + 0.01 * ((k + index) % 3) if k < 12 else 0.8
            sample = cpu_sample(vm_id, time, level)
            decisions += engine.handle(sample, time).decisions
    return engine, decisions


def test_the_engine_relieves_the_overflowing_host_and_returns_it_to_service() -> None:
    """As in the hooks test, h0 is due at its 4th overflow, whose window the first sample
    at t = 5,100 s closes. The planner looks every 300 s, and a pool's timers run before
    the event at their time, so the look at 5,100 s comes just before: the relief starts
    at the next, 5,400 s (the plan: a and b), the GPA policy sends both to h1, and once
    their migrations are done (20 min) h0 is back in service with c."""
    _, decisions = _run_relief()
    relief = [d for d in decisions if isinstance(d, Migration)]
    assert relief and all(d.drain == "relief" for d in relief)
    plan = relief[0]
    assert plan.action == "plan" and plan.host_id == "h0"
    assert sorted(entry["vm_id"] for entry in plan.plan) == ["a", "b"]
    moved = [(d.vm_id, d.target_host_id) for d in relief if d.action == "migrate"]
    assert sorted(moved) == [("a", "h1"), ("b", "h1")]
    assert plan.time == pytest.approx(5400.0)
    ready = [d for d in relief if d.action == "host_ready"]
    assert len(ready) == 1 and ready[0].time >= plan.time + 1200.0


def test_relief_is_deterministic_and_off_by_default() -> None:
    _, one = _run_relief()
    _, two = _run_relief()
    assert one == two
    _, off = _run_relief(enabled=False)
    assert not [d for d in off if isinstance(d, Migration)]
    assert MigrationsConfig().relief.enabled is False


def test_a_pool_mid_relief_survives_a_snapshot_and_decides_the_same() -> None:
    """Snapshot the pool as the live daemon does (state_codec) after the overflows began,
    before the relief; the restored pool relieves h0 exactly as the original."""
    engine = _relief_engine()
    engine.handle(HostUp(time=0.0, pool="p", host_id="h0", cores=8.0, memory_gib=128.0), 0.0)
    engine.handle(HostUp(time=0.0, pool="p", host_id="h1", cores=16.0, memory_gib=128.0), 0.0)
    for vm_id in ("a", "b", "c"):
        placed = VmPlaced(time=0.0, pool="p", vm_id=vm_id, host_id="h0", cores=4.0, memory_gib=8.0)
        engine.handle(placed, 0.0)

    def feed(target: Engine, ks: range) -> list[Decision]:
        out: list[Decision] = []
        for k in ks:
            time = 300.0 * (k + 1)
            for index, vm_id in enumerate(("a", "b", "c")):
                level = 0.2 + 0.01 * ((k + index) % 3) if k < 12 else 0.8
                out += target.handle(cpu_sample(vm_id, time, level), time).decisions
        return out

    feed(engine, range(14))
    twin = _relief_engine()
    twin.pools["p"] = loads(dumps(engine.pools["p"]))
    original, restored = feed(engine, range(14, 30)), feed(twin, range(14, 30))
    assert original == restored
    assert any(isinstance(d, Migration) and d.drain == "relief" for d in original)


def test_relief_refuses_a_pool_without_gpa() -> None:
    with pytest.raises(ValueError, match=r"migrations\.relief\.enabled"):
        Engine(
            EngineConfig(
                policy="bestfit",
                policy_args=validate_policy_args("bestfit", {}),
                pools=PoolSetup(),
                migrations=MigrationsConfig(relief=ReliefConfig(enabled=True)),
            )
        ).handle(HostUp(time=0.0, pool="p", host_id="h0", cores=8.0, memory_gib=8.0), 0.0)


def test_the_config_refuses_relief_without_gpa_at_start(tmp_path: Path) -> None:
    config = tmp_path / "lavad.toml"
    config.write_text('[placement]\npolicy = "bestfit"\n[migrations.relief]\nenabled = true\n')
    settings = load_settings(config)  # a replay may still name gpa on its command line
    with pytest.raises(ConfigError, match=r"migrations\.relief\.enabled"):
        check_live_settings(settings)
    config.write_text('[placement]\npolicy = "gpa"\n[migrations.relief]\nenabled = true\n')
    check_live_settings(load_settings(config))
    assert load_settings(config).migrations.relief.enabled
    config.write_text("[migrations.relief]\nalpha = 0.7\n")
    with pytest.raises(ConfigError, match="alpha"):
        load_settings(config)


def test_a_replay_of_another_policy_with_relief_stops_before_reading_the_trace(
    tmp_path: Path,
) -> None:
    config = tmp_path / "lavad.toml"
    config.write_text("[migrations.relief]\nenabled = true\n")
    missing = tmp_path / "no-such-trace"
    result = CliRunner().invoke(
        app, ["replay", str(missing), "--policy", "bestfit", "--config", str(config)]
    )
    # Exit 2 with the key, before the (missing) trace is opened.
    assert result.exit_code == 2, result.output
    assert "migrations.relief.enabled" in result.output
    assert "no such file" not in result.output
