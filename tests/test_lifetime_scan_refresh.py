"""The scan's own refresh of the host quantiles against the refresh pass before it.

``lifetime_scan._refreshed_lifetime_scan`` brings each stale host's quantiles up
to date inside the scan's pass (the probe first, every other host at the
top of its iteration). That must leave every array as the pass of
``_refresh_host_quantiles`` followed by the scan does, and choose the same
hosts: checked here on random states with stale hosts of every kind (an
exit that moved, NaN, an emptied host, a holder to find again, a row whose
creation quantiles are not yet known), with a host's life taken as its
latest VM's and as the latest of all its VMs'.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from lavad.core.placement.kernels import (
    HEAD,
    HOLDER,
    HOST,
    HOST_EXIT,
    HOST_INTS,
    HOST_TIMES,
    NEXT_ON_HOST,
    PREDICTED_AT,
    PREDICTED_EXIT,
    QUANTILES_EXIT,
    QUANTILES_STAMP,
    ROW,
    SLOT_INTS,
    SLOT_TIMES,
    START,
    _refresh_host_quantiles,
    warm_up_lifetime,
)
from lavad.core.placement.lifetime_scan import _lifetime_scan, _refreshed_lifetime_scan
from lavad.core.placement.strand_kernels import no_stranding
from lavad.core.placement.waste import NO_GUARD_TEST

HOSTS = 40
ROWS = 6
EDGES = np.array([0.0, 1.0, 2.0, 4.0, 8.0])
LEVELS = np.array([0.1, 0.5, 0.9])


def _random_state(rng: np.random.Generator) -> dict[str, Any]:
    """A tracker's packed arrays with 0-4 VMs per host and a stale third of the hosts."""
    slots = 4 * HOSTS
    slot_times = np.zeros((SLOT_TIMES, slots))
    slot_ints = np.full((SLOT_INTS, slots), -1, dtype=np.int64)
    host_times = np.full((HOST_TIMES, HOSTS), -np.inf)
    host_ints = np.full((HOST_INTS, HOSTS), -1, dtype=np.int64)
    host_ints[QUANTILES_STAMP] = rng.integers(0, 5, HOSTS)
    host_q = rng.random((HOSTS, len(LEVELS))) * 10.0
    slot = 0
    for h in range(HOSTS):
        members = []
        for _ in range(int(rng.integers(0, 5))):
            start = float(rng.integers(0, 4))
            # Half the VMs predicted at creation (uptime 0), half later.
            at = start if rng.random() < 0.5 else start + float(rng.integers(1, 6))
            slot_times[START, slot] = start
            slot_times[PREDICTED_AT, slot] = at
            # Integers: ties between a host's VMs, which the holder's search breaks.
            slot_times[PREDICTED_EXIT, slot] = at + float(rng.integers(1, 4))
            slot_ints[HOST, slot] = h
            slot_ints[ROW, slot] = rng.integers(0, ROWS)
            members.append(slot)
            slot += 1
        for a, b in pairwise(members):
            slot_ints[NEXT_ON_HOST, a] = b
        if members:
            host_ints[HEAD, h] = members[0]
            latest = max(members, key=lambda s: (slot_times[PREDICTED_EXIT, s], -s))
            host_times[HOST_EXIT, h] = slot_times[PREDICTED_EXIT, latest]
            # A third of the holders unknown: the refresh finds them from the list.
            host_ints[HOLDER, h] = -1 if rng.random() < 0.33 else latest
        kind = rng.integers(0, 4)
        if kind == 0:
            host_times[QUANTILES_EXIT, h] = np.nan  # never computed
        elif kind == 1:
            host_times[QUANTILES_EXIT, h] = host_times[HOST_EXIT, h] + 1.0  # the exit moved
        else:
            host_times[QUANTILES_EXIT, h] = host_times[HOST_EXIT, h]  # up to date
    if HOSTS > 3 and host_ints[HEAD, 3] >= 0:
        host_times[HOST_EXIT, 3] = np.nan  # NaN: stale at every refresh
        host_times[QUANTILES_EXIT, 3] = np.nan
    mass = rng.random((ROWS, len(EDGES)))
    m0 = np.zeros((ROWS, len(EDGES) + 1))
    m0[:, :-1] = np.cumsum(mass[:, ::-1], axis=1)[:, ::-1]
    creation_known = rng.random(ROWS) < 0.5
    creation_q = np.where(creation_known[:, None], rng.random((ROWS, len(LEVELS))), 0.0)
    return {
        "slot_times": slot_times,
        "slot_ints": slot_ints,
        "host_times": host_times,
        "host_ints": host_ints,
        "host_q": host_q,
        "creation_q": creation_q,
        "creation_known": creation_known,
        "mass": mass,
        "m0": m0,
    }


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    return {key: value.copy() for key, value in state.items()}


