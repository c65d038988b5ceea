"""A refit rebuilds only the rows that changed, and gives what a full rebuild gives, bit for bit."""

from __future__ import annotations

import numpy as np

from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.protocol import RunningVMs
from lavad.models.lifetime.survival import life_table, suffix_sums


def _full_rebuild(model: GroupedLifeTables, running: np.ndarray, uptimes: np.ndarray) -> np.ndarray:
    """The rebuild of every row, as refits did before they skipped unchanged rows."""
    n = model.groups
    censored = model.censored[:n].copy()
    if len(uptimes):
        columns = model.bins.index(uptimes)
        for level in range(LEVELS):
            np.add.at(censored, (running[:, level], columns), 1.0)
    mass: np.ndarray = life_table(model.deaths[:n], censored, model.tail_hazard)
    return mass


def test_refit_of_changed_rows_equals_a_full_rebuild() -> None:
    rng = np.random.default_rng(17)
    model = GroupedLifeTables(LifetimeBins.log_spaced(), min_observations=5)
    running: dict[int, tuple[tuple[int, ...], float]] = {}
    next_vm = 0
    for step in range(60):
        now = step * 3600.0
        for _ in range(int(rng.integers(0, 40))):
            # 50 tenants, 4 shapes: many groups, most of them idle at any refit.
            keys = (f"t{rng.integers(50)}", f"s{rng.integers(4)}", "b", "c", ())
            running[next_vm] = (model.rows_for(keys), now)
            next_vm += 1
        for vm in list(running):
            if rng.random() < 0.2:
                rows, start = running.pop(vm)
                if rng.random() < 0.9:
                    model.observe_exit(rows, now - start)
                else:
                    model.observe_censored(rows, now - start)
        rows_array = np.array([r for r, _ in running.values()], dtype=np.int64).reshape(-1, LEVELS)
        uptimes = np.array([now - s for _, s in running.values()])
        expected = _full_rebuild(model, rows_array, uptimes)
        model.refit(RunningVMs(rows_array, uptimes))
        n = model.groups
        np.testing.assert_array_equal(model.mass[:n], expected)
        m0, m1 = suffix_sums(expected, model.bins)
        np.testing.assert_array_equal(model.m0[:n], m0)
        np.testing.assert_array_equal(model.m1[:n], m1)


def test_a_refit_rebuilds_a_row_recounted_since_even_with_the_same_counts() -> None:
    # A refit keeps the table of a row whose counts come out as at the last
    # refit; a row recounted in between (a sibling's exit) holds a table from
    # other counts, so the refit must rebuild it, not keep it.
    model = GroupedLifeTables(LifetimeBins.log_spaced(), min_observations=1)
    rows = model.rows_for(("t", "s", "b", "c", ()))
    for lifetime in (600.0, 1200.0, 7200.0):
        model.observe_exit(rows, lifetime)
    running = np.array([rows], dtype=np.int64)
    uptimes = np.array([3000.0])
    model.refit(RunningVMs(running, uptimes))
    fitted = model.mass[: model.groups].copy()
    # The owner row recounted with its running VM far older: its table moves.
    model.observe_running(rows[0], np.array([500_000.0]))
    assert not np.array_equal(model.mass[rows[0]], fitted[rows[0]])
    # Same running VM, same uptime, nothing observed: the counts are those of
    # the last refit, so every row's table is the one fitted then.
    model.refit(RunningVMs(running, uptimes))
    n = model.groups
    np.testing.assert_array_equal(model.mass[:n], fitted)
    np.testing.assert_array_equal(model.mass[:n], _full_rebuild(model, running, uptimes))
