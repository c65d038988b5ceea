"""The lifetime model: life tables against a hand/batch computation, censoring, repredictions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from live_support import AZURE_SLICE

from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import LEVELS, lifetime_keys
from lavad.models.lifetime.grouped import MAX_MODEL_KEYS, GroupedLifeTables
from lavad.models.lifetime.protocol import RunningVMs
from lavad.models.lifetime.survival import (
    Tables,
    _ahead,
    expected_remaining,
    fill_suffix_sums,
    life_table,
    median_remaining,
    suffix_sums,
    survival_beyond,
)
from lavad.streams.adapters import open_trace
from lavad.streams.schema import VmExit, VmRequest

BINS = LifetimeBins.log_spaced(first_s=300.0, horizon_s=30 * 86_400.0, count=30)


def test_life_table_worked_by_hand() -> None:
    # Three bins. 4 VMs: deaths 1 in bin 0, 1 in bin 1; censored 2 in bin 1.
    # at risk: bin 0 = 4; bin 1 = 4 - 1 - 2/2 = 2; bin 2 = 4 - 1 - 3 - 0 = 0
    # hazard:  1/4, 1/2, 0 -> S = 0.75, 0.375, 0.375
    # mass:    0.25, 0.375, 0 + 0.375 (what survives goes to the last bin)
    mass = life_table(np.array([1.0, 1.0, 0.0]), np.array([0.0, 2.0, 0.0]))
    assert mass[0] == pytest.approx([0.25, 0.375, 0.375])


def test_life_table_without_censoring_is_the_histogram() -> None:
    lifetimes = np.random.default_rng(3).lognormal(8.0, 2.0, size=5_000)
    deaths = np.bincount(BINS.index(lifetimes), minlength=BINS.count).astype(float)
    mass = life_table(deaths, np.zeros(BINS.count))[0]
    assert mass == pytest.approx(deaths / deaths.sum())


def test_expected_remaining_matches_a_direct_computation() -> None:
    lifetimes = np.random.default_rng(4).lognormal(9.0, 1.5, size=20_000)
    deaths = np.bincount(BINS.index(lifetimes), minlength=BINS.count).astype(float)
    mass = life_table(deaths, np.zeros(BINS.count))
    m0, m1 = suffix_sums(mass, BINS)
    # At uptime 0, E[T] is the mean of the binned distribution.
    got = expected_remaining(Tables(BINS, mass, m0, m1), np.array([0]), np.array([0.0]))[0]
    assert got == pytest.approx(float((mass[0] * BINS.representative).sum()))
    # At an uptime on a bin edge, E[T | T > u] is the mean of the bins beyond.
    edge = 10
    u = BINS.edges[edge]
    beyond = mass[0, edge:]
    direct = float((beyond * BINS.representative[edge:]).sum() / beyond.sum()) - u
    got = expected_remaining(Tables(BINS, mass, m0, m1), np.array([0]), np.array([u]))[0]
    assert got == pytest.approx(direct)


def test_the_compiled_suffix_sums_of_a_row_are_the_numpy_ones() -> None:
    # Row 1 of a two-row table; row 0 and its sums must be left as they were.
    rng = np.random.default_rng(7)
    mass = rng.dirichlet(np.ones(BINS.count), size=2)
    m0, m1 = suffix_sums(mass, BINS)
    got0, got1 = np.full_like(m0, -1.0), np.full_like(m1, -1.0)
    fill_suffix_sums(mass, BINS.representative, got0, got1, 1)
    assert np.allclose(got0[1], m0[1], rtol=1e-12) and np.allclose(got1[1], m1[1], rtol=1e-12)
    assert got0[1, -1] == 0.0 and (got0[0] == -1.0).all() and (got1[0] == -1.0).all()


def _azure_lifetimes() -> tuple[np.ndarray, np.ndarray]:
    """Lifetimes of the bundled real Azure slice's VMs that exited, and the ages of the rest.

    VMs with no exit before the recording ends are censored at their age then.
    """
    trace = open_trace(AZURE_SLICE, seed=0)
    started: dict[str, float] = {}
    lived: list[float] = []
    for event in trace.events():
        if isinstance(event, VmRequest):
            started[event.vm_id] = event.time
        elif isinstance(event, VmExit) and event.vm_id in started:
            lived.append(event.time - started.pop(event.vm_id))
    assert trace.end_time is not None
    end = trace.end_time
    return np.array(lived), np.array([end - start for start in started.values()])


def _azure_counts() -> tuple[np.ndarray, np.ndarray]:
    """Deaths and censorings per bin over the bundled real Azure slice."""
    lived, ages = _azure_lifetimes()
    deaths = np.bincount(BINS.index(lived), minlength=BINS.count).astype(float)
    censored = np.bincount(BINS.index(ages), minlength=BINS.count).astype(float)
    return deaths, censored


def _numpy_ahead(tables: Tables, rows: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, ...]:
    """The mass ahead of each uptime and its first moment as whole-array numpy passes:
    the formulation ``survival._ahead`` compiles (the reference it must equal)."""
    bins, mass, m0, m1 = tables.bins, tables.mass, tables.m0, tables.m1
    edges = bins.edges
    last = len(edges) - 1
    j = bins.index(u)
    inner = j < last
    lo = edges[np.minimum(j, last - 1)]
    hi = edges[np.minimum(j + 1, last)]
    width = np.where(inner, hi - lo, 1.0)
    part = np.where(inner, np.clip((hi - u) / width, 0.0, 1.0), 1.0)
    here = mass[rows, j] * part
    rest = np.where(j == 0, (u + hi) / 2.0, np.sqrt(np.maximum(u, lo) * hi))
    middle = np.where(inner, rest, np.maximum(bins.representative[-1], u * 2.0))
    return here + m0[rows, j + 1], here * middle + m1[rows, j + 1]


def test_the_compiled_mass_ahead_is_numpys_bit_for_bit_on_real_tables() -> None:
    # Rows fitted on the real slice's lifetimes, each censored differently, and
    # uptimes on every kind of point: 0, bin edges exactly, inside bins, past
    # the horizon, infinite.
    deaths, censored = _azure_counts()
    rng = np.random.default_rng(11)
    scale = rng.uniform(0.0, 2.0, size=(40, 1))
    mass = life_table(np.tile(deaths, (40, 1)), np.tile(censored, (40, 1)) * scale)
    m0, m1 = suffix_sums(mass, BINS)
    tables = Tables(BINS, mass, m0, m1)
    uptimes = np.concatenate(
        (
            [0.0, np.inf, 2 * BINS.edges[-1]],
            BINS.edges,
            rng.uniform(0.0, 1.2 * BINS.edges[-1], 400),
            rng.lognormal(8.0, 3.0, 400),
        )
    )
    rows = rng.integers(0, 40, len(uptimes))
    ahead, moment = _ahead(BINS, mass, m0, m1, rows, uptimes)
    want_ahead, want_moment = _numpy_ahead(tables, rows, uptimes)
    assert np.array_equal(ahead, want_ahead) and np.array_equal(moment, want_moment)
    # One VM per call, as a live reprediction asks, and one row for many uptimes.
    for i in (0, 1, 5, 500):
        single = _ahead(BINS, mass, m0, m1, rows[i : i + 1], uptimes[i : i + 1])
        assert single[0][0] == want_ahead[i] and single[1][0] == want_moment[i]
    broadcast = _ahead(BINS, mass, m0, m1, np.array([3]), uptimes)
    assert np.array_equal(broadcast[0], _numpy_ahead(tables, np.array([3]), uptimes)[0])
    # A row outside the tables is refused, not read past them.
    for outside in (-1, 40):
        with pytest.raises(IndexError):
            _ahead(BINS, mass, m0, m1, np.array([outside]), np.array([1.0]))


def test_remaining_lifetime_grows_with_uptime_on_real_lifetimes() -> None:
    """Azure lifetimes are long-tailed: past an hour, the longer a VM ran, the more it has left."""
    deaths, censored = _azure_counts()
    mass = life_table(deaths, censored)
    m0, m1 = suffix_sums(mass, BINS)
    uptimes = np.array([3_600.0, 6 * 3_600.0, 86_400.0, 3 * 86_400.0])
    remaining = expected_remaining(Tables(BINS, mass, m0, m1), np.zeros(4, dtype=np.int64), uptimes)
    assert np.all(np.diff(remaining) > 0), remaining


def test_censored_long_lived_vms_never_shorten_the_prediction() -> None:
    short = np.random.default_rng(5).exponential(1_800.0, size=200)
    plain = GroupedLifeTables(BINS, min_observations=1)
    aware = GroupedLifeTables(BINS, min_observations=1)
    rows_plain = plain.rows_for(("t", "s", "b", "c", ()))
    rows_aware = aware.rows_for(("t", "s", "b", "c", ()))
    for lifetime in short:
        plain.observe_exit(rows_plain, float(lifetime))
        aware.observe_exit(rows_aware, float(lifetime))
    plain.refit(RunningVMs(np.zeros((0, LEVELS), dtype=np.int64), np.zeros(0)))
    # 50 VMs still running after 3 days: right-censored, not missing, not exits.
    running = np.tile(np.array(rows_aware), (50, 1))
    aware.refit(RunningVMs(running, np.full(50, 3 * 86_400.0)))
    row = np.array([rows_plain[0]])
    zero = np.zeros(1)
    e_plain = expected_remaining(plain, row, zero)[0]
    e_aware = expected_remaining(aware, row, zero)[0]
    assert e_aware > e_plain
    p_plain = survival_beyond(plain, row, 86_400.0, zero)[0]
    p_aware = survival_beyond(aware, row, 86_400.0, zero)[0]
    assert p_aware > p_plain


def test_back_off_to_coarser_groups_until_enough_observations() -> None:
    model = GroupedLifeTables(BINS, min_observations=3)
    rows = model.rows_for(("tenant", "2c4g", (1, 2), ("all",), ()))
    assert model.choose(rows) == rows[-1]  # nothing seen: the pool-wide group
    for _ in range(3):
        model.observe_exit(rows, 7_200.0)
    model.refit(RunningVMs(np.zeros((0, LEVELS), dtype=np.int64), np.zeros(0)))
    assert model.choose(rows) == rows[0]


def test_only_known_features_reach_the_model() -> None:
    """An oracle lifetime (or any other field) in the features changes no group."""
    plain = lifetime_keys("t", 2.0, 4.0, "", {"hour_of_day": 13, "batch_size": 3})
    leaky = lifetime_keys(
        "t", 2.0, 4.0, "", {"hour_of_day": 13, "batch_size": 3, "oracle_lifetime_s": 60.0}
    )
    assert leaky == plain
    assert plain[1] == ("2c4g", 2, 2)  # 13 h is in block 2 (12-18 h); 3 VMs: class 2


def test_repredictions_are_finite_and_non_negative_over_many_vms() -> None:
    deaths, censored = _azure_counts()
    mass = life_table(np.tile(deaths, (3, 1)), np.tile(censored, (3, 1)))
    m0, m1 = suffix_sums(mass, BINS)
    rows = np.array(list(itertools.islice(itertools.cycle([0, 1, 2]), 1_000)))
    uptimes = np.linspace(0.0, 40 * 86_400.0, 1_000)  # past the horizon too
    remaining = expected_remaining(Tables(BINS, mass, m0, m1), rows, uptimes)
    assert np.all(np.isfinite(remaining))
    assert np.all(remaining >= 0.0)


@pytest.mark.parametrize("uptime", [0.0, 1_800.0, 4 * 3_600.0, 86_400.0])
def test_median_remaining_against_numpy_on_real_lifetimes(uptime: float) -> None:
    """Without censoring the median of T_r | T_u is numpy's median of the lifetimes beyond u."""
    lifetimes, _ = _azure_lifetimes()
    deaths = np.bincount(BINS.index(lifetimes), minlength=BINS.count).astype(float)
    mass = life_table(deaths, np.zeros(BINS.count))
    tables = Tables(BINS, mass, *suffix_sums(mass, BINS))
    rows, u = np.array([0]), np.array([uptime])
    got = median_remaining(tables, rows, u)[0]
    # Consistent with the distribution: half the mass ahead of u lies beyond u + median.
    assert survival_beyond(tables, rows, uptime + got, u)[0] == pytest.approx(0.5)
    # And within one bin of the exact median (these bins are log-spaced by 1.37x).
    direct = float(np.median(lifetimes[lifetimes > uptime]))
    ratio = (uptime + got) / direct
    assert 1 / 1.37 < ratio < 1.37, (uptime + got, direct)


