"""The tracker's compiled booking and release against what they stand for.

``kernels._book_slot`` and ``_release_slot`` keep each host's VMs as a
linked list of slots and its latest exits, and count a VM's exit or
censoring in the model; ``host_exit_quantiles`` finds a host's holder from
that list. Each is checked here against the definition, computed from
scratch, over random bookings and releases.
"""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.cluster import ClusterState, VmRecord
from lavad.core.placement.framework import PlacementRequest
from lavad.core.placement.kernels import (
    HEAD,
    HOLDER,
    HOST,
    HOST_EXIT,
    HOST_INITIAL_EXIT,
    HOST_INTS,
    HOST_TIMES,
    INITIAL_EXIT,
    NEXT_ON_HOST,
    PREDICTED_EXIT,
    PREV_ON_HOST,
    SLOT_INTS,
    SLOT_TIMES,
    rebuild_host_exits,
    warm_up_lifetime,
)
from lavad.core.placement.kernels import _leave_host as leave_host
from lavad.core.placement.lifetime import LIFETIME_MODELS, LifetimeSettings, LifetimeTracker
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.calibration import SurvivalCalibrator
from lavad.models.lifetime.grouped import (
    GroupedLifeTables,
    add_running_censorings,
    scatter_suffix_sums,
)
from lavad.models.lifetime.survival import life_table, suffix_sums
from lavad.streams.schema import VmRequest

HOSTS = 6
DEMAND = (1.0, 1.0, 0.0, 0.0)


def _request(vm_id: str, now: float, tenant: str, hour: int) -> VmRequest:
    return VmRequest(
        time=now,
        pool="p",
        vm_id=vm_id,
        cores=1.0,
        memory_gib=1.0,
        tenant=tenant,
        features={"hour_of_day": hour, "batch_size": 1},
    )


def _churn(
    tracker: LifetimeTracker, seed: int, steps: int = 400
) -> tuple[ClusterState, dict[str, VmRecord]]:
    """Random bookings and exits (some evictions) on a few hosts, refits every 600 s."""
    rng = np.random.default_rng(seed)
    cluster = ClusterState()
    for h in range(HOSTS):
        cluster.add_host(f"h{h}", (64.0, 256.0, 0.0, 0.0))
    running: dict[str, VmRecord] = {}
    now = 0.0
    for step in range(steps):
        now += float(rng.integers(1, 120))
        if now >= tracker.next_deadline:
            tracker.advance(cluster, now)
        if running and rng.random() < 0.45:
            vm_id = sorted(running)[int(rng.integers(len(running)))]
            record = running.pop(vm_id)
            cluster.release(vm_id)
            tracker.on_released(cluster, record, now, exited=bool(rng.random() < 0.9))
        else:
            vm_id = f"v{step}"
            host = int(rng.integers(HOSTS))
            event = _request(vm_id, now, f"t{rng.integers(3)}", int(rng.integers(24)))
            record = cluster.book(vm_id, host, DEMAND, "", now)
            tracker.on_booked(cluster, record, now, event)
            running[vm_id] = record
        _check_hosts(tracker, cluster, running)
    return cluster, running


def _check_hosts(
    tracker: LifetimeTracker, cluster: ClusterState, running: dict[str, VmRecord]
) -> None:
    """Each host's list, latest exits and (when known) holder, from scratch."""
    for h in range(HOSTS):
        slots = sorted(tracker._slot[vm_id] for vm_id, r in running.items() if r.host == h)
        assert sorted(tracker.hosts.members(h, tracker.slots)) == slots
        if not slots:
            assert tracker.hosts.exit[h] == tracker.hosts.initial_exit[h] == -np.inf
            continue
        exits = tracker.slots.predicted_exit[slots]
        assert tracker.hosts.exit[h] == exits.max()
        assert tracker.hosts.initial_exit[h] == tracker.slots.initial_exit[slots].max()
        holder = int(tracker.hosts.holder[h])
        if holder >= 0:
            # The lowest slot among those with the latest exit.
            assert holder == slots[int(np.argmax(exits))]


