"""Past the bound on groups (``max_rows``): the rows reclaimed for new groups, and the
groups that share an overflow row, which are no evidence.

A daemon meets new tenants for ever. At ``max_rows`` rows the default model
reclaims, at each refit, the rows of groups below the evidence bar that no
running VM reads; a new group with no row shares its level's overflow row.
That row pools tenants of every shape: taken as evidence, it soon has more
observations than any group and is chosen before the VM's own shape's
groups. These tests replay the bundled real Azure slice into models whose
bound is far below its groups.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from live_support import AZURE_SLICE
from support import PROJECT_ROOT

from lavad.core.engine import Engine
from lavad.core.placement import lifetime as lifetime_module
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.calibration import SurvivalCalibrator
from lavad.models.lifetime.features import LEVELS, request_keys
from lavad.models.lifetime.frailty import FrailtyLifeTables
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.mixture import MixtureLifeTables
from lavad.models.lifetime.protocol import GroupRows, LifetimeModel, RunningVMs
from lavad.models.lifetime.shrunk import ShrunkLifeTables
from lavad.streams.adapters import open_trace
from lavad.streams.schema import VmExit, VmRequest

BINS = LifetimeBins.log_spaced()
# The slice's VMs make a few thousand groups: past 40 rows nearly every new
# tenant (level 0) overflows, and so do later shapes' coarser groups.
BOUND = 40
MIN_OBSERVATIONS = 30


def _running(started: dict[str, tuple[GroupRows, float]], now: float) -> RunningVMs:
    return RunningVMs(
        np.array([rows for rows, _ in started.values()], dtype=np.int64).reshape(-1, LEVELS),
        np.array([now - start for _, start in started.values()]),
    )


def _feed(model: LifetimeModel) -> tuple[list[GroupRows], RunningVMs]:
    """The slice's VMs into ``model`` in event order: each request's rows, each exit
    observed, a refit every hour of event time as the tracker's; the rows of every
    VM, and the VMs still running at the end."""
    trace = open_trace(AZURE_SLICE, seed=0)
    started: dict[str, tuple[GroupRows, float]] = {}
    every: list[GroupRows] = []
    next_refit: float | None = None
    for event in trace.events():
        if next_refit is None:
            next_refit = event.time + 3_600.0
        elif event.time >= next_refit:
            model.refit(_running(started, event.time), now=event.time)
            next_refit = event.time + 3_600.0
        if isinstance(event, VmRequest):
            rows = model.rows_for(request_keys(event))
            started[event.vm_id] = (rows, event.time)
            every.append(rows)
        elif isinstance(event, VmExit) and event.vm_id in started:
            rows, start = started.pop(event.vm_id)
            model.observe_exit(rows, event.time - start, event.time)
    assert trace.end_time is not None
    return every, _running(started, trace.end_time)


def _overflowed(model: GroupedLifeTables) -> dict[int, int]:
    """Level -> its overflow row, for each level with one."""
    rows = {level: model.overflow_row(level) for level in range(LEVELS)}
    return {level: row for level, row in rows.items() if row is not None}


def test_the_tables_never_predict_from_the_rows_past_the_bound() -> None:
    tables = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND)
    every, running = _feed(tables)
    tables.refit(running)
    overflowed = _overflowed(tables)
    assert 0 in overflowed  # the slice's tenants pass the bound
    # The exits of the groups past the bound were counted into the shared rows,
    # enough to be chosen had they been evidence ...
    pooled = sum(tables.deaths[row].sum() for row in overflowed.values())
    assert pooled >= MIN_OBSERVATIONS
    # ... but a refit finds no evidence there.
    for row in overflowed.values():
        assert tables.observations[row] == 0.0
    # Each VM of a group past the bound is predicted by its finest group with
    # enough observations of its own: as if that level had no group for it.
    shared = set(overflowed.values())
    checked = 0
    for rows in every:
        if not shared.intersection(rows):
            continue
        checked += 1
        expected = next(
            (
                r
                for r in rows[:-1]
                if r not in shared and tables.observations[r] >= MIN_OBSERVATIONS
            ),
            rows[-1],
        )
        chosen = tables.choose(rows)
        assert chosen == expected and chosen not in shared
    assert checked > len(every) // 2


def test_a_recount_of_a_row_past_the_bound_finds_no_evidence() -> None:
    """``observe_running`` (sibling evidence) recounts one row between refits."""
    tables = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND)
    _feed(tables)
    row = tables.overflow_row(0)
    assert row is not None and tables.deaths[row].sum() > 0
    tables.observe_running(row, np.array([60.0, 3_600.0]))
    assert tables.observations[row] == 0.0


def test_the_shrunk_chain_passes_through_a_row_past_the_bound() -> None:
    """A shrunk level with no VM at risk takes its parent's hazards: the row past the
    bound gives the distribution of a real group that never saw a VM."""
    shrunk = ShrunkLifeTables(BINS, max_rows=BOUND)
    # A tenant known before the bound whose VMs never come: its row has no evidence.
    empty = shrunk.rows_for(("nobody", ("never",), ("never",), ("never",), ()))
    every, running = _feed(shrunk)
    shrunk.refit(running)
    row = shrunk.overflow_row(0)
    assert row is not None and shrunk.deaths[row].sum() > 0
    assert not shrunk.at_risk[row].any() and not shrunk.refit_deaths[row].any()
    past = next(rows for rows in every if rows[0] == row and row not in rows[1:])
    stand_in = (empty[0], *past[1:])
    assert np.array_equal(shrunk.mass[shrunk.choose(past)], shrunk.mass[shrunk.choose(stand_in)])


def test_the_mixtures_members_and_the_frailty_take_no_evidence_past_the_bound() -> None:
    mixture = MixtureLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND)
    frailty = FrailtyLifeTables(mixture)
    every, running = _feed(frailty)
    frailty.refit(running)
    first = mixture.members[0]
    row = first.overflow_row(0)
    assert row is not None
    for member in mixture.members:
        # Every member numbers by the first: the same shared row, no evidence in it.
        assert member.overflow_row(0) == row
        assert member.observations[row] == 0.0
    # The frailty's owners had exposure there (its VMs ran), yet none is its owner.
    assert frailty.has_evidence[row]
    past = next(rows for rows in every if rows[0] == row)
    assert frailty._combo_key(past)[-1] == -1
    assert mixture._combo_key(past)[-1] == -1


def test_siblings_are_never_those_of_the_groups_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With sibling evidence on, a batch's running VMs are repredicted at its exits:
    the groups past the bound share one owner row but are no one batch."""
    tracker_class = lifetime_module.LifetimeTracker
    booked = tracker_class.on_booked
    followed: list[int] = []  # owners followed after each booking
    past_bound: list[bool] = []  # whether the VM booked was of a group past the bound

    def checked(self: lifetime_module.LifetimeTracker, *args: Any, **kwargs: Any) -> None:
        booked(self, *args, **kwargs)
        overflow = self.model.overflow_row(0)
        assert overflow is None or overflow not in self._siblings
        followed.append(len(self._siblings))
        past_bound.append(
            overflow is not None and self.slot_rows[self._slot[args[1].vm_id]][0] == overflow
        )

    monkeypatch.setattr(tracker_class, "on_booked", checked)
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    las = {**settings.policies.get("las", {}), "siblings": True, "max_groups": BOUND}
    settings = settings.model_copy(update={"policies": {**settings.policies, "las": las}})
    trace = open_trace(AZURE_SLICE, seed=0)
    config = settings.engine_config("las", trace_has_hosts=trace.has_hosts)
    replay(trace.events(), config, end_time=trace.end_time, decisions_out=io.BytesIO())
    assert max(followed) > 0  # siblings were followed ...
    assert sum(past_bound) > len(past_bound) // 2  # ... while most VMs were past the bound