def test_a_stream_of_new_group_names_grows_no_table_past_its_bound() -> None:
    """A hostile producer sends a new tenant with every request: past ``max_rows``
    rows every new group shares its level's overflow row, so memory stays bounded
    and the VMs still get a distribution (their coarser groups':
    tests/test_lifetime_group_bound.py)."""
    tables = GroupedLifeTables(LifetimeBins.log_spaced(), min_observations=1, max_rows=20)
    for i in range(5_000):
        keys = (f"tenant-{i}", ("shape", i), ("hour", i % 24), (i % 7,), ())
        rows = tables.rows_for(keys)
        tables.observe_exit(rows, 600.0 + i)
    # 20 rows of real groups, plus at most one overflow row per level.
    assert tables.groups <= 20 + LEVELS
    assert len(tables.deaths) < 64  # arrays grew with the rows, not with the names
    late = tables.rows_for(("tenant-new", ("shape", -1), ("hour", 3), (3,), ()))
    assert tables.groups <= 20 + LEVELS
    assert tables.deaths[late[0]].sum() > 0  # the overflow group pooled earlier exits


def test_a_keys_rows_outlive_the_models_short_cache_of_keys() -> None:
    """The model's cache of key tuples starts afresh every ``MAX_MODEL_KEYS`` new
    tuples; a tuple met before and after that gets the rows it got first (rows are
    the groups' own, the cache only saves the lookups), and the cache stays bounded."""
    tables = GroupedLifeTables(BINS, min_observations=1)
    first = ("tenant-0", ("s",), ("h",), (1,), ())
    rows = tables.rows_for(first)
    for i in range(1, MAX_MODEL_KEYS + 10):
        tables.rows_for((f"tenant-{i}", ("s",), ("h",), (1,), ()))
        assert len(tables._by_keys) <= MAX_MODEL_KEYS
    assert first not in tables._by_keys  # cleared since: the rows come from the groups
    assert tables.rows_for(first) == rows
    # Each new tenant has its own row; the levels above it are shared.
    assert tables.groups == MAX_MODEL_KEYS + 10 + 4