def test_host_lists_and_latest_exits_follow_bookings_and_releases() -> None:
    warm_up_lifetime()  # through the entry points, as the policies call them
    settings = LifetimeSettings(refit_interval_s=600.0, min_observations=2)
    tracker = LifetimeTracker(settings)
    _, running = _churn(tracker, seed=3)
    assert running  # some VMs still running at the end
    # The holders found again by the compiled pass are the definition's.
    tracker.hosts.holder.fill(-1)
    tracker.hosts.quantiles_exit.fill(np.nan)
    tracker.host_exit_quantiles(HOSTS)
    for h in range(HOSTS):
        slots = sorted(tracker.hosts.members(h, tracker.slots))
        if slots:
            exits = tracker.slots.predicted_exit[slots]
            assert int(tracker.hosts.holder[h]) == slots[int(np.argmax(exits))]


# 60 s: the counts are re-anchored (``GroupedLifeTables._weight``) within the churn.
@pytest.mark.parametrize("half_life_s", [None, 3_600.0, 60.0])
def test_compiled_counting_is_observe_exit_and_observe_censored(half_life_s: float | None) -> None:
    """Counted by the release kernel or by the model's own methods: the same tables,
    forgetting's weights included."""
    settings = LifetimeSettings(refit_interval_s=600.0, min_observations=2, half_life_s=half_life_s)
    compiled = LifetimeTracker(settings)
    assert compiled._counts_plainly
    by_model = LifetimeTracker(settings)
    by_model._counts_plainly = False  # the model's observe_exit / observe_censored
    _churn(compiled, seed=5)
    _churn(by_model, seed=5)
    assert compiled.model.deaths.sum() > 0 and compiled.model.censored.sum() > 0
    np.testing.assert_array_equal(compiled.model.deaths, by_model.model.deaths)
    np.testing.assert_array_equal(compiled.model.censored, by_model.model.censored)
    np.testing.assert_array_equal(compiled.model.mass, by_model.model.mass)
    assert compiled.model._touched == by_model.model._touched
    if half_life_s == 60.0:
        # The first anchor is the creation of the first VM counted, in the first minutes.
        assert compiled.model._anchor is not None and compiled.model._anchor > 5_000.0
    np.testing.assert_array_equal(compiled.slots.predicted_exit, by_model.slots.predicted_exit)


def test_which_models_a_caller_may_count_for() -> None:
    bins = LifetimeBins.log_spaced()
    assert GroupedLifeTables(bins).counts_plainly()
    assert not GroupedLifeTables(bins).counts_by_age
    assert GroupedLifeTables(bins).count_weight(1e6) == 1.0
    # Forgetting weighs each count by its VM's creation, which a caller can take.
    forgetting = GroupedLifeTables(bins, half_life_s=86_400.0)
    assert forgetting.counts_plainly() and forgetting.counts_by_age
    assert forgetting.count_weight(0.0) == 1.0
    assert forgetting.count_weight(86_400.0) == pytest.approx(2.0)
    assert not GroupedLifeTables(bins, calibrator=SurvivalCalibrator(bins)).counts_plainly()
    # The wrappers learn from each exit themselves: they declare it.
    for name in ("mixture", "mixture-calibrated", "mixture-frailty-calibrated"):
        model = LIFETIME_MODELS.build(name, None, bins, LifetimeSettings())
        assert not model.counts_plainly()
        assert not model.pure_choice


def test_a_prediction_at_creation_is_kept_until_the_model_changes() -> None:
    cluster = ClusterState()
    cluster.add_host("h0", (64.0, 256.0, 0.0, 0.0))
    tracker = LifetimeTracker(LifetimeSettings(refit_interval_s=3600.0, min_observations=1))
    tracker.advance(cluster, 0.0)
    event = _request("a", 10.0, "t", 5)
    first = tracker.predict(event)
    assert tracker.predict(_request("b", 20.0, "t", 5)) is first  # same keys, same model
    assert tracker.predict(_request("c", 20.0, "u", 5)) is not first
    # After a refit with exits of 9,000 s in these groups, a new prediction.
    for _ in range(40):
        tracker.model.observe_exit(first.rows, 9000.0)
    tracker.advance(cluster, 3600.0)
    again = tracker.predict(_request("d", 3600.0, "t", 5))
    assert again is not first
    assert again.lifetime_s != first.lifetime_s
    # A placement's prediction is the one predict gives.
    request = PlacementRequest("e", DEMAND, "", None, 3600.0, _request("e", 3600.0, "t", 5))
    assert tracker.prediction_for(request) is again


