"""Online life tables per feature group, censoring-aware, with back-off.

Each VM falls in one group per level (``features.lifetime_keys``). An exit
adds a death to the VM's group at every level; a VM evicted, or alive when
a recording ends, adds a permanent censoring; VMs still running are added as
censored at their current uptime each time the tables are refitted (every
``refit_interval_s`` of event time), so a fleet of long-running VMs pulls the
distribution up before any of them exits. A prediction uses the finest
group with at least ``min_observations`` (deaths + censorings, running VMs
included), else the pool-wide group.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable
from typing import Final

import numba
import numpy as np

from lavad.models.argument_checks import require_at_least
from lavad.models.arrays import FloatArray, grown
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.calibration import SurvivalCalibrator
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.protocol import GroupRows, RunningVMs
from lavad.models.lifetime.survival import fill_suffix_sums, life_table, suffix_sums

# Groups are named by the input (tenants, deployments, feature values), so a
# stream of new names must not grow the tables for ever. Past ``max_rows``
# rows, a model that reclaims groups (``reclaim_groups``) gives a new group
# the row of one that no longer counts (``_reclaim``); otherwise, or when
# none can be reclaimed, a new group shares its level's overflow row, which
# counts as no evidence (``overflow_row``): its VMs are predicted from their
# coarser groups, as a group too young to be chosen is. A cache of whole key tuples
# starts afresh when it holds ``MAX_CACHED_KEYS``. The overflow key is a
# frozenset, which no decoded event can hold, so it names no real group.
# Why no evidence, not the pool of every group past the bound: that pool
# mixes tenants of every shape, soon has more observations than any group,
# and is chosen before the VM's own shape's groups. On the Azure V1 dev
# split with the bound at 20,000 rows (two thirds of its groups past it), the pooled
# row cost LAS 0.31 pp of empty hosts on a fixed pool of 950 hosts, a fifth
# of its gain over Best Fit; counted as no evidence, nothing
# (docs/results/lifetime-models.md, "Past the bound on groups").
# 250,000 rows is about 0.5 GB of tables (about 2 KB a row) and four times
# the 58,766 groups of the whole Azure V1 trace, so no real trace here
# reaches it and every decision on them is as without the bound.
MAX_ROWS: Final = 250_000
MAX_CACHED_KEYS: Final = 100_000
# The model's own cache of key tuples is short: it serves the VMs of a batch,
# which share their keys and come one after the other. A caller with a longer
# memory keeps its own (the lifetime tracker's, of whole predictions, until
# each refit). With the long bound the model's cache kept every new group's
# keys alive until it filled, seven objects each that the garbage collector
# scanned again and again, while behind the tracker's memo it almost never
# hit (docs/results/speed.md).
MAX_MODEL_KEYS: Final = 4_096
# Reclaiming keeps rows free for new groups, topped up at each refit (one
# pass over the groups): at least this share of ``max_rows``, and as many as
# groups asked for a row in the interval before, so a bound smaller than a
# refit interval's new groups is kept up with too. A twentieth of the default
# bound is 12,500 rows, ten times the new groups of the Azure V1 dev split's
# busiest hour (1,189; 700 an hour on average).
RECLAIM_SHARE: Final = 0.05
OVERFLOW_KEY: Final = frozenset({"lavad: groups past max_rows"})


class GroupedLifeTables:
    def __init__(
        self,
        bins: LifetimeBins,
        min_observations: int = 30,
        *,
        pareto_tail: bool = True,
        max_rows: int = MAX_ROWS,
        half_life_s: float | None = None,
        calibrator: SurvivalCalibrator | None = None,
        reclaim_groups: bool = False,
    ) -> None:
        if half_life_s is not None and not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        require_at_least(1, min_observations=min_observations, max_rows=max_rows)
        if reclaim_groups and calibrator is not None:
            # The calibrator keeps rows of VMs that have left (``pending``)
            # until it learns from them: a reclaimed row would mix two groups.
            raise ValueError("a recalibrated model cannot reclaim groups")
        self.max_rows = max_rows
        # Past the bound, groups that no longer count give their rows to new
        # ones (``_reclaim``). Off for models whose rows another structure
        # keeps (a mixture's members, combos of rows, a calibrator's records).
        self.reclaim_groups = reclaim_groups
        # Rows reclaimed and not yet given to a group, the next one last.
        self._free_rows: list[int] = []
        # Lookups of a group with no row of its own (past the bound, nothing
        # free: answered by the overflow row), and groups whose rows were
        # reclaimed: what the operator watches. Lookups, not groups: the
        # groups past the bound are not kept, so they cannot be counted once.
        self._lookups_past_bound = 0
        self._reclaimed = 0
        # Lookups of a group with no row since the last refit: new groups and
        # those past the bound (one group's VMs may count more than once).
        self._asked = 0
        self.bins = bins
        self.min_observations = min_observations
        self._rows: dict[tuple[int, Hashable], int] = {}
        self._by_keys: dict[tuple[Hashable, ...], GroupRows] = {}
        width = bins.count
        self.deaths: FloatArray = np.zeros((16, width))
        self.censored: FloatArray = np.zeros((16, width))
        self.observations: FloatArray = np.zeros(16)
        self.tail_hazard: FloatArray | None = bins.pareto_tail_hazard if pareto_tail else None
        self.mass: FloatArray = life_table(self.deaths, self.censored)
        self.m0, self.m1 = suffix_sums(self.mass, bins)
        # Rows whose counts changed since the last refit. A refit rebuilds only
        # these and the rows of running VMs: every other row has the same
        # deaths and censorings as then and no running VM (a VM that stopped
        # running was observed, which marked its rows), and a row's table
        # depends on its counts alone, so it would come out bit-identical.
        # Most rows are groups of tenants long gone: this makes a refit
        # O(live groups), not O(all groups ever seen).
        self._touched: set[int] = set()
        # The rows the last refit fitted (sorted) and the censorings each was
        # fitted with, running VMs included. Without forgetting or
        # recalibration, a row neither touched nor recounted since
        # (``observe_running``) whose censorings come out the same again
        # (no running VM crossed a bin edge) keeps its table: the same
        # counts give the same table, so rebuilding it would change nothing.
        self._fitted_rows = np.zeros(0, dtype=np.int64)
        self._fitted_censored: FloatArray = np.zeros((0, bins.count))
        self._recounted: set[int] = set()
        self._edges: list[float] = bins.edges.tolist()
        # Forgetting (``half_life_s``): a VM created at time s counts 2^-(T -
        # s) / half_life at a refit at T, in its exit or censoring alike, so
        # the tables follow a workload that drifts. Weighting by creation, not
        # by when the VM is seen, matters: weighting exits by their time but
        # the VMs still running at full weight kept the survivors of old
        # cohorts and forgot their short-lived peers, which biased DLRM's
        # P(T > 1 h) upwards (ECE 0.18 -> 0.25 with a one-day half-life).
        # Stored counts are weighted exp(rate (s - anchor)) when observed, and
        # a refit at T scales the rows it rebuilds by exp(-rate (T - anchor)):
        # a common factor leaves every other row's table (ratios of its
        # counts) as it is, so the refit stays O(rows touched). The anchor
        # moves forward before the weights grow large.
        self.decay = 0.0 if half_life_s is None else math.log(2.0) / half_life_s
        self._anchor: float | None = None
        self._last_refit: float | None = None
        # Recalibration (``calibration.py``), off by default: ``mass`` then
        # holds the calibrated tables, ``raw_survival`` the life tables' own
        # P(T > e) at the inner edges, and ``calibrated_at`` the calibrator's
        # map version each row was calibrated with (rows are brought up to
        # the current map when chosen).
        self.calibrator = calibrator
        self.raw_survival: FloatArray = self.m0[:, 1 : bins.count].copy()
        self.calibrated_at = np.full(len(self.mass), -1, dtype=np.int64)

    def check_restored(self) -> None:
        """Refuse (ValueError) a restored numbering a compiled kernel could overrun.

        The rows ``rows_for`` hands out (the groups' and the free ones) are
        written into the tracker's slots, whose kernels index the counts
        without a bounds check; a snapshot is checksummed, not signed.
        """
        size = len(self.deaths)
        free = self._free_rows
        if any(type(row) is not int or not 0 <= row < size for row in free):
            raise ValueError(f"a free group row outside [0, {size})")
        numbered = set(self._rows.values())
        if any(type(row) is not int or not 0 <= row < size for row in numbered):
            raise ValueError(f"a group row outside [0, {size})")
        if len(set(free)) != len(free) or numbered.intersection(free):
            raise ValueError("a free group row is given twice")

    def _column(self, lifetime: float) -> int:
        """``bins.index`` of one lifetime, without numpy's per-call cost (same side)."""
        return bisect.bisect_right(self._edges, lifetime) - 1

    @property
    def groups(self) -> int:
        return len(self._rows)

    @property
    def lookups_past_bound(self) -> int:
        """Lookups of a group with no row of its own (``overflow_row``): each one's VMs are
        predicted from their coarser groups."""
        return self._lookups_past_bound

    @property
    def groups_reclaimed(self) -> int:
        """Groups whose rows went to new groups (``reclaim_groups``)."""
        return self._reclaimed

    def overflow_row(self, level: int) -> int | None:
        """The row that ``level``'s groups past ``max_rows`` share, if any has come.

        Its counts are no evidence: a refit and a recount
        (``observe_running``) find it with none, so it is never chosen, a
        shrunk chain passes through it, and no owner has its history.
        """
        return self._rows.get((level, OVERFLOW_KEY))

    def _overflow_rows(self) -> list[int]:
        rows = self._rows
        found = (rows.get((level, OVERFLOW_KEY)) for level in range(LEVELS))
        return [row for row in found if row is not None]

    def share_overflow_rows(self, numbering: GroupedLifeTables) -> None:
        """Take ``numbering``'s overflow rows as this model's own (a model whose rows
        another numbers: the mixture's members), so it counts them as no evidence too."""
        for level in range(LEVELS):
            row = numbering.overflow_row(level)
            if row is not None:
                self._rows[(level, OVERFLOW_KEY)] = row

    def rows_for(self, keys: tuple[Hashable, ...]) -> GroupRows:
        """The row of each level's group (new groups get empty rows)."""
        # A VM's keys recur (a tenant's batch, a shape at an hour): one lookup of
        # the whole tuple instead of one per level. Rows never change once given.
        known = self._by_keys.get(keys)
        if known is not None:
            return known
        if len(keys) != LEVELS:
            raise ValueError(f"expected {LEVELS} keys, got {len(keys)}")
        rows = []
        for level, key in enumerate(keys):
            group: tuple[int, Hashable] = (level, key)
            row = self._rows.get(group)
            if row is None:
                self._asked += 1
                if self._free_rows:
                    row = self._rows[group] = self._free_rows.pop()
                elif len(self._rows) >= self.max_rows:
                    self._lookups_past_bound += 1
                    group = (level, OVERFLOW_KEY)
                    row = self._rows.get(group)
                if row is None:
                    # With nothing free every numbered row is a group's, so
                    # the next row is the count of groups.
                    row = self._rows[group] = len(self._rows)
                    self._grow(row + 1)
            rows.append(row)
        if len(self._by_keys) >= MAX_MODEL_KEYS:
            self._by_keys.clear()
        result = self._by_keys[keys] = tuple(rows)
        return result

    def choose(self, rows: GroupRows) -> int:
        """The finest group with enough observations (as of the last refit)."""
        chosen = rows[-1]
        for row in rows[:-1]:
            if self.observations[row] >= self.min_observations:
                chosen = row
                break
        calibrator = self.calibrator
        if calibrator is not None:
            if self.calibrated_at[chosen] != calibrator.map_version:
                self._calibrate(np.array([chosen]))
            calibrator.record(rows, self.raw_survival[chosen])
        return chosen

    def _calibrate(self, rows: np.ndarray) -> None:
        """Rows' tables from their raw survival through the calibrator's current map."""
        calibrator = self.calibrator
        assert calibrator is not None
        mass, m0, m1 = calibrator.tables(self.raw_survival[rows], self.bins.representative)
        self.mass[rows], self.m0[rows], self.m1[rows] = mass, m0, m1
        self.calibrated_at[rows] = calibrator.map_version

    def _learn_calibration(
        self, previous_refit: float | None, now: float, running: RunningVMs
    ) -> None:
        """Resolve the running VMs' edges passed since the last refit, and the VMs that left."""
        calibrator = self.calibrator
        assert calibrator is not None
        pending = calibrator.pending
        calibrator.pending = []
        calibrator.age(now)
        uptimes = running.uptimes
        since = math.inf if previous_refit is None else now - previous_refit
        if len(uptimes):
            survival, found = calibrator.creation_survival(running.rows, now - uptimes)
            calibrator.learn(
                survival[found],
                (uptimes - since)[found],
                uptimes[found],
                np.full(int(found.sum()), math.inf),
            )
        if pending:
            left_rows = np.array([p[0] for p in pending], dtype=np.int64).reshape(-1, LEVELS)
            seen = np.array([p[2] for p in pending])
            survival, found = calibrator.creation_survival(
                left_rows, np.array([p[4] for p in pending])
            )
            calibrator.learn(
                survival[found],
                np.array([p[1] for p in pending])[found],
                seen[found],
                np.where([p[3] for p in pending], seen, math.inf)[found],
            )
        calibrator.prune(now)

    def _weight(self, now: float) -> float:
        """What an observation at ``now`` is stored as (1 without forgetting)."""
        if not self.decay:
            return 1.0
        if self._anchor is None:
            self._anchor = now
        exponent = self.decay * (now - self._anchor)
        if exponent > 100.0:
            # Re-anchor at now: every stored count scaled alike (no table moves).
            factor = math.exp(-exponent)
            self.deaths *= factor
            self.censored *= factor
            self._anchor = now
            exponent = 0.0
        return math.exp(exponent)

    def _scale_at(self, now: float) -> float:
        """The factor that turns stored counts into counts as of ``now``."""
        if not self.decay:
            return 1.0
        if self._anchor is None:
            self._anchor = now
        return math.exp(-self.decay * (now - self._anchor))

    def observe_exit(self, rows: GroupRows, lifetime: float, now: float = 0.0) -> None:
        """A death; ``now`` (the exit's time) matters only with ``half_life_s``."""
        column = self._column(lifetime)
        weight = self._weight(now - lifetime)
        deaths = self.deaths
        for row in rows:
            deaths[row, column] += weight
        self._touched.update(rows)
        if self.calibrator is not None:
            self.calibrator.defer(rows, lifetime, now, exited=True)

    @property
    def pure_choice(self) -> bool:
        """Whether ``choose`` records nothing (``LifetimeModel.pure_choice``): not recalibrating.

        A subclass whose ``choose`` records or computes per epoch says so by
        overriding this.
        """
        return self.calibrator is None

    def counts_plainly(self) -> bool:
        """Whether an exit or a censoring only adds ``count_weight`` to its rows' counts
        at its column.

        So without recalibration: a compiled caller may then add to
        ``deaths`` or ``censored`` itself (column ``bins.index`` of the
        lifetime) and ``touch`` the rows, which is what ``observe_exit``
        would do. A subclass that counts otherwise says so by overriding
        this.
        """
        return self.calibrator is None

    @property
    def counts_by_age(self) -> bool:
        return bool(self.decay)

    def count_weight(self, born: float) -> float:
        # ``observe_exit``'s own weight, re-anchoring included, so a compiled
        # caller adds the same bits.
        return self._weight(born)

    def touch(self, rows: GroupRows) -> None:
        """Rows whose counts a caller changed (``counts_plainly``): the next refit rebuilds them."""
        self._touched.update(rows)

    def observe_censored(self, rows: GroupRows, seen: float, now: float = 0.0) -> None:
        column = self._column(seen)
        weight = self._weight(now - seen)
        for row in rows:
            self.censored[row, column] += weight
        self._touched.update(rows)
        if self.calibrator is not None:
            self.calibrator.defer(rows, seen, now, exited=False)

    def _age_observations(self, now: float) -> None:
        """Forgetting: every row's observation count decays since the last refit.

        Exact for the rows a refit does not rebuild (no running VM, nothing
        new: their counts only decayed); the rebuilt ones are overwritten.
        """
        if self.decay and self._last_refit is not None:
            self.observations *= math.exp(-self.decay * (now - self._last_refit))
        self._last_refit = now

    def refit(self, running: RunningVMs, *, now: float = 0.0) -> None:
        """Rebuild every table with the running VMs censored at their uptimes.

        ``running.chosen`` is not needed for the tables: every group row they
        read is among the rows rebuilt; a model that reclaims groups keeps
        them. ``now`` matters only with ``half_life_s``.
        """
        self._fit(running, now)
        if self.reclaim_groups and len(self._rows) >= self.max_rows:
            self._reclaim(running)
        self._asked = 0

    def _reclaim(self, running: RunningVMs) -> None:
        """Free the rows of groups that no longer count: as many as groups asked for a row
        since the last refit, and at least ``RECLAIM_SHARE`` of the bound.

        A group's row may be reclaimed when its observations, as of the
        refit just made (forgotten ones decayed), are below
        ``min_observations``, so ``choose`` would not pick it, and no running
        VM reads it (its group rows, or its chosen row). Its group then
        starts afresh if its tenant comes back. The least observed go first,
        lower rows first among equals; the pool-wide groups and the overflow
        rows never go. The caller drops what it cached of the rows
        (``LifetimeTracker`` forgets its predictions at every refit).
        """
        reserve = max(1, int(self.max_rows * RECLAIM_SHARE), self._asked)
        wanted = reserve - len(self._free_rows)
        if wanted <= 0:
            return
        kept = np.zeros(len(self.deaths), dtype=np.bool_)
        kept[running.rows.ravel()] = True
        if running.chosen is not None:
            kept[running.chosen] = True
        kept[self._free_rows] = True
        kept[self._overflow_rows()] = True
        pool_level = LEVELS - 1
        groups = {row: group for group, row in self._rows.items() if group[0] != pool_level}
        observations = self.observations
        # Rows past the groups' (the tables' room to grow) are in no group.
        weak = np.flatnonzero((observations < self.min_observations) & ~kept)
        weak = weak[np.fromiter((row in groups for row in weak.tolist()), np.bool_, len(weak))]
        if not len(weak):
            return
        # Least observed first, then by row: the same choice in every replay.
        chosen = weak[np.lexsort((weak, observations[weak]))[:wanted]]
        for row in chosen.tolist():
            del self._rows[groups[row]]
        self._by_keys.clear()
        self._reset_rows(chosen)
        # Handed out lowest first (``rows_for`` pops from the end).
        self._free_rows = sorted([*self._free_rows, *chosen.tolist()], reverse=True)
        self._reclaimed += len(chosen)

    def _reset_rows(self, rows: np.ndarray) -> None:
        """Rows as a new group's: no counts, the uniform table (``_uniform_tables``)."""
        self.deaths[rows] = 0.0
        self.censored[rows] = 0.0
        self.observations[rows] = 0.0
        self._uniform_tables(rows)
        self.calibrated_at[rows] = -1
        # The last refit's counts are no longer these rows': never kept as fitted.
        self._recounted.update(rows.tolist())

    def _fit(self, running: RunningVMs, now: float) -> None:
        previous_refit = self._last_refit
        self._age_observations(now)
        changed = self._touched | self._recounted
        self._recounted = set()
        dirty, deaths, censored = self._counts(running, now)
        if not len(dirty):
            return
        if not self.decay and self.calibrator is None:
            unchanged = self._unchanged(dirty, censored, changed)
            self._fitted_rows, self._fitted_censored = dirty, censored
            if unchanged.any():
                kept = ~unchanged
                dirty, deaths, censored = dirty[kept], deaths[kept], censored[kept]
                if not len(dirty):
                    return
        self.observations[dirty] = deaths.sum(axis=1) + censored.sum(axis=1)
        mass = life_table(deaths, censored, self.tail_hazard)
        self.mass[dirty] = mass
        # ``suffix_sums`` written straight into the rows, in one compiled pass.
        scatter_suffix_sums(mass, self.bins.representative, dirty, self.m0, self.m1)
        if self.calibrator is not None:
            self.raw_survival[dirty] = self.m0[dirty, 1 : self.bins.count]
            self._learn_calibration(previous_refit, now, running)
            self._calibrate(dirty)

    def _unchanged(self, dirty: np.ndarray, censored: FloatArray, changed: set[int]) -> np.ndarray:
        """Which of ``dirty`` the last refit fitted from these same counts."""
        fitted = self._fitted_rows
        if not len(fitted):
            return np.zeros(len(dirty), dtype=np.bool_)
        at = np.minimum(np.searchsorted(fitted, dirty), len(fitted) - 1)
        same_counts = (censored == self._fitted_censored[at]).all(axis=1)
        same: np.ndarray = (fitted[at] == dirty) & same_counts
        if changed:
            same &= ~np.isin(dirty, np.fromiter(changed, dtype=np.int64, count=len(changed)))
        return same

    def _counts(self, running: RunningVMs, now: float) -> tuple[np.ndarray, FloatArray, FloatArray]:
        """The rows to rebuild, and their deaths and censorings as of ``now``.

        The rows touched since the last refit and those of running VMs, which
        are censored at their uptimes (weighted by their creation, as
        stored counts are: 2^-uptime / half_life).
        """
        running_rows = running.rows
        touched = np.fromiter(self._touched, dtype=np.int64, count=len(self._touched))
        self._touched = set()
        # The sorted distinct rows (``np.unique``'s answer) by marking, not sorting.
        marked = np.zeros(len(self.deaths), dtype=np.bool_)
        marked[touched] = True
        marked[running_rows.ravel()] = True
        dirty = np.flatnonzero(marked)
        width = self.bins.count
        if not len(dirty):
            return dirty, np.zeros((0, width)), np.zeros((0, width))
        scale = self._scale_at(now)
        censored = self.censored[dirty]  # a copy (fancy indexing)
        deaths = self.deaths[dirty]
        if scale != 1.0:
            censored *= scale
            deaths *= scale
        if len(running.uptimes):
            uptimes = running.uptimes
            columns = self.bins.index(uptimes)
            weights = np.exp(-self.decay * uptimes) if self.decay else _UNIT_WEIGHTS
            add_running_censorings(
                censored, dirty, np.ascontiguousarray(running_rows), columns, weights
            )
        overflow = self._overflow_rows()
        if overflow:
            # No evidence (``overflow_row``); the rows are sorted, so a search finds them.
            wanted = np.asarray(overflow, dtype=np.int64)
            at = np.minimum(np.searchsorted(dirty, wanted), len(dirty) - 1)
            at = at[dirty[at] == wanted]
            deaths[at] = 0.0
            censored[at] = 0.0
        return dirty, deaths, censored

    def _row_counts(
        self, row: int, uptimes: FloatArray, now: float
    ) -> tuple[FloatArray, FloatArray]:
        """One group's deaths and censorings as of ``now``, its running VMs at ``uptimes``."""
        scale = self._scale_at(now)
        deaths = self.deaths[row] * scale
        censored = self.censored[row] * scale
        if row in self._overflow_rows():
            return np.zeros_like(deaths), np.zeros_like(censored)  # no evidence
        ages = np.asarray(uptimes, dtype=np.float64)
        weights = np.exp(-self.decay * ages) if self.decay else 1.0
        np.add.at(censored, self.bins.index(ages), weights)
        return deaths, censored

    def observe_running(self, row: int, uptimes: FloatArray, now: float = 0.0) -> None:
        """Recount group ``row`` now, its running VMs censored at ``uptimes``.

        Between refits (a sibling exited: ``LifetimeSettings.siblings``); the
        other groups keep their counts of the last refit. The group may now
        have enough observations to be chosen: the tracker chooses again.
        """
        deaths, censored = self._row_counts(row, uptimes, now)
        self._recounted.add(row)  # its table no longer follows from the last refit's counts
        self.observations[row] = deaths.sum() + censored.sum()
        mass = life_table(deaths, censored, self.tail_hazard)
        m0, m1 = suffix_sums(mass, self.bins)
        self.mass[row], self.m0[row], self.m1[row] = mass[0], m0[0], m1[0]
        if self.calibrator is not None:
            self.raw_survival[row] = m0[0, 1 : self.bins.count]
            self._calibrate(np.array([row]))

    def _grow(self, rows: int) -> None:
        if rows <= len(self.deaths):
            return
        size = max(rows, 2 * len(self.deaths))
        self.deaths = grown(self.deaths, size)
        self.censored = grown(self.censored, size)
        self.observations = grown(self.observations, size)
        old = len(self.mass)
        self._grow_tables(size)
        self.raw_survival = grown(self.raw_survival, size)
        self._uniform_tables(slice(old, size))
        self.calibrated_at = grown(self.calibrated_at, size, -1)

    def _uniform_tables(self, rows: slice | np.ndarray) -> None:
        """``rows`` of ``mass``, ``m0``, ``m1`` and ``raw_survival`` as with no observation:
        uniform. Every such row has the same table, so its sums are taken once and
        copied (the same bits as row by row): the tables double to tens of thousands
        of groups, and summing each new row would be most of the time spent growing
        them."""
        width = self.bins.count
        uniform = np.full((1, width), 1.0 / width)
        m0, m1 = suffix_sums(uniform, self.bins)
        self.mass[rows] = uniform
        self.m0[rows], self.m1[rows] = m0, m1
        self.raw_survival[rows] = m0[:, 1:width]

    def _grow_tables(self, size: int) -> None:
        """``mass``, ``m0`` and ``m1`` with ``size`` rows, the new ones zero (to be filled)."""
        self.mass = grown(self.mass, size)
        self.m0 = grown(self.m0, size)
        self.m1 = grown(self.m1, size)


_UNIT_WEIGHTS: Final = np.zeros(0)


@numba.njit(cache=True, nogil=True)
def add_running_censorings(
    censored: FloatArray,
    dirty: np.ndarray,
    running_rows: np.ndarray,
    columns: np.ndarray,
    weights: FloatArray,
) -> None:
    """``censored[row of dirty, column] += weight`` for each running VM at each level.

    What ``np.add.at`` over each level in turn gave, in the same order (so the
    same sums to the bit), without its per-element overhead: ``running_rows``
    is (VMs, levels), every row in the sorted ``dirty``; ``weights`` per VM, or
    empty for a weight of 1 each.
    """
    unit = len(weights) == 0
    for level in range(running_rows.shape[1]):
        for vm in range(running_rows.shape[0]):
            row = running_rows[vm, level]
            local = np.searchsorted(dirty, row)
            if local >= len(dirty) or dirty[local] != row:
                raise IndexError("a running VM's row is not among the rows refitted")
            censored[local, columns[vm]] += 1.0 if unit else weights[vm]


@numba.njit(cache=True, nogil=True)
def scatter_suffix_sums(
    mass: FloatArray,
    representative: FloatArray,
    rows: np.ndarray,
    m0: FloatArray,
    m1: FloatArray,
) -> None:
    """Row ``rows[i]`` of ``m0`` and ``m1`` from row ``i`` of ``mass``: what
    ``suffix_sums`` gives, without its temporaries and the scatter after."""
    for i in range(len(rows)):
        fill_suffix_sums(mass, representative, m0, m1, rows[i], i)