@pytest.mark.parametrize("all_vms", [False, True], ids=["latest_vm", "all_vms"])
@pytest.mark.parametrize("cost_tolerance", [0.0, 1.5])
@pytest.mark.parametrize("seed", range(12))
def test_refreshing_inside_the_scan_is_the_pass_before_it(
    seed: int, cost_tolerance: float, all_vms: bool
) -> None:
    warm_up_lifetime()
    rng = np.random.default_rng(seed)
    state = _random_state(rng)
    free = rng.random((4, HOSTS))
    inv_capacity = np.ones((4, HOSTS))
    unschedulable = rng.random(HOSTS) < 0.1
    weights = np.ones(4)
    present = np.ones(4, dtype=np.bool_)
    preference = np.zeros(HOSTS)
    thresholds = np.sort(rng.random(20) * 10.0)
    demand = (0.3, 0.3, 0.0, 0.0)
    now, lifetime, epoch = 4.0, 2.0, 1
    probe = int(rng.integers(-1, HOSTS))
    tail = (EDGES, 3.0, LEVELS, all_vms)

    separate = _copy(state)
    separate_floor = np.zeros((2, HOSTS))
    separate_marks = np.full((2, HOSTS), -1, dtype=np.int64)
    separate_ties = np.zeros(HOSTS, dtype=np.int64)
    s = separate
    _refresh_host_quantiles(
        HOSTS,
        (s["slot_times"], s["slot_ints"], s["host_times"], s["host_ints"], s["host_q"]),
        (s["creation_q"], s["creation_known"], s["mass"], s["m0"], *tail),
    )
    pool = (free, inv_capacity, unschedulable, present, weights)
    request = (HOSTS, *demand, 0.0, now, lifetime, cost_tolerance)
    preferred = (preference, False, NO_GUARD_TEST)
    las = (s["host_times"][HOST_EXIT], thresholds, True, thresholds, s["host_q"], True)
    floors = (
        separate_floor[0], separate_marks[0], separate_marks[1], s["host_ints"][QUANTILES_STAMP],
        epoch, True, separate_floor[1],
    )  # fmt: skip
    tracker = (s["slot_times"], s["slot_ints"], s["host_times"], s["host_ints"], s["host_q"])
    model = (s["creation_q"], s["creation_known"], s["mass"], s["m0"], *tail)
    # Refreshed by the pass before: the scan itself does not refresh.
    expected = _lifetime_scan(
        pool, request, preferred, las, separate_ties, probe, floors, False, tracker, model,
        no_stranding(),
    )  # fmt: skip

    fused = _copy(state)
    fused_floor = np.zeros((2, HOSTS))
    fused_marks = np.full((2, HOSTS), -1, dtype=np.int64)
    fused_ties = np.zeros(HOSTS, dtype=np.int64)
    f = fused
    got = _refreshed_lifetime_scan(
        pool, request, preferred, thresholds, fused_ties, probe, fused_floor, fused_marks, epoch,
        (f["slot_times"], f["slot_ints"], f["host_times"], f["host_ints"], f["host_q"]),
        (f["creation_q"], f["creation_known"], f["mass"], f["m0"], *tail), no_stranding(),
    )  # fmt: skip

    assert got == expected
    count = expected[0]
    assert count >= 1  # the scan chose something, so the comparison says something
    np.testing.assert_array_equal(fused_ties[:count], separate_ties[:count])
    for key in state:
        # assert_array_equal takes NaN as equal to NaN, as the refresh's state has them.
        np.testing.assert_array_equal(fused[key], separate[key], err_msg=key)
    np.testing.assert_array_equal(fused_floor, separate_floor)
    np.testing.assert_array_equal(fused_marks, separate_marks)
    # The state did move: some host was stale and got its quantiles rewritten.
    assert (separate["host_ints"][QUANTILES_STAMP] != state["host_ints"][QUANTILES_STAMP]).any()