def test_a_model_past_the_bound_comes_back_from_a_snapshot_the_same() -> None:
    """The shared rows are found by their key (``OVERFLOW_KEY``, a frozenset): the
    snapshot codec must bring that key back, or a restored model would number a
    new shared row and count the old one as evidence."""
    tables = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND)
    every, running = _feed(tables)
    restored = loads(dumps(tables))
    assert _overflowed(restored) == _overflowed(tables) != {}
    for model in (tables, restored):
        model.refit(running)
    assert np.array_equal(restored.observations, tables.observations)
    assert [restored.choose(rows) for rows in every] == [tables.choose(rows) for rows in every]
    late = ("a tenant never seen", ("a shape never seen",), ("x",), ("y",), ())
    assert restored.rows_for(late) == tables.rows_for(late)


def test_the_largest_bound_allocates_only_for_the_groups_that_come() -> None:
    """``max_groups`` at its ceiling (10,000,000 groups, 20 GB of tables if all came)
    allocates nothing ahead: the tables grow with the groups the input names, so a
    replay of the slice places every request with tables a few thousand rows long."""
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    las = {**settings.policies.get("las", {}), "max_groups": 10_000_000}
    settings = settings.model_copy(update={"policies": {**settings.policies, "las": las}})
    trace = open_trace(AZURE_SLICE, seed=0)
    config = settings.engine_config("las", trace_has_hosts=trace.has_hosts)
    sink = io.BytesIO()
    engine = Engine(config)
    replay(trace.events(), config, end_time=trace.end_time, decisions_out=sink, engine=engine)
    requested = sum(1 for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest))
    placed = sink.getvalue().count(b'"kind":"placement"')
    assert placed == requested
    tracker = _pool_tracker(engine)
    assert tracker.settings.max_groups == 10_000_000
    model = tracker.model
    assert isinstance(model, GroupedLifeTables)
    assert model.overflow_row(0) is None  # nothing past the bound
    assert (model.lookups_past_bound, model.groups_reclaimed) == (0, 0)
    assert model.groups <= len(model.deaths) <= 2 * model.groups + 16


