"""Life tables shrunk level by level towards the coarser groups: one distribution per VM key.

``GroupedLifeTables`` predicts from one group: the finest with at least
``min_observations``. That throws evidence away twice. A tenant with 12 VMs
seen is ignored for the pool's hour-of-day group, however different its 12
VMs were; and a tenant with 31 VMs is trusted alone, even in the long bins
where only two of them are still at risk, so the tail of its table is noise
(or the Pareto rule of thumb).

Here every level speaks, bin by bin, in proportion to how many VMs it has
at risk there. The hazards are shrunk from the coarsest group (the pool) to
the finest (the owner), each level a Beta prior of strength ``k`` (in VMs)
centred on the level above:

    h_4[j] = d_4[j] / n_4[j]                     (the pool: a life table)
    h_l[j] = (d_l[j] + k * h_{l+1}[j]) / (n_l[j] + k)     for l = 3 .. 0

with ``d`` the deaths and ``n`` the actuarial number at risk of bin j (the
life table's: a censored VM, running ones included, is at risk for half of
its bin), so censoring is counted exactly as in the life tables and a group
with no VM at risk in a bin takes its parent's hazard there. That is the
posterior mean of a discrete hazard under a conjugate prior, the standard
empirical-Bayes estimator for small groups; it is the life table when
``n >> k`` and the parent when ``n << k``. Where the pool itself has no one
at risk (past its longest VM), the Pareto tail (``bins.pareto_tail_hazard``)
stands in, as in the life tables; before its first VM, uniform mass.

The levels need not nest (a tenant's VMs span hours of the day): the chain is
only an order of priors, finest last, so the owner's evidence corrects the
VM's shape-and-hour group, not the other way round.

A VM's distribution depends on all its groups, so it is one row per *key
tuple* (a "combo"), not per group. Combos are computed at refit time for
every running VM's combo (their repredictions read them next), and for any
other combo on its first use after a refit, from the counts of that refit:
everything happens at event times, so replay and live agree. The combo
arithmetic is one compiled loop (``_shrunk_masses``) and costs ~1 us, so a
prediction at creation stays cheap.
"""

from __future__ import annotations

import math
from typing import Final

import numba
import numpy as np

from lavad.models.argument_checks import require_at_least
from lavad.models.arrays import FloatArray, grown
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.calibration import SurvivalCalibrator
from lavad.models.lifetime.combos import NumberedCombos
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.grouped import MAX_ROWS
from lavad.models.lifetime.protocol import GroupRows, RunningVMs
from lavad.models.lifetime.survival import fill_suffix_sums

# Combos past this many share the pool-wide combo (hostile input: key tuples
# are named by the input). 250,000 combos of 41 bins are ~250 MB with their
# suffix sums; Azure V1 dev makes ~70,000.
MAX_COMBOS: Final = 250_000


@numba.njit(cache=True, nogil=True)
def _shrunk_masses(
    deaths: FloatArray,
    at_risk: FloatArray,
    combo_rows: np.ndarray,
    strength: float,
    tail_hazard: FloatArray,
    uniform_hazard: FloatArray,
    representative: FloatArray,
    mass: FloatArray,
    m0: FloatArray,
    m1: FloatArray,
    out_rows: np.ndarray,
) -> None:
    """For each combo ``out_rows[i]``, its ``mass`` row (and suffix sums) from its groups' counts.

    ``combo_rows[c]`` lists combo c's group rows finest first; the chain runs
    from the last (coarsest) to the first.
    """
    width = deaths.shape[1]
    levels = combo_rows.shape[1]
    hazard = np.empty(width)
    for i in range(out_rows.shape[0]):
        c = out_rows[i]
        coarsest = combo_rows[c, levels - 1]
        # A pool without any VM yet: uniform over the bins (as the life tables).
        prior = uniform_hazard if at_risk[coarsest, 0] <= 0.0 else tail_hazard
        for j in range(width):
            n = at_risk[coarsest, j]
            hazard[j] = deaths[coarsest, j] / n if n > 0.0 else prior[j]
        for level in range(levels - 2, -1, -1):
            row = combo_rows[c, level]
            for j in range(width):
                n = at_risk[row, j]
                n = max(n, 0.0)
                hazard[j] = (deaths[row, j] + strength * hazard[j]) / (n + strength)
        out = c
        survival = 1.0
        for j in range(width - 1):
            h = min(max(hazard[j], 0.0), 1.0)
            after = survival * (1.0 - h)
            mass[out, j] = survival - after
            survival = after
        # The open bin beyond the horizon takes what survives the rest.
        mass[out, width - 1] = survival
        fill_suffix_sums(mass, representative, m0, m1, out)


