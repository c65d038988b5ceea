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
from lavad.core.placement.lifetime import (
    LAS_BUCKETS_S,
    LifetimeSettings,
    LifetimeTracker,
    cost_thresholds,
    expected_cost_counts,
)
from lavad.core.placement.lifetime_scan import _probed_lifetime_scan
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
