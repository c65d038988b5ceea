"""An owner's hazard multiplier (shared frailty) on top of any lifetime model.

A model that predicts an owner's VMs from the owner's own history (or a
coarser group) lags when the owner changes: an app scaling in kills its new
instances sooner than every memory of it says. The classical correction is
a shared frailty, as in a standardised mortality ratio: each owner group
(level 0 of ``features.lifetime_keys``: a tenant or app, and a shape) has a
hazard multiplier theta, and its VMs are predicted with

    S_owner(t) = S_model(t) ** theta

(proportional hazards: the whole distribution moves, so a policy's scores
move with it). With a gamma prior of shape a and rate a on theta (mean 1),
after the owner's VMs showed O deaths where the model expected E (the
cumulative hazard H = -ln S it predicted over the exposure each VM was
seen for, censored VMs counted for their exposure and no death), the
posterior mean is

    theta = (a + O) / (a + E)

so an owner with no evidence keeps theta = 1 (the model's own curve).
a = ``prior_deaths`` is worth that many expected deaths of evidence; it is
set to 1 from first principles (one expected death is the least evidence
that says anything about a rate), not fitted to a trace.

**What is counted, and when.** At each refit, every VM the model learns
from that was alive in the interval since the previous refit contributes
its exposure from u0 (its uptime then, 0 if created since) to u1 (its
uptime now, its lifetime if it exited, what was seen if evicted) under the
base model's tables as they stood in the interval (before this refit), and
a death if it exited. This is the mixture's prequential bookkeeping
(``mixture.py``): everything is resolved at refits in event time, from
what has resolved, so a replay and the live daemon count the same.

**An owner's VMs in one interval count as one outcome** (``per_owner``, the
default): their deaths and expected hazard are divided by how many they
are, as the mixture counts their log scores. One owner's VMs share a fate:
counted one by one, an app that lost a hundred instances in a day where
the tables expected three got theta near 25 on DLRM, and its next
instances were predicted to die at once, which most did not. (Overdispersed
deaths are fewer independent ones; this is the extreme of that, a fixed
rule rather than a fitted dispersion.)

**Following drift.** O and E both halve every ``half_life_s`` of event time:
the frailty says how an owner's recent VMs differ from the model, which a
model of the owner's whole history cannot. The default, a day, is the
shortest memory of the mixture's fixed grid (the daily cycle of arrivals),
chosen before measuring.

**Bands (optional).** With ``band_edges_s`` each uptime band (as the
mixture's: LAVA's decades) has its own multiplier, O and E counted by the
band the exposure and the death fall in, and bin j's hazard multiplied by
the theta of its band (by its lower edge). With none (the default), one
multiplier per owner: the classical proportional model.

A VM's distribution is a row per pair of the base model's chosen row and
its owner, if the owner has evidence (a "combo", as in ``shrunk.py`` and
``mixture.py``), computed on its first use after a refit by one compiled
loop over the bins.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import replace
from typing import Final

import numba
import numpy as np

from lavad.models.arrays import FloatArray, grown
from lavad.models.lifetime.combos import (
    ComboLifeTables,
    bin_bands,
    check_band_edges,
)
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.pending import Pending
from lavad.models.lifetime.protocol import GroupRows, RunningVMs

# One bound for every combo table (hostile input names the key tuples):
# past it, combos share the base model's own rows or the pool-wide combo.
from lavad.models.lifetime.shrunk import MAX_COMBOS
from lavad.models.lifetime.survival import ahead_of

HOUR: Final = 3600.0
# One expected death's worth of evidence: the gamma prior's shape and rate.
PRIOR_DEATHS: Final = 1.0
# O and E halve every day of event time.
FRAILTY_HALF_LIFE_S: Final = 24 * HOUR
# A survival below this counts as this: one VM adds at most ~28 to E.
MIN_SURVIVAL: Final = 1e-12


@numba.njit(cache=True, nogil=True)
def _frail_through(
    base_m0: FloatArray, theta: FloatArray, bin_band: np.ndarray, out: FloatArray
) -> None:
    """Into ``out``, per bin but the last: the base row's survival through it
    raised to the theta of the bin's band (``base_m0`` is the base row's ``m0``)."""
    for j in range(len(out)):
        here = base_m0[j]
        after = base_m0[j + 1]
        through = min(max(after / here, 0.0), 1.0) if here > 1e-300 else 0.0
        out[j] = through ** theta[bin_band[j]]


def posterior_theta(observed: FloatArray, expected: FloatArray, prior: float) -> FloatArray:
    """The gamma posterior mean of a hazard multiplier: (a + O) / (a + E)."""
    theta: FloatArray = (prior + observed) / (prior + expected)
    return theta


class FrailtyLifeTables(ComboLifeTables):
    """``base``'s distributions with each owner's hazard multiplied by its own theta."""

    def __init__(
        self,
        base: GroupedLifeTables,
        *,
        prior_deaths: float = PRIOR_DEATHS,
        half_life_s: float | None = FRAILTY_HALF_LIFE_S,
        band_edges_s: tuple[float, ...] = (),
        per_owner: bool = True,
        max_combos: int = MAX_COMBOS,
    ) -> None:
        if not prior_deaths > 0:
            raise ValueError(f"prior_deaths must be > 0, got {prior_deaths}")
        if half_life_s is not None and not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        band_edges_s = check_band_edges(band_edges_s)
        if max_combos < 2:
            raise ValueError(f"max_combos must be >= 2, got {max_combos}")
        # The base first: the base class's arrays are read through it.
        self.base = base
        bins = base.bins
        super().__init__(bins, base.min_observations, max_rows=base.max_rows)
        self.prior_deaths = float(prior_deaths)
        self.frailty_half_life_s = half_life_s
        self.band_edges_s = band_edges_s
        self.max_combos = max_combos
        self.per_owner = per_owner
        bands = len(self.band_edges_s) + 1
        # The band of each lifetime bin (by its lower edge), and where each
        # band's bins start and end (in seconds): exposure and deaths are
        # counted in the bands the prediction applies them to.
        self._bin_band = bin_bands(self.band_edges_s, bins.edges)
        lows = [0.0]
        for band in range(1, bands):
            inside = np.flatnonzero(self._bin_band == band)
            lows.append(float(bins.edges[inside[0]]) if len(inside) else math.inf)
        self._band_low = np.minimum.accumulate(np.asarray(lows)[::-1])[::-1].copy()
        self._band_high = np.append(self._band_low[1:], math.inf)
        # Per owner group (level 0's row) and band: deaths observed, hazard
        # expected (both decayed), the multiplier as of the last refit, and
        # whether the owner has had any exposure (else it is the base's).
        self.observed: FloatArray = np.zeros((16, bands))
        self.expected: FloatArray = np.zeros((16, bands))
        self.theta: FloatArray = np.ones((16, bands))
        self.has_evidence = np.zeros(16, dtype=np.bool_)
        # Exits and evictions since the last refit: (group rows, start, uptime seen, exited).
        self.pending: list[Pending] = []
        self.last_scored: float | None = None
        # A row per (base row, owner row or -1): its base row and owner, and
        # the epoch it was computed in (bumped whenever the base or theta changes).
        self._combos = {}
        self._combo_base = np.zeros(16, dtype=np.int64)
        self._start_combos(bins)
        self._ones = np.ones(bands)

    def counted(self) -> GroupedLifeTables:
        """The base model: the counts are its own."""
        return self.base

    # ------------------------------------------------------------ predicting

    def rows_for(self, keys: tuple[Hashable, ...]) -> GroupRows:
        rows = self.base.rows_for(keys)
        self._cover_owners(len(self.has_evidence))
        return rows

    def _grow_owners(self, size: int) -> None:
        self.observed = grown(self.observed, size)
        self.expected = grown(self.expected, size)
        old = len(self.theta)
        self.theta = grown(self.theta, size)
        self.theta[old:] = 1.0
        self.has_evidence = grown(self.has_evidence, size)

    def _combo_key(self, rows: GroupRows) -> tuple[int, ...]:
        """The base model's row, then the owner's row if it has evidence, else -1."""
        owner = rows[0] if self.has_evidence[rows[0]] else -1
        if owner >= 0 and owner == self.base.overflow_row(0):
            owner = -1  # the groups past the bound are no owner (``overflow_row``)
        return (self.base.choose(rows), owner)

    def _fallback_key(self, key: tuple[int, ...], rows: GroupRows) -> tuple[int, ...]:
        # Past the bound: the base row with no owner's multiplier.
        return (key[0], -1)

    def _grow_combo_rows(self, size: int) -> None:
        self._combo_base = grown(self._combo_base, size)

    def _keep_rows(self, combo: int, key: tuple[int, ...]) -> None:
        self._combo_base[combo] = key[0]

    def _compute(self, combo: int) -> None:
        owner = int(self._combo_owner[combo])
        theta = self._ones if owner < 0 else self.theta[owner]
        through = self._through()
        _frail_through(self.base.m0[int(self._combo_base[combo])], theta, self._bin_band, through)
        self._write_row(combo, through)

    # ------------------------------------------------------------ learning

    def observe_exit(self, rows: GroupRows, lifetime: float, now: float = 0.0) -> None:
        self.base.observe_exit(rows, lifetime, now)
        self.pending.append((rows, now - lifetime, lifetime, True))

    def observe_censored(self, rows: GroupRows, seen: float, now: float = 0.0) -> None:
        self.base.observe_censored(rows, seen, now)
        self.pending.append((rows, now - seen, seen, False))

    def observe_running(self, row: int, uptimes: FloatArray, now: float = 0.0) -> None:
        self.base.observe_running(row, uptimes, now)
        self._new_epoch()

    def refit(self, running: RunningVMs, *, now: float = 0.0) -> None:
        """Count the interval since the last refit into each owner's theta, then refit the base.

        ``running.chosen`` (this model's combos) are brought up to date, as
        the mixture's are: each keeps its base row and owner.
        """
        self._count(running, now)
        combos = running.chosen
        base_chosen = None if combos is None else self._combo_base[combos]
        self.base.refit(replace(running, chosen=base_chosen), now=now)
        self._recompute(combos)

    def _count(self, running: RunningVMs, now: float) -> None:
        """Each owner's deaths and expected hazard since the last refit, into its theta."""
        # A VM that left counts its exposure as far as it was seen.
        interval = self._close_interval(running, now, exits_to_now=False)
        if interval is None:
            return
        since, (all_rows, u0, u1, died) = interval
        if self.frailty_half_life_s is not None:
            factor = 0.5 ** (since / self.frailty_half_life_s)
            self.observed *= factor
            self.expected *= factor
        if len(all_rows):
            self.add_evidence(all_rows, u0, u1, died)
        self.theta = posterior_theta(self.observed, self.expected, self.prior_deaths)

    def add_evidence(
        self, rows: np.ndarray, u0: FloatArray, u1: FloatArray, died: np.ndarray
    ) -> None:
        """VMs seen alive from uptime u0 to u1 (dying at u1 if ``died``), under the base now."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1, LEVELS)
        self._cover_owners(len(self.has_evidence))
        chosen = self._base_rows(rows)
        base = self.base
        owners = rows[:, 0]
        weight = np.ones(len(owners))
        if self.per_owner:
            # One owner's VMs in one interval count as one outcome (per band:
            # by the band of their uptime at its start).
            band_then = self._bin_band[np.minimum(self.bins.index(u0), self.bins.count - 1)]
            cells = owners * len(self._band_low) + band_then
            _, inverse, counts = np.unique(cells, return_inverse=True, return_counts=True)
            weight = 1.0 / counts[inverse.reshape(-1)]
        total = base.m0[chosen, 0]
        for band in range(len(self._band_low)):
            low, high = self._band_low[band], self._band_high[band]
            start = np.clip(u0, low, high)
            end = np.clip(np.maximum(u1, u0), low, high)
            inside = end > start
            if not inside.any():
                continue
            at_start = ahead_of(base, chosen[inside], start[inside])
            at_end = ahead_of(base, chosen[inside], end[inside])
            scale = total[inside]
            hazard = np.log(np.maximum(at_start / scale, MIN_SURVIVAL)) - np.log(
                np.maximum(at_end / scale, MIN_SURVIVAL)
            )
            np.add.at(
                self.expected[:, band], owners[inside], weight[inside] * np.maximum(hazard, 0.0)
            )
        deaths = np.asarray(died, dtype=np.bool_)
        if deaths.any():
            column = np.minimum(self.bins.index(u1[deaths]), self.bins.count - 1)
            np.add.at(self.observed, (owners[deaths], self._bin_band[column]), weight[deaths])
        self.has_evidence[owners] = True

    def _base_rows(self, rows: np.ndarray) -> np.ndarray:
        """The base model's chosen row for each VM's group rows, as it stands."""
        distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
        chosen = np.array(
            [self.base.choose(tuple(line)) for line in distinct.tolist()], dtype=np.int64
        )
        result: np.ndarray = chosen[inverse.reshape(-1)]
        return result