def test_rows_a_table_grows_are_uniform_tables_with_their_own_sums() -> None:
    """Growing gives each new row the uniform table and exactly the sums (and raw
    survival) ``suffix_sums`` gives that row alone: the growth computes them once
    for all new rows, which must not change a bit of any row."""
    tables = GroupedLifeTables(BINS, min_observations=1)
    rows = tables.rows_for(("t", ("s",), ("h",), (1,), ()))
    tables.observe_exit(rows, 3_600.0)
    tables.refit(RunningVMs(np.zeros((0, LEVELS), dtype=np.int64), np.zeros(0)))
    before = len(tables.mass)
    fitted = tables.m0[list(rows)].copy()
    tables._grow(3 * before + 5)
    width = BINS.count
    uniform = np.full((1, width), 1.0 / width)
    m0, m1 = suffix_sums(uniform, BINS)
    new = slice(before, len(tables.mass))
    assert len(tables.mass) >= 3 * before + 5
    assert np.array_equal(tables.mass[new], np.broadcast_to(uniform, tables.mass[new].shape))
    assert np.array_equal(tables.m0[new], np.broadcast_to(m0, tables.m0[new].shape))
    assert np.array_equal(tables.m1[new], np.broadcast_to(m1, tables.m1[new].shape))
    grown_rows = len(tables.mass) - before
    raw = np.broadcast_to(m0[:, 1:width], (grown_rows, width - 1))
    assert np.array_equal(tables.raw_survival[new], raw)
    # A new row's sums are those of the uniform table taken row by row.
    assert np.array_equal(tables.m0[new][0:1], suffix_sums(tables.mass[new][0:1], BINS)[0])
    assert not tables.deaths[new].any() and not tables.censored[new].any()
    assert np.array_equal(tables.m0[list(rows)], fitted)  # rows grown over keep their tables
