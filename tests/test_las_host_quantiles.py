"""LAS with the host's remaining life as quantiles (``host_quantiles``), worked by hand.

The VM's remaining life is 1 h or 5 h (two quantiles); each host's is two
quantiles too. The cost of a host is the sum, over the host's quantiles d
and the VM's q, of the LAS bucket index of max(q - d, 0), buckets {0, 30m,
60m, 90m, 2h, 3h, 4h, 6h, 12h, 24h, 168h}:

| host | its quantiles | q = 1 h | q = 5 h | sum |
|---|---|---|---|---|
| empty | 0, 0 | 2 + 2 (60m) | 6 + 6 (300m) | 16 |
| 2 h, 2 h | 2h, 2h | 0 + 0 | 5 + 5 (180m) | 10 |
| 30 m, 6 h | 30m, 6h | 1 + 0 (30m) | 6 + 0 (270m) | 7 |
| 3 h, 3 h | 3h, 3h | 0 + 0 | 4 + 4 (120m) | 8 |

The spread host (30 m or 6 h) is cheapest although its mean (3 h 15 m) is
the latest: a point exit would rank it with the 3 h host.
"""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.kernels import (
    HEAD,
    HOST_EXIT,
    HOST_INTS,
    HOST_TIMES,
    NEXT_ON_HOST,
    QUANTILES_EXIT,
    QUANTILES_STAMP,
    ROW,
    SLOT_INTS,
    SLOT_TIMES,
    _refresh_host_quantiles,
)
from lavad.core.placement.lifetime import (
    LAS_BUCKETS_S,
    LifetimeSettings,
    LifetimeTracker,
    cost_thresholds,
    expected_cost_counts,
)
from lavad.core.placement.lifetime_scan import _probed_lifetime_scan
from lavad.core.placement.registry import validate_policy_args
from lavad.core.placement.strand_kernels import no_stranding
from lavad.core.placement.waste import NO_GUARD_TEST
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.survival import (
    Tables,
    midpoint_levels,
    remaining_quantiles,
    remaining_quantiles_into,
    suffix_sums,
)
from lavad.streams.schema import VmRequest

H = 3600.0
NOW = 1000.0
VM_REMAINING = np.array([1 * H, 5 * H])
HOSTS = [
    ([-np.inf, -np.inf], 16.0),  # empty: -inf, clipped at now
    ([2 * H, 2 * H], 10.0),
    ([0.5 * H, 6 * H], 7.0),
    ([3 * H, 3 * H], 8.0),
]


def _numpy_cost(host_remaining: list[float]) -> float:
    thresholds = cost_thresholds(VM_REMAINING)
    remaining = np.maximum(np.array(host_remaining), 0.0)
    return float(sum(expected_cost_counts(thresholds, remaining[j : j + 1])[0] for j in range(2)))


@pytest.mark.parametrize(("host_remaining", "expected"), HOSTS)
def test_cost_by_hand(host_remaining: list[float], expected: float) -> None:
    assert _numpy_cost(host_remaining) == expected
    # The compiled scan on that host alone gives the same count.
    host_q = NOW + np.array([host_remaining])
    count, _, cost, *_ = _probed_lifetime_scan(
        (
            np.full((4, 1), 10.0), np.ones((4, 1)), np.zeros(1, dtype=np.bool_),
            np.array([True, True, False, False]), np.ones(4),
        ),
        (1, 1.0, 1.0, 0.0, 0.0, 0.0, NOW, 0.0, 0.0),
        (np.zeros(1), False, NO_GUARD_TEST),
        (np.full(1, NOW), cost_thresholds(VM_REMAINING), True, LAS_BUCKETS_S, host_q, True),
        np.zeros(1, dtype=np.int64), -1, no_stranding(),
    )  # fmt: skip
    assert count == 1
    assert cost == expected