def _pool_tracker(engine: Engine) -> lifetime_module.LifetimeTracker:
    """The lifetime tracker of the replay's one pool (not the warm-up's throwaways)."""
    [pool] = engine.pools.values()
    tracker = pool.policy.hooks.lifetime_tracker()
    assert isinstance(tracker, lifetime_module.LifetimeTracker)
    return tracker


class _Checked(GroupedLifeTables):
    """Tables that reclaim, checking at each reclaim what reclaiming must keep."""

    def __init__(self) -> None:
        super().__init__(BINS, MIN_OBSERVATIONS, max_rows=BOUND, reclaim_groups=True)
        self.checked_reclaims = 0

    def _reclaim(self, running: RunningVMs) -> None:
        free_before = set(self._free_rows)
        groups_before = dict(self._rows)
        # As the refit just counted them, before the freed rows are reset.
        observations = self.observations.copy()
        asked = self._asked
        super()._reclaim(running)
        freed = set(self._free_rows) - free_before
        if not freed:
            return
        self.checked_reclaims += 1
        held = set(running.rows.ravel().tolist())
        if running.chosen is not None:
            held |= set(running.chosen.tolist())
        shared = set(_overflowed(self).values())
        # No running VM reads a reclaimed row, and neither the pool-wide groups
        # nor the shared overflow rows go.
        assert not freed & held and not freed & shared
        gone = {group for group, row in groups_before.items() if row in freed}
        assert len(gone) == len(freed) and all(group[0] != LEVELS - 1 for group in gone)
        assert all(group not in self._rows for group in gone)
        # Only groups below the evidence bar go, the least observed first.
        candidates = {
            row
            for group, row in groups_before.items()
            if group[0] != LEVELS - 1 and row not in held | shared | free_before
        }
        assert max(observations[row] for row in freed) < MIN_OBSERVATIONS
        left = [observations[row] for row in candidates - freed]
        if left:
            assert max(observations[row] for row in freed) <= min(left)
        # Freed rows hold nothing, and the reserve is a twentieth of the bound.
        for row in freed:
            assert not self.deaths[row].any() and not self.censored[row].any()
            assert self.observations[row] == 0.0
        # As many as groups asked for a row since the last refit, at least a
        # twentieth of the bound: no more, and no fewer while groups qualify.
        reserve = max(1, int(BOUND * 0.05), asked)
        weak = {row for row in candidates if observations[row] < MIN_OBSERVATIONS}
        assert len(self._free_rows) == min(reserve, len(free_before) + len(weak))


def test_past_the_bound_the_tables_reclaim_groups_no_running_vm_reads() -> None:
    """With ``reclaim_groups`` (model "tables", the default), a refit past the bound
    frees the rows of groups below the evidence bar that no running VM reads; new
    groups take them instead of the shared overflow row."""
    reclaiming = _Checked()
    every, _ = _feed(reclaiming)
    plain = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND)
    every_plain, _ = _feed(plain)
    assert reclaiming.checked_reclaims > 0 and reclaiming.groups_reclaimed > 0
    # Each reclaimed row went to a new group: fewer groups fell past the bound.
    assert reclaiming.lookups_past_bound < plain.lookups_past_bound
    assert plain.groups_reclaimed == 0
    # The VMs given a row of their own rather than the shared one at level 0.
    own = sum(1 for rows in every if rows[0] != reclaiming.overflow_row(0))
    own_plain = sum(1 for rows in every_plain if rows[0] != plain.overflow_row(0))
    assert own > own_plain
    # The tables stay within the bound and its shared rows.
    assert len(reclaiming.deaths) == len(plain.deaths)