class ShrunkLifeTables(NumberedCombos):
    """``GroupedLifeTables``' groups and counts; ``mass``/``m0``/``m1`` rows are combos.

    ``choose(rows)`` returns the combo of a VM's group rows (the row of
    ``mass`` its distribution is in), not one of the groups.
    """

    def __init__(
        self,
        bins: LifetimeBins,
        min_observations: int = 30,  # unused: every level speaks, in proportion
        *,
        prior_strength: float = 10.0,
        max_rows: int = MAX_ROWS,
        max_combos: int = MAX_COMBOS,
        half_life_s: float | None = None,
        calibrator: SurvivalCalibrator | None = None,
    ) -> None:
        if not prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
        require_at_least(2, max_combos=max_combos)
        super().__init__(
            bins,
            min_observations,
            max_rows=max_rows,
            half_life_s=half_life_s,
            calibrator=calibrator,
        )
        self.prior_strength = float(prior_strength)
        self.max_combos = max_combos
        width = bins.count
        # Per group: deaths and the actuarial number at risk per bin, as of the
        # last refit (running VMs censored at their uptimes then).
        self.refit_deaths: FloatArray = np.zeros((len(self.deaths), width))
        self.at_risk: FloatArray = np.zeros((len(self.deaths), width))
        # Where the pool has no VM at risk: past its longest, the Pareto tail;
        # with no VM at all, uniform mass (hazard 1 / (bins left)).
        self._tail: FloatArray = bins.pareto_tail_hazard
        self._uniform: FloatArray = 1.0 / np.arange(width, 0, -1, dtype=np.float64)
        self._combos: dict[GroupRows, int] = {}
        self._combo_rows = np.zeros((16, LEVELS), dtype=np.int64)
        # A combo is current when its epoch is the model's (bumped by each refit).
        self._combo_epoch = np.full(16, -1, dtype=np.int64)
        self._epoch = 0
        self.mass = np.zeros((16, width))
        self.m0 = np.zeros((16, width + 1))
        self.m1 = np.zeros((16, width + 1))
        # Per combo, its raw P(T > e) at the inner edges (with a calibrator).
        self.raw_survival = np.ones((16, width - 1))
        self._representative = np.ascontiguousarray(bins.representative, dtype=np.float64)
        self._one = np.zeros(1, dtype=np.int64)  # one combo to compute, without an allocation

    def choose(self, rows: GroupRows) -> int:
        """The combo of these group rows, its distribution brought up to the last refit."""
        combo = self._combos.get(rows)
        if combo is None:
            combo = self._new_combo(rows, rows)
        if self._combo_epoch[combo] != self._epoch:
            one = self._one
            one[0] = combo
            self._compute(one)
        if self.calibrator is not None:
            self.calibrator.record(rows, self.raw_survival[combo])
        return combo

    def _fallback_key(self, key: GroupRows, rows: GroupRows) -> GroupRows:
        # The pool-wide combo (every level the pool's row): its chain is the
        # pool's own table, since shrinking a hazard towards itself keeps it.
        return (rows[-1],) * len(rows)

    def _grow_combos(self, size: int) -> None:
        self._combo_rows = grown(self._combo_rows, size)
        self.raw_survival = grown(self.raw_survival, size)

    def _keep_combo(self, combo: int, key: GroupRows) -> None:
        self._combo_rows[combo] = key

    def _compute(self, combos: np.ndarray) -> None:
        """The combos' tables as of the last refit (through the calibrator if there is one)."""
        _shrunk_masses(
            self.refit_deaths,
            self.at_risk,
            self._combo_rows,
            self.prior_strength,
            self._tail,
            self._uniform,
            self._representative,
            self.mass,
            self.m0,
            self.m1,
            combos,
        )
        self._combo_epoch[combos] = self._epoch
        calibrator = self.calibrator
        if calibrator is not None:
            self.raw_survival[combos] = self.m0[combos, 1 : self.bins.count]
            mass, m0, m1 = calibrator.tables(self.raw_survival[combos], self._representative)
            self.mass[combos], self.m0[combos], self.m1[combos] = mass, m0, m1

    def refit(self, running: RunningVMs, *, now: float = 0.0) -> None:
        """Recount every group with the running VMs censored, then recompute their combos.

        ``running.chosen`` are the combos to bring up to date: without it
        they are found from ``running.rows``. Every other combo is recomputed
        on its next ``choose``.
        """
        self._epoch += 1
        previous_refit = self._last_refit
        if self.decay and self._last_refit is not None:
            # Rows not rebuilt below only decayed since: so do their counts.
            factor = math.exp(-self.decay * (now - self._last_refit))
            self.at_risk *= factor
            self.refit_deaths *= factor
        self._age_observations(now)
        dirty, deaths, censored = self._counts(running, now)
        if len(dirty):
            total = deaths.sum(axis=1, keepdims=True) + censored.sum(axis=1, keepdims=True)
            self.observations[dirty] = total[:, 0]
            # The life table's actuarial at-risk count (survival.life_table).
            leaving = np.cumsum(deaths + censored, axis=1) - (deaths + censored)
            self.at_risk[dirty] = total - leaving - censored / 2.0
            self.refit_deaths[dirty] = deaths
        if running.chosen is None:
            running_rows = running.rows
            unique_rows = np.unique(running_rows, axis=0) if len(running_rows) else running_rows
            combos = np.array(
                [self.choose_without_compute(tuple(r)) for r in unique_rows.tolist()],
                dtype=np.int64,
            )
        else:
            combos = running.chosen
        if self.calibrator is not None:
            # From the curves recorded at creation; the combos below get the new map.
            self._learn_calibration(previous_refit, now, running)
        if len(combos):
            self._compute(combos)

    def observe_running(self, row: int, uptimes: FloatArray, now: float = 0.0) -> None:
        """Recount group ``row`` now with its running VMs at ``uptimes``.

        A sibling's exit, counted at once rather than at the next refit. The
        other groups keep the counts of the last refit. Any combo may hold
        ``row``: all of them are recomputed on their next ``choose`` (the
        tracker chooses the siblings' again right after).
        """
        self._epoch += 1
        deaths, censored = self._row_counts(row, uptimes, now)
        total = deaths.sum() + censored.sum()
        self.observations[row] = total
        leaving = np.cumsum(deaths + censored) - (deaths + censored)
        self.at_risk[row] = total - leaving - censored / 2.0
        self.refit_deaths[row] = deaths

    def choose_without_compute(self, rows: GroupRows) -> int:
        combo = self._combos.get(rows)
        return self._new_combo(rows, rows) if combo is None else combo

    def _grow(self, rows: int) -> None:
        """Group arrays only: the combos grow on their own."""
        if rows <= len(self.deaths):
            return
        size = max(rows, 2 * len(self.deaths))
        self.deaths = grown(self.deaths, size)
        self.censored = grown(self.censored, size)
        self.observations = grown(self.observations, size)
        self.refit_deaths = grown(self.refit_deaths, size)
        self.at_risk = grown(self.at_risk, size)