def test_scan_picks_the_cheapest_host() -> None:
    host_q = NOW + np.array([h for h, _ in HOSTS])
    ties = np.zeros(4, dtype=np.int64)
    count, _, cost, *_ = _probed_lifetime_scan(
        (
            np.full((4, 4), 10.0), np.ones((4, 4)), np.zeros(4, dtype=np.bool_),
            np.array([True, True, False, False]), np.ones(4),
        ),
        (4, 1.0, 1.0, 0.0, 0.0, 0.0, NOW, 0.0, 0.0),
        (np.zeros(4), False, NO_GUARD_TEST),
        (np.full(4, NOW), cost_thresholds(VM_REMAINING), True, LAS_BUCKETS_S, host_q, True),
        ties, -1, no_stranding(),
    )  # fmt: skip
    assert (count, cost, int(ties[0])) == (1, 7.0, 2)


def test_tracker_takes_the_quantiles_of_the_host_longest_lived_vm() -> None:
    """A host's quantiles are those of the VM holding its exit, as times, recomputed on change."""
    tracker = LifetimeTracker(
        LifetimeSettings(min_observations=1, scoring="quantiles", host_quantiles=2)
    )
    cluster = ClusterState()
    cluster.add_host("h0", (64.0, 256.0, 0.0, 0.0))
    cluster.add_host("h1", (64.0, 256.0, 0.0, 0.0))
    now = 0.0
    # Teach the model: small VMs live 1 h, large ones 10 h.
    for i in range(40):
        cores = 1.0 if i % 2 else 8.0
        event = VmRequest(time=now, pool="p", vm_id=f"old{i}", cores=cores, memory_gib=cores)
        tracker.on_booked(
            cluster, cluster.book(f"old{i}", 1, (cores, cores, 0, 0), "", now), now, event
        )
        lived = H if cores == 1.0 else 10 * H
        tracker.on_released(cluster, cluster.release(f"old{i}"), now + lived, exited=True)
    now = 20 * H
    tracker.advance(cluster, now)  # refit
    assert (tracker.host_exit_quantiles(2) == -np.inf).all()  # both hosts empty
    for vm, cores in (("short", 1.0), ("long", 8.0)):
        event = VmRequest(time=now, pool="p", vm_id=vm, cores=cores, memory_gib=cores)
        tracker.on_booked(cluster, cluster.book(vm, 0, (cores, cores, 0, 0), "", now), now, event)
    got = tracker.host_exit_quantiles(2)
    long_slot = tracker._slot["long"]
    model = tracker.model
    expected = (
        now
        + remaining_quantiles(
            model, np.array([tracker.slots.row[long_slot]]), np.zeros(1), midpoint_levels(2)
        )[0]
    )
    np.testing.assert_array_equal(got[0], expected)
    assert (got[1] == -np.inf).all()
    # The long VM leaves: the host's quantiles become the short VM's.
    tracker.on_released(cluster, cluster.release("long"), now + 60.0, exited=True)
    short_slot = tracker._slot["short"]
    expected_short = (
        now
        + remaining_quantiles(
            model, np.array([tracker.slots.row[short_slot]]), np.zeros(1), midpoint_levels(2)
        )[0]
    )
    np.testing.assert_array_equal(tracker.host_exit_quantiles(2)[0], expected_short)
    assert expected_short[1] < expected[1]