def test_recalibrated_models_are_asked_each_time() -> None:
    """A recalibrating model records each prediction it is asked for: no keys cache."""
    settings = LifetimeSettings(model="mixture-calibrated")
    assert LifetimeTracker(settings)._by_keys is None
    assert LifetimeTracker(LifetimeSettings(oracle=True))._by_keys is None
    assert LifetimeTracker(LifetimeSettings())._by_keys is not None


def test_a_circular_host_list_ends_the_walks() -> None:
    """A damaged list (a cycle, as a hand-edited snapshot could hold) costs at
    most one step per slot; it does not hang the daemon."""
    # Host 0: slot 2 at its head, then 0 -> 1 -> 0 -> ... (a cycle).
    slot_times = np.zeros((SLOT_TIMES, 3))
    slot_times[PREDICTED_EXIT] = slot_times[INITIAL_EXIT] = [5.0, 7.0, 9.0]
    slot_ints = np.zeros((SLOT_INTS, 3), dtype=np.int64)
    slot_ints[NEXT_ON_HOST] = [1, 0, 0]
    slot_ints[PREV_ON_HOST] = [1, 0, -1]
    host_times = np.full((HOST_TIMES, 1), 9.0)
    host_ints = np.zeros((HOST_INTS, 1), dtype=np.int64)
    host_ints[HEAD] = 2
    host_ints[HOLDER] = 2
    # Slot 2 holds both maxima, so the walk over the others runs: it stops.
    leave_host(2, 0, slot_times, slot_ints, host_times, host_ints)
    assert host_times[HOST_EXIT, 0] == host_times[HOST_INITIAL_EXIT, 0] == 7.0
    assert host_ints[HOLDER, 0] == -1
    tracker = LifetimeTracker(LifetimeSettings())
    tracker.hosts.grow(1)
    tracker.hosts.head[0] = 0
    tracker.slots.next_on_host[:2] = [1, 0]
    members = tracker.hosts.members(0, tracker.slots)
    # The walk stops after one step per slot (the tracker has 64).
    assert len(members) == len(tracker.slots.next_on_host) == 64
    assert members[:4] == [0, 1, 0, 1]


def test_the_refits_compiled_counting_and_suffix_sums_are_numpys_to_the_bit() -> None:
    # ``add_running_censorings`` stands for ``np.add.at`` over each level in
    # turn, and ``scatter_suffix_sums`` for ``suffix_sums`` scattered into the
    # rows: the same additions in the same order, so equal arrays (not close).
    rng = np.random.default_rng(7)
    bins = LifetimeBins.log_spaced()
    width = bins.count
    rows, vms = 40, 300
    running = rng.integers(0, rows, size=(vms, 3)).astype(np.int64)
    dirty = np.unique(running.ravel())
    columns = bins.index(rng.exponential(3600.0, size=vms))
    start = rng.random((len(dirty), width)) * 5.0
    for weights in (rng.random(vms), np.zeros(0)):
        expected = start.copy()
        for level in range(3):
            local = np.searchsorted(dirty, running[:, level])
            np.add.at(expected, (local, columns), weights if len(weights) else 1.0)
        got = start.copy()
        add_running_censorings(got, dirty, running, columns, weights)
        assert np.array_equal(got, expected)
    mass = rng.dirichlet(np.ones(width), size=len(dirty))
    m0, m1 = np.full((rows, width + 1), -1.0), np.full((rows, width + 1), -1.0)
    scatter_suffix_sums(mass, bins.representative, dirty, m0, m1)
    expected0, expected1 = suffix_sums(mass, bins)
    assert np.array_equal(m0[dirty], expected0)
    assert np.array_equal(m1[dirty], expected1)
    untouched = np.setdiff1d(np.arange(rows), dirty)
    assert (m0[untouched] == -1.0).all()


