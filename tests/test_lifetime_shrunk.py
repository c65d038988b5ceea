"""The shrunk life tables, left-truncated VMs and sibling evidence, worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.lifetime import LifetimeSettings, LifetimeTracker
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import lifetime_keys
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.protocol import RunningVMs
from lavad.models.lifetime.shrunk import ShrunkLifeTables
from lavad.streams.schema import VmRequest

# Edges 0, 300, 3000: bins [0, 300), [300, 3000) and the open bin beyond 3000 s.
BINS = LifetimeBins.log_spaced(first_s=300.0, horizon_s=3000.0, count=2)
FEATURES = {"hour_of_day": 3, "batch_size": 1}


def _keys(owner: str) -> tuple[object, ...]:
    return lifetime_keys(owner, 2.0, 4.0, "", FEATURES)


def test_shrunk_chain_worked_by_hand() -> None:
    # Owners A and B share every group but their own (same shape, hour, size).
    # A: an exit at 100 s, one VM running at uptime 1000 s.
    # B: exits at 100 s and 1000 s, one VM running at uptime 5000 s.
    model = ShrunkLifeTables(BINS, prior_strength=2.0)
    rows_a = model.rows_for(_keys("A"))
    rows_b = model.rows_for(_keys("B"))
    assert rows_a[1:] == rows_b[1:]
    model.observe_exit(rows_a, 100.0)
    model.observe_exit(rows_b, 100.0)
    model.observe_exit(rows_b, 1000.0)
    model.refit(RunningVMs(np.array([rows_a, rows_b]), np.array([1000.0, 5000.0])))
    # The pool (and levels 1-3, holding the same five VMs):
    #   deaths [2, 1, 0], censored [0, 1, 1], N = 5
    #   at risk: 5, 5 - 2 - 1/2 = 2.5, 5 - 2 - 2 - 1/2 = 0.5
    #   hazard:  0.4, 0.4, 0
    # A level above copies it: (d + k h) / (n + k) = h when h = d / n.
    # Owner A: deaths [1, 0, 0], censored [0, 1, 0], N = 2
    #   at risk: 2, 2 - 1 - 1/2 = 0.5, 0
    #   hazard with k = 2: (1 + 2 * 0.4) / (2 + 2) = 0.45,
    #                      (0 + 2 * 0.4) / (0.5 + 2) = 0.32, (0 + 0) / (0 + 2) = 0
    #   mass: 0.45, 0.55 * 0.32 = 0.176, the rest 0.374 in the open bin.
    combo = model.choose(rows_a)
    assert model.mass[combo] == pytest.approx([0.45, 0.176, 0.374])
    # Its own life table alone would say [0.5, 0, 0.5]; the pool [0.4, 0.24, 0.36].
    pool = model.choose((rows_a[-1],) * len(rows_a))
    assert model.mass[pool] == pytest.approx([0.4, 0.24, 0.36])
    # Suffix sums: M0 = 1, 0.55, 0.374, 0; M1 weighs each bin's representative.
    rep = BINS.representative
    assert model.m0[combo] == pytest.approx([1.0, 0.55, 0.374, 0.0])
    assert model.m1[combo, 0] == pytest.approx(0.45 * rep[0] + 0.176 * rep[1] + 0.374 * rep[2])


def test_shrunk_strength_moves_between_the_group_and_the_pool() -> None:
    def owner_mass(strength: float) -> np.ndarray:
        model = ShrunkLifeTables(BINS, prior_strength=strength)
        rows_a = model.rows_for(_keys("A"))
        rows_b = model.rows_for(_keys("B"))
        for _ in range(40):
            model.observe_exit(rows_a, 100.0)
            model.observe_exit(rows_b, 1000.0)
        model.refit(RunningVMs(np.zeros((0, 5), dtype=np.int64), np.zeros(0)))
        return model.mass[model.choose(rows_a)].copy()

    # A's own table: everything in bin 0; the pool: half and half.
    assert owner_mass(1e-6) == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    assert owner_mass(1e9) == pytest.approx([0.5, 0.5, 0.0], abs=1e-6)
    # k = 40 (as many as A's VMs): hazard of bin 0 = (40 + 40 * 0.5) / 80 = 0.75.
    assert owner_mass(40.0)[0] == pytest.approx(0.75)


def test_shrunk_combos_change_only_at_refits_and_bound_their_number() -> None:
    model = ShrunkLifeTables(BINS, prior_strength=2.0, max_combos=3)
    rows_a = model.rows_for(_keys("A"))
    # No VM yet: uniform, as the life tables.
    assert model.mass[model.choose(rows_a)] == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    model.observe_exit(rows_a, 1000.0)
    model.refit(RunningVMs(np.zeros((0, 5), dtype=np.int64), np.zeros(0)))
    combo = model.choose(rows_a)
    before = model.mass[combo].copy()
    model.observe_exit(rows_a, 100.0)
    # Not refitted yet: the exit is not read.
    assert model.mass[model.choose(rows_a)] == pytest.approx(before)
    model.refit(RunningVMs(np.zeros((0, 5), dtype=np.int64), np.zeros(0)))
    assert model.mass[model.choose(rows_a)][0] > before[0]
    # B takes the second of three combos; the last is kept for the pool-wide
    # combo, which C and every later key tuple share.
    assert model.choose(model.rows_for(_keys("B"))) == 1
    pool = model.choose(model.rows_for(_keys("C")))
    assert model.choose(model.rows_for(_keys("D"))) == pool == 2
    assert model.combos == 3
    assert before == pytest.approx([0.0, 1.0, 0.0])


def _request(vm_id: str, tenant: str, features: dict[str, object]) -> VmRequest:
    return VmRequest(
        time=0.0,
        pool="p",
        vm_id=vm_id,
        tenant=tenant,
        cores=1.0,
        memory_gib=1.0,
        features=features,
    )


def test_a_left_truncated_vm_is_never_learned_from() -> None:
    cluster = ClusterState()
    cluster.add_host("h0", (16.0, 64.0, 0.0, 0.0))
    tracker = LifetimeTracker(LifetimeSettings(refit_interval_s=1e9, min_observations=1))
    old = _request("old", "app", {"preexisting": True})
    new = _request("new", "app", {"preexisting": False})
    for event in (old, new):
        record = cluster.book(event.vm_id, 0, (1.0, 1.0, 0.0, 0.0), "", 0.0)
        tracker.on_booked(cluster, record, 0.0, event)
    assert tracker.model.deaths.sum() == 0.0
    tracker.on_released(cluster, cluster.release("old"), 50_000.0, exited=True)
    # The preexisting VM's "lifetime" from the window's start is no lifetime.
    assert tracker.model.deaths.sum() == 0.0
    tracker.on_released(cluster, cluster.release("new"), 600.0, exited=True)
    # The new one's exit lands in every one of its groups' rows.
    assert tracker.model.deaths.sum() == 5.0


@pytest.mark.parametrize("model", ["tables", "shrunk"])
def test_a_siblings_exit_repredicts_the_running_ones(model: str) -> None:
    def run(siblings: bool) -> tuple[LifetimeTracker, list[float]]:
        cluster = ClusterState()
        for h in range(3):
            cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
        tracker = LifetimeTracker(
            LifetimeSettings(
                refit_interval_s=1e9, min_observations=1, model=model, siblings=siblings
            )
        )
        # Another tenant's long-lived VMs teach the pool a long lifetime.
        for i in range(20):
            event = _request(f"x{i}", "other", {})
            record = cluster.book(event.vm_id, 0, (0.1, 0.1, 0.0, 0.0), "", 0.0)
            tracker.on_booked(cluster, record, 0.0, event)
        for i in range(20):
            tracker.on_released(cluster, cluster.release(f"x{i}"), 40_000.0, exited=True)
        tracker.advance(cluster, 40_000.0)  # the first refit (due since -inf)
        for i in range(3):
            event = _request(f"b{i}", "batch", {})
            record = cluster.book(event.vm_id, i, (1.0, 1.0, 0.0, 0.0), "", 40_000.0)
            tracker.on_booked(cluster, record, 40_000.0, event)
        tracker.on_released(cluster, cluster.release("b0"), 40_600.0, exited=True)
        return tracker, [tracker.slots.predicted_exit[tracker._slot[v]] for v in ("b1", "b2")]

    plain, exits_plain = run(False)
    told, exits_told = run(True)
    # The other tenant's 20 VMs exit one by one: its 1st, 2nd, 4th, 8th and
    # 16th exits repredict the 19, 18, 16, 12 and 4 still running; then the
    # batch's first exit repredicts b1 and b2.
    assert (plain.repredictions, told.repredictions) == (0, 19 + 18 + 16 + 12 + 4 + 2)
    # Counted at once, a sibling that lived 600 s pulls the others' exits in.
    assert all(t < p for t, p in zip(exits_told, exits_plain, strict=True))
    assert all(t >= 40_600.0 + LifetimeTracker.MIN_REMAINING_S for t in exits_told)
    # Each host's latest exit follows (they may move earlier).
    for host, exit_time in ((1, exits_told[0]), (2, exits_told[1])):
        assert told.hosts.exit[host] == exit_time
    notices = told.take_notices()[-2:]
    assert sorted(n.subject_id for n in notices) == ["b1", "b2"]
    assert all("sibling" in n.reason for n in notices)


def test_both_models_are_refitted_with_the_chosen_rows() -> None:
    # The tracker passes every running VM's distribution row; the tables ignore it.
    tables = GroupedLifeTables(BINS, 1)
    rows = tables.rows_for(_keys("A"))
    tables.refit(RunningVMs(np.array([rows]), np.array([10.0]), np.array([tables.choose(rows)])))
    assert tables.observations[rows[0]] == 1.0


def test_forgetting_weighs_each_vm_by_its_creation_worked_by_hand() -> None:
    # Half-life 100 s. A: created at 0, exits at 100 (bin 0). B: created at
    # 100, exits at 1100 after 1000 s (bin 1). C: created at 1000, running at
    # the refit at 1100 (uptime 100, censored in bin 0).
    model = GroupedLifeTables(BINS, 1, half_life_s=100.0)
    rows = model.rows_for(_keys("A"))
    model.observe_exit(rows, 100.0, now=100.0)
    model.observe_exit(rows, 1000.0, now=1100.0)
    model.refit(RunningVMs(np.array([rows]), np.array([100.0])), now=1100.0)
    # Weights at 1100, by creation: A 2^-11, B 2^-10, C 2^-1. Times 2^11:
    #   deaths [1, 2, 0], censored [1024, 0, 0], N = 1027
    #   at risk: 1027 - 1024 / 2 = 515, then 1027 - 1 - 1024 = 2
    #   hazard: 1 / 515, 2 / 2 = 1 -> mass [1/515, 514/515, 0]
    assert model.mass[model.choose(rows)] == pytest.approx([1 / 515, 514 / 515, 0.0])
    assert model.observations[rows[0]] == pytest.approx(1027 / 2**11)
    # Without forgetting, C's censoring weighs as much as each exit:
    #   deaths [1, 1, 0], censored [1, 0, 0], N = 3; at risk 2.5, then 1
    plain = GroupedLifeTables(BINS, 1)
    plain_rows = plain.rows_for(_keys("A"))
    plain.observe_exit(plain_rows, 100.0)
    plain.observe_exit(plain_rows, 1000.0)
    plain.refit(RunningVMs(np.array([plain_rows]), np.array([100.0])))
    assert plain.mass[plain.choose(plain_rows)] == pytest.approx([0.4, 0.6, 0.0])