def test_compiled_remaining_quantiles_are_numpys_numbers() -> None:
    """The hosts' quantiles come from a compiled copy of ``remaining_quantiles``:
    bit for bit the same, at uptime 0, inside bins, on edges, past the horizon,
    and for a row with no mass ahead (the Lindy rule: u at every level)."""
    bins = LifetimeBins.log_spaced()
    rng = np.random.default_rng(11)
    width = bins.count
    mass = rng.dirichlet(np.full(width, 0.3), size=6)
    mass[1, 3:] = 0.0  # nothing beyond bin 3: no mass ahead of a later uptime
    mass[1, :3] /= mass[1, :3].sum()
    m0, m1 = suffix_sums(mass, bins)
    levels = midpoint_levels(8)
    edges = bins.edges
    uptimes = [0.0, 1.0, 59.0, float(edges[3]), float(edges[5]) * 1.5, float(edges[-1]) * 3.0]
    uptimes += rng.uniform(0.0, float(edges[-1]), 10).tolist()
    for row in range(len(mass)):
        for uptime in uptimes:
            expected = remaining_quantiles(
                Tables(bins, mass, m0, m1), np.array([row]), np.array([uptime]), levels
            )
            got = np.zeros((2, len(levels)))
            remaining_quantiles_into(
                mass, m0, row, uptime, edges, float(bins.representative[-1]), levels, got, 1
            )
            assert got[1].tolist() == expected[0].tolist(), (row, uptime)


def _taught_tracker(host_life: str, host_quantiles: int) -> tuple[LifetimeTracker, ClusterState]:
    """A tracker whose model has seen small VMs live 1 h and large ones 10 h, refit at 20 h."""
    tracker = LifetimeTracker(
        LifetimeSettings(
            min_observations=1,
            scoring="quantiles",
            host_quantiles=host_quantiles,
            host_life=host_life,  # type: ignore[arg-type]
        )
    )
    cluster = ClusterState()
    for name in ("h0", "h1"):
        cluster.add_host(name, (64.0, 256.0, 0.0, 0.0))
    for i in range(40):
        cores = 1.0 if i % 2 else 8.0
        event = VmRequest(time=0.0, pool="p", vm_id=f"old{i}", cores=cores, memory_gib=cores)
        tracker.on_booked(
            cluster, cluster.book(f"old{i}", 1, (cores, cores, 0, 0), "", 0.0), 0.0, event
        )
        lived = H if cores == 1.0 else 10 * H
        tracker.on_released(cluster, cluster.release(f"old{i}"), lived, exited=True)
    tracker.advance(cluster, 20 * H)  # refit
    return tracker, cluster


def _book(tracker: LifetimeTracker, cluster: ClusterState, vm: str, host: int, now: float) -> None:
    event = VmRequest(time=now, pool="p", vm_id=vm, cores=8.0, memory_gib=8.0)
    tracker.on_booked(cluster, cluster.book(vm, host, (8.0, 8.0, 0, 0), "", now), now, event)


def test_all_vms_takes_the_latest_exit_of_every_vm_by_hand() -> None:
    """Two VMs alike on one host, four quantiles each at levels 1/8, 3/8, 5/8, 7/8.

    One VM's remaining life is its points p1 < p2 < p3 < p4, each with
    probability 1/4. The host empties by t when both have, so at the k-th
    point P(empty) = (k/4)^2 = 1/16, 4/16, 9/16, 1. Each level's quantile is
    the first point where that reaches the level: 1/8 -> p2 (4/16), 3/8 -> p3
    (9/16), 5/8 -> p4, 7/8 -> p4. The latest VM's rule gives p1, p2, p3, p4
    whatever the count, as if the second VM could not outlive the first.
    """
    tracker, cluster = _taught_tracker("all_vms", 4)
    now = 20 * H
    _book(tracker, cluster, "a", 0, now)
    _book(tracker, cluster, "b", 0, now)
    _book(tracker, cluster, "alone", 1, now)
    got = tracker.host_exit_quantiles(2)
    p1, p2, p3, p4 = got[1]  # host 1 holds one such VM: its own four points
    assert p1 < p2 < p3 < p4
    assert got[0].tolist() == [p2, p3, p4, p4]
    # One leaves: the host's quantiles are the other's alone again.
    tracker.on_released(cluster, cluster.release("b"), now + 60.0, exited=True)
    assert tracker.host_exit_quantiles(2)[0].tolist() == [p1, p2, p3, p4]

    latest, latest_cluster = _taught_tracker("latest_vm", 4)
    _book(latest, latest_cluster, "a", 0, now)
    _book(latest, latest_cluster, "b", 0, now)
    assert latest.host_exit_quantiles(1)[0].tolist() == [p1, p2, p3, p4]


