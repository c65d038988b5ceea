"""The bookkeeping the mixture and the frailty share: bands, interval outcomes, the combo bound."""

from __future__ import annotations

import numpy as np
import pytest

from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.combos import bin_bands, check_band_edges, interval_outcomes
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.frailty import FrailtyLifeTables
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.mixture import MixtureLifeTables
from lavad.models.lifetime.protocol import RunningVMs

KEYS_T = (("t", "1c"), ("1c", 0, 1), ("1c",), ("all",), ())
KEYS_U = (("u", "2c"), ("2c", 0, 1), ("2c",), ("all",), ())
KEYS_V = (("v", "2c"), ("2c", 0, 1), ("2c",), ("all",), ())
NO_VMS = np.zeros((0, LEVELS), dtype=np.int64)


def _small_bins() -> LifetimeBins:
    # edges 0, 100, 1000, 10000 s and the open bin
    return LifetimeBins.log_spaced(first_s=100.0, horizon_s=10_000.0, count=3)


def test_band_edges_are_checked_and_bins_fall_in_the_band_of_their_lower_edge() -> None:
    assert check_band_edges((100, 1000)) == (100.0, 1000.0)
    for bad in ((1000.0, 100.0), (0.0, 100.0)):
        with pytest.raises(ValueError, match="band_edges_s"):
            check_band_edges(bad)
    # An edge on a band edge is in the band above it (0 | 100 | 1000 ...).
    edges = np.array([0.0, 50.0, 100.0, 999.0, 1000.0, 10_000.0])
    assert bin_bands((100.0, 1000.0), edges).tolist() == [0, 0, 1, 1, 2, 2]
    assert bin_bands((), edges).tolist() == [0] * 6


def _interval(exits_to_now: bool) -> tuple[list[float], list[float], list[bool]]:
    rows = (1, 2, 3, 4, 5)
    running = np.array([rows, rows], dtype=np.int64)
    # Refits at 1000 and 2000. Running: uptimes 1500 and 300 at 2000.
    # Left since 1000: an exit (started 800, seen 1100: died at 1900) and an
    # eviction (started 1200, seen 500).
    pending = [(rows, 800.0, 1100.0, True), (rows, 1200.0, 500.0, False)]
    all_rows, u0, u1, died = interval_outcomes(
        running, np.array([1500.0, 300.0]), pending, 1000.0, 2000.0, exits_to_now=exits_to_now
    )
    assert all_rows.shape == (4, LEVELS)
    return u0.tolist(), u1.tolist(), died.tolist()


def test_interval_outcomes_by_hand() -> None:
    # Running: u0 = max(uptime - 1000, 0) = 500 and 0; u1 = their uptimes.
    # The exit: u0 = 1000 - 800 = 200; the eviction, created since: u0 = 0.
    # Scored over the whole interval, the exit ends at 2000 - 800 = 1200.
    assert _interval(exits_to_now=True) == (
        [500.0, 0.0, 200.0, 0.0],
        [1500.0, 300.0, 1200.0, 500.0],
        [False, False, True, False],
    )
    # Counted as far as seen, it ends at 1100.
    assert _interval(exits_to_now=False) == (
        [500.0, 0.0, 200.0, 0.0],
        [1500.0, 300.0, 1100.0, 500.0],
        [False, False, True, False],
    )


def test_the_frailty_past_its_combo_bound_drops_the_owners_multiplier() -> None:
    model = FrailtyLifeTables(
        GroupedLifeTables(_small_bins(), min_observations=1), half_life_s=None, max_combos=2
    )
    rows_t, rows_u, rows_v = (model.rows_for(k) for k in (KEYS_T, KEYS_U, KEYS_V))
    # Only owner t has VMs: u and v fall back to the ("all",) row.
    model.observe_exit(rows_t, 50.0, now=50.0)
    model.refit(RunningVMs(NO_VMS, np.zeros(0)), now=1000.0)
    # Owners t and v get evidence; u none.
    model.add_evidence(
        np.array([rows_t, rows_v]), np.zeros(2), np.array([50.0, 50.0]), np.array([True, True])
    )
    model.refit(RunningVMs(NO_VMS, np.zeros(0)), now=2000.0)
    first = model.choose(rows_u)  # (the ("all",) row, no owner): combo 0
    # t's key (its base row, its owner) is past the bound: its base row alone.
    second = model.choose(rows_t)
    assert (first, second, model.combos) == (0, 1, 2)
    np.testing.assert_allclose(
        model.mass[second], model.base.mass[model.base.choose(rows_t)], rtol=0, atol=1e-15
    )
    # v has u's base row; past the bound it gets u's combo, without v's multiplier.
    assert model.base.choose(rows_v) == model.base.choose(rows_u)
    assert model.choose(rows_v) == first and model.combos == 2


def test_the_mixture_past_its_combo_bound_shares_the_pool_wide_combo() -> None:
    model = MixtureLifeTables(_small_bins(), min_observations=1, max_combos=2)
    rows_t, rows_u = model.rows_for(KEYS_T), model.rows_for(KEYS_U)
    model.observe_exit(rows_t, 50.0, now=50.0)
    model.observe_exit(rows_u, 500.0, now=600.0)
    model.refit(RunningVMs(NO_VMS, np.zeros(0)), now=1000.0)
    first = model.choose(rows_t)  # each member's row of owner t: combo 0
    # u's key is past the bound: every member's pool row, the pool's weights.
    second = model.choose(rows_u)
    assert (first, second, model.combos) == (0, 1, 2)
    pool = rows_u[-1]
    assert pool == rows_t[-1]
    assert model._combo_rows[second].tolist() == [pool] * len(model.members)
    assert model._combo_owner[second] == -1