def test_a_reclaimed_row_predicts_as_a_new_group_and_its_old_group_starts_afresh() -> None:
    tables = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND, reclaim_groups=True)
    _, running = _feed(tables)
    tables.refit(running)
    assert tables._free_rows, "the slice fills the bound and leaves weak groups"
    row = tables._free_rows[-1]  # the next a new group takes
    fresh = GroupedLifeTables(BINS, MIN_OBSERVATIONS)
    new_row = fresh.rows_for(("t", ("s",), ("x",), ("y",), ()))[0]
    late = ("a tenant never seen", ("a shape never seen",), ("x",), ("y",), ())
    rows = tables.rows_for(late)
    assert rows[0] == row
    for name in ("mass", "m0", "m1", "deaths", "censored", "observations"):
        assert np.array_equal(getattr(tables, name)[row], getattr(fresh, name)[new_row]), name


def test_a_model_that_reclaims_comes_back_from_a_snapshot_the_same() -> None:
    tables = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND, reclaim_groups=True)
    every, running = _feed(tables)
    tables.refit(running)
    restored = loads(dumps(tables))
    assert restored._free_rows == tables._free_rows != []
    late = [(f"tenant {i}", ("shape",), ("x",), ("y",), ()) for i in range(5)]
    assert [restored.rows_for(k) for k in late] == [tables.rows_for(k) for k in late]
    assert [restored.choose(rows) for rows in every] == [tables.choose(rows) for rows in every]
    assert (restored.groups_reclaimed, restored.lookups_past_bound) == (
        tables.groups_reclaimed,
        tables.lookups_past_bound,
    )


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("_free_rows", [10**9], "a free group row outside"),
        ("_free_rows", [-1], "a free group row outside"),
        ("_free_rows", "twice", "given twice"),
    ],
)
def test_a_restored_numbering_that_could_overrun_the_tables_is_refused(
    field: str, value: Any, reason: str
) -> None:
    tables = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=BOUND, reclaim_groups=True)
    _, running = _feed(tables)
    tables.refit(running)
    if value == "twice":
        value = [tables._free_rows[0], tables._free_rows[0]]
    setattr(tables, field, value)
    with pytest.raises(ValueError, match=reason):
        tables.check_restored()


def test_a_recalibrated_model_refuses_to_reclaim() -> None:
    with pytest.raises(ValueError, match="cannot reclaim"):
        GroupedLifeTables(BINS, calibrator=SurvivalCalibrator(BINS), reclaim_groups=True)


@pytest.mark.parametrize("policy", ["las", "lava"])
def test_a_replay_past_the_bound_reclaims_and_decides_the_same_twice(policy: str) -> None:
    """The default model ("tables") under LAS and LAVA bounded at 40 groups: a replay of
    the slice reclaims rows, places every request, and gives the same decisions again."""
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    args = {**settings.policies.get(policy, {}), "max_groups": BOUND}
    settings = settings.model_copy(update={"policies": {**settings.policies, policy: args}})
    streams = []
    engines = []
    for _ in range(2):
        trace = open_trace(AZURE_SLICE, seed=0)
        config = settings.engine_config(policy, trace_has_hosts=trace.has_hosts)
        sink = io.BytesIO()
        engines.append(Engine(config))
        replay(
            trace.events(), config, end_time=trace.end_time, decisions_out=sink, engine=engines[-1]
        )
        streams.append(sink.getvalue())
    assert streams[0] == streams[1]
    requested = sum(1 for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest))
    assert streams[0].count(b'"kind":"placement"') == requested
    model = _pool_tracker(engines[0]).model
    assert isinstance(model, GroupedLifeTables) and model.reclaim_groups
    assert model.groups_reclaimed > 0
    assert model.groups <= BOUND + LEVELS  # the groups and the shared overflow rows


def test_the_least_bound_the_settings_allow_still_reclaims_within_it() -> None:
    """``max_groups`` at its floor (one group a level): the slice's thousands of groups
    pass through a model of 5 rows and its overflow rows, whose reclaiming is one pass
    over those rows per refit, however many groups the input names."""
    tables = GroupedLifeTables(BINS, MIN_OBSERVATIONS, max_rows=LEVELS, reclaim_groups=True)
    every, running = _feed(tables)
    tables.refit(running)
    tables.check_restored()
    assert tables.groups_reclaimed > 0 and tables.lookups_past_bound > 0
    assert len(tables.deaths) <= 4 * LEVELS  # the bound's rows and the overflow rows, doubled
    assert all(0 <= row < len(tables.deaths) for rows in every for row in rows)