def test_all_vms_matches_the_product_of_the_vms_shares() -> None:
    """Against a batch computation: VMs of both kinds booked at different times on one
    host, the host's quantiles are, at each level, the first of the VMs' points where
    the product over VMs of the share of each one's points passed reaches the level."""
    rng = np.random.default_rng(5)
    tracker, cluster = _taught_tracker("all_vms", 8)
    now = 20 * H
    for i in range(7):
        cores = float(rng.choice([1.0, 8.0]))
        at = now + float(rng.uniform(0.0, 0.5 * H))
        event = VmRequest(time=at, pool="p", vm_id=f"v{i}", cores=cores, memory_gib=cores)
        record = cluster.book(f"v{i}", 0, (cores, cores, 0, 0), "", at)
        tracker.on_booked(cluster, record, at, event)
    got = tracker.host_exit_quantiles(1)[0]
    levels = midpoint_levels(8)
    points = []
    for i in range(7):
        slot = tracker._slot[f"v{i}"]
        at = float(tracker.slots.predicted_at[slot])
        uptime = at - float(tracker.slots.start[slot])
        row = np.array([tracker.slots.row[slot]])
        points.append(at + remaining_quantiles(tracker.model, row, np.array([uptime]), levels)[0])
    times = np.sort(np.concatenate(points))
    empty_by = np.array([np.prod([np.count_nonzero(p <= t) / 8 for p in points]) for t in times])
    expected = [times[np.argmax(empty_by >= level - 1e-9)] for level in levels]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # The latest of all exits is no earlier, level by level, than any one VM's.
    assert (got >= np.max(points, axis=0) - 1e-6).all()


@pytest.mark.parametrize(
    ("args", "key"),
    [
        # A host costed by its point exit has no quantiles to take from all its VMs.
        ({"host_life": "all_vms", "host_quantiles": 0}, "host_life needs host_quantiles"),
        ({"host_life": "newest"}, "host_life"),
    ],
)
def test_unusable_host_life_is_refused(args: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        validate_policy_args("las", args)


def test_all_vms_ends_on_a_circular_host_list() -> None:
    """A damaged snapshot can make a host's list of VMs circular (the restore checks
    each link's range, not cycles): the walk is bounded by the slots, not the links,
    so the refresh ends, counting each slot once per step, with quantiles in time."""
    slots = 3
    slot_times = np.zeros((SLOT_TIMES, slots))
    slot_ints = np.full((SLOT_INTS, slots), -1, dtype=np.int64)
    slot_ints[ROW] = 0
    slot_ints[NEXT_ON_HOST, 0], slot_ints[NEXT_ON_HOST, 1] = 1, 0  # 0 -> 1 -> 0 -> ...
    host_times = np.zeros((HOST_TIMES, 1))
    host_times[HOST_EXIT, 0] = 5.0
    host_times[QUANTILES_EXIT, 0] = np.nan
    host_ints = np.full((HOST_INTS, 1), -1, dtype=np.int64)
    host_ints[HEAD, 0] = 0
    host_ints[QUANTILES_STAMP, 0] = 0
    host_q = np.zeros((1, 2))
    edges = np.array([0.0, 1.0, 2.0, 4.0])
    mass = np.array([[0.25, 0.25, 0.25, 0.25]])
    m0 = np.array([[1.0, 0.75, 0.5, 0.25, 0.0]])
    tracker = (slot_times, slot_ints, host_times, host_ints, host_q)
    model = (np.zeros((1, 2)), np.zeros(1, dtype=np.bool_), mass, m0, edges, 8.0,
             midpoint_levels(2), True)  # fmt: skip
    _refresh_host_quantiles(1, tracker, model)
    assert np.isfinite(host_q[0]).all()
    assert host_q[0, 0] <= host_q[0, 1]
    assert host_times[QUANTILES_EXIT, 0] == 5.0