def _numpy_life_table(
    deaths: np.ndarray, censored: np.ndarray, tail_hazard: np.ndarray | None
) -> np.ndarray:
    """``life_table`` as numpy expressions (its former body): the reference order."""
    deaths = np.atleast_2d(deaths)
    censored = np.atleast_2d(censored)
    total = deaths.sum(axis=1, keepdims=True) + censored.sum(axis=1, keepdims=True)
    leaving = np.cumsum(deaths + censored, axis=1) - (deaths + censored)
    at_risk = total - leaving - censored / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        hazard = np.where(at_risk > 0, deaths / at_risk, 0.0)
    hazard = np.clip(hazard, 0.0, 1.0)
    if tail_hazard is not None:
        seen = (deaths + censored) > 0
        width = seen.shape[1]
        last_seen = width - 1 - np.argmax(seen[:, ::-1], axis=1)
        beyond = np.arange(width)[None, :] > last_seen[:, None]
        beyond[:, -1] = False
        hazard = np.where(beyond, tail_hazard[None, :], hazard)
    survival = np.cumprod(1.0 - hazard, axis=1)
    before = np.concatenate([np.ones((len(survival), 1)), survival[:, :-1]], axis=1)
    mass = before - survival
    mass[:, -1] += survival[:, -1]
    empty = total[:, 0] == 0
    mass[empty] = 1.0 / mass.shape[1]
    return mass


def test_the_compiled_life_table_is_numpys_to_the_bit() -> None:
    # The row totals are numpy's pairwise sums (8 running sums, halves past
    # 128 bins) and the rest sequential: with weighted (forgotten) counts the
    # order shows in the last bits, so the tables must be equal, not close.
    rng = np.random.default_rng(11)
    bins = LifetimeBins.log_spaced()
    for trial in range(120):
        rows = int(rng.choice([1, 4, 300]))
        width = bins.count if trial % 2 else int(rng.choice([1, 5, 8, 9, 127, 129, 300]))
        present = rng.random((2, rows, width)) < 0.4
        if trial % 3 == 0:  # plain counts
            counts = rng.integers(0, 6, size=(2, rows, width)).astype(np.float64)
        else:  # weighted counts, spread over magnitudes
            counts = rng.random((2, rows, width)) * 10.0 ** rng.integers(-6, 6, size=(2, rows, 1))
        deaths, censored = counts * present
        deaths[rng.random(rows) < 0.2] = 0.0  # groups with no death, or nothing at all
        censored[rng.random(rows) < 0.3] = 0.0
        tails: list[np.ndarray | None] = [None, rng.random(width) * 0.3]
        if width == bins.count:
            tails.append(bins.pareto_tail_hazard)
        for tail in tails:
            expected = _numpy_life_table(deaths, censored, tail)
            np.testing.assert_array_equal(life_table(deaths, censored, tail), expected)
    # A single group as a 1-D row, as ``observe_running`` passes it.
    row = np.array([1.0, 0.0, 2.5, 0.0])
    np.testing.assert_array_equal(
        life_table(row, row / 3.0), _numpy_life_table(row, row / 3.0, None)
    )


def test_the_refits_host_exits_and_holders_are_the_sorts() -> None:
    # ``rebuild_host_exits`` stands for np.maximum.at over the hosts and a
    # lexsort by (host, latest exit, slot): exits drawn from a few values so
    # that ties are common, some NaN (np.maximum keeps NaN; the sort puts it last).
    rng = np.random.default_rng(5)
    for trial in range(200):
        slots, hosts = int(rng.integers(1, 40)), int(rng.integers(1, 8))
        slot_times = np.zeros((SLOT_TIMES, slots))
        exits = rng.choice([1.0, 2.0, 3.0, np.inf, np.nan if trial % 4 == 0 else 2.0], slots)
        slot_times[PREDICTED_EXIT] = exits
        slot_ints = np.full((SLOT_INTS, slots), -1, dtype=np.int64)
        slot_ints[HOST] = rng.integers(0, hosts, slots)
        alive = np.flatnonzero(rng.random(slots) < 0.7)
        host_times = rng.random((HOST_TIMES, hosts))  # stale values, all overwritten
        host_ints = rng.integers(-1, slots, (HOST_INTS, hosts))
        rebuild_host_exits(alive, slot_times, slot_ints, host_times, host_ints)

        expected_exit = np.full(hosts, -np.inf)
        on = slot_ints[HOST, alive]
        with np.errstate(invalid="ignore"):  # NaN exits: the point of the trial
            np.maximum.at(expected_exit, on, exits[alive])
        order = np.lexsort((alive, -exits[alive], on))
        first = order[np.r_[True, on[order][1:] != on[order][:-1]]] if len(order) else order
        expected_holder = np.full(hosts, -1)
        expected_holder[on[first]] = alive[first]
        np.testing.assert_array_equal(host_times[HOST_EXIT], expected_exit)
        np.testing.assert_array_equal(host_ints[HOLDER], expected_holder)
