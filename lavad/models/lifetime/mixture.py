"""Life tables at several memories, mixed by how well each predicted what has since happened.

A workload that drifts wants a short memory, a stationary one a long one,
and a fixed half-life (``GroupedLifeTables(half_life_s=...)``) is right for
one kind only. Here a fixed grid of members, the same life tables with no
forgetting and with half-lives of 7 days, 72 hours and 24 hours, learn side
by side, and the model chooses among them online, in event time, by their
prequential log score (Bayesian model averaging with fixed share, Herbster
and Warmuth's tracking of the best expert).

**What is scored.** At each refit, every VM the model learns from that was
alive at the previous refit (or created since) is one binary outcome for
the interval between the two refits: with u0 its uptime at the previous
refit (0 if created since) and u1 its uptime now (or what it would be),
member k said P_k(T > u1 | T > u0) from its tables as they stood at the
previous refit, before any of it was seen. The VM exited in the interval
(log of 1 minus that), was evicted at uptime s (survived to s: log
P_k(T > s | T > u0)), or is still running (log of that). Summed over a
VM's intervals this is the log-likelihood of its lifetime under the tables
of each moment, censoring counted, so a member earns weight by predicting
every VM's next hour from what it knew an hour before. Everything is
resolved at refits only, from the VMs the refit is given and the exits and
evictions since the last one: replay and live score the same outcomes.

**Weights per uptime band.** A short memory may know the hazard of young VMs
after a swing while knowing nothing of month-old ones (its old cohorts are
forgotten). So the weights are kept per band of uptime, LAVA's decade
classes (under 1 h, 1-10 h, 10-100 h, longer); an interval is scored in
the band of its u0. The prediction mixes the members' conditional survival
through each lifetime bin with the weights of the bin's band:

    r_k[j] = S_k(e_{j+1}) / S_k(e_j)      (member k's chosen group row)
    r[j]   = sum_k w[band(j), k] r_k[j],   S(e_{j+1}) = S(e_j) r[j]

which is a survival curve whatever the weights (each r[j] is in [0, 1]),
and member k's own curve when one band weight is 1 in every band.

**The update**, per band b at each refit, with l[b, k] the sum of member
k's log probabilities of the band's outcomes (Bayes' rule), then a fixed
share ``FIXED_SHARE`` of the weight spread evenly, so that a member that
lost every earlier interval can take over within a few refits of a swing:

    w[b, k] <- w[b, k] exp(l[b, k]) / sum_k' w[b, k'] exp(l[b, k'])
    w[b, k] <- (1 - alpha) w[b, k] + alpha / K

**Counting outcomes, and each owner's own weights.** One owner's VMs (a
tenant's batch, an app's instances) share their fate, so in one interval
they count as one outcome: the mean of their log scores. And an owner whose
VMs behave unlike the pool's (an app scaling in) may need another memory
than the pool: from its first scored outcome an owner group (level 0) keeps
its own weights, started from the pool's and updated by its own outcomes
alone, with the fixed share going to the pool's weights instead of the
uniform ones. Its VMs are predicted with them; every other VM with the
pool's.

Nothing is tuned to a trace: the grid of half-lives, the bands and alpha
are fixed. On a stationary stream the members predict alike, so which one
holds the weight matters little; on a drifting one the short memories take
over the young bands after a swing.

Memory and work per event are those of the K members (K = 4), plus K weights
per band for each owner group; a refit scores every running VM once per
member. A VM's distribution is one row per tuple of the members' chosen
group rows and its owner, if the owner has weights of its own (a "combo",
as in ``shrunk.py``), computed on its first use after a refit by one
compiled loop over the bins.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import replace
from typing import Final

import numba
import numpy as np

from lavad.models.arrays import FloatArray, grown
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.combos import (
    ComboLifeTables,
    bin_bands,
    check_band_edges,
)
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.grouped import MAX_ROWS, GroupedLifeTables
from lavad.models.lifetime.pending import Pending
from lavad.models.lifetime.protocol import GroupRows, RunningVMs

# One bound for every combo table (hostile input names the key tuples):
# past it, combos share the base model's own rows or the pool-wide combo.
from lavad.models.lifetime.shrunk import MAX_COMBOS
from lavad.models.lifetime.survival import ahead_of

HOUR: Final = 3600.0
# The members' memories: none, a week, three days, a day. A fixed grid.
MEMBER_HALF_LIVES_S: Final[tuple[float | None, ...]] = (
    None,
    7 * 24 * HOUR,
    72 * HOUR,
    24 * HOUR,
)
# Upper edges of the uptime bands that keep their own weights (LAVA's classes).
BAND_EDGES_S: Final[tuple[float, ...]] = (HOUR, 10 * HOUR, 100 * HOUR)
# The share of weight spread evenly after each refit's update.
FIXED_SHARE: Final = 0.01
# Probabilities below this count as this in the log score: a member sure of
# the wrong answer loses ~28 nats for it, not an infinite amount.
MIN_PROBABILITY: Final = 1e-12


@numba.njit(cache=True, nogil=True)
def _mixed_through(
    member_m0: FloatArray, log_weight: FloatArray, bin_band: np.ndarray, out: FloatArray
) -> None:
    """Into ``out``, per bin but the last: the survival through it, mixed from the members'
    ``m0`` rows (K, width + 1).

    ``log_weight`` (bands, K) weighs the members in each band; ``bin_band``
    is the band of each lifetime bin.
    """
    members = member_m0.shape[0]
    weight = np.exp(log_weight)
    for j in range(len(out)):
        band = bin_band[j]
        ratio = 0.0
        for k in range(members):
            total = member_m0[k, 0]
            here = member_m0[k, j] / total if total > 0.0 else 0.0
            after = member_m0[k, j + 1] / total if total > 0.0 else 0.0
            through = min(max(after / here, 0.0), 1.0) if here > 1e-300 else 0.0
            ratio += weight[band, k] * through
        out[j] = min(max(ratio, 0.0), 1.0)


def fixed_share_update(log_weight: FloatArray, scores: FloatArray, share: float) -> FloatArray:
    """One refit's update of per-band log weights (bands, K) by summed log scores (bands, K)."""
    posterior = log_weight + scores
    posterior = posterior - posterior.max(axis=1, keepdims=True)
    weight = np.exp(posterior)
    weight /= weight.sum(axis=1, keepdims=True)
    members = weight.shape[1]
    weight = (1.0 - share) * weight + share / members
    result: FloatArray = np.log(weight)
    return result


class MixtureLifeTables(ComboLifeTables):
    """Life tables at ``half_lives_s`` forgetting rates, mixed by their recent log score.

    ``choose(rows)`` returns a combo (the row of ``mass`` holding the mixed
    distribution of these group rows), as ``ShrunkLifeTables`` does.
    """

    def __init__(
        self,
        bins: LifetimeBins,
        min_observations: int = 30,
        *,
        half_lives_s: tuple[float | None, ...] = MEMBER_HALF_LIVES_S,
        band_edges_s: tuple[float, ...] = BAND_EDGES_S,
        fixed_share: float = FIXED_SHARE,
        max_rows: int = MAX_ROWS,
        max_combos: int = MAX_COMBOS,
        per_owner: bool = True,
        owner_weights: bool = True,
    ) -> None:
        if not half_lives_s:
            raise ValueError("a mixture needs at least one member")
        if not 0.0 <= fixed_share < 1.0:
            raise ValueError(f"fixed_share must be in [0, 1), got {fixed_share}")
        band_edges_s = check_band_edges(band_edges_s)
        if max_combos < 2:
            raise ValueError(f"max_combos must be >= 2, got {max_combos}")
        # The members first: the base class's arrays are read through them.
        self.members = [
            GroupedLifeTables(bins, min_observations, max_rows=max_rows, half_life_s=half_life)
            for half_life in half_lives_s
        ]
        super().__init__(bins, min_observations, max_rows=max_rows)
        self.half_lives_s = tuple(half_lives_s)
        self.band_edges_s = band_edges_s
        self.fixed_share = float(fixed_share)
        self.max_combos = max_combos
        self.per_owner = per_owner
        self.owner_weights = owner_weights
        members = len(self.members)
        bands = len(self.band_edges_s) + 1
        # Per band, each member's log weight (uniform to start).
        self.log_weight: FloatArray = np.full((bands, members), -math.log(members))
        # The band of each lifetime bin (by its lower edge).
        self._bin_band = bin_bands(self.band_edges_s, bins.edges)
        # Per owner group (level 0's row), its own weights once it has had an
        # outcome (``owner_scored``): the pool's as they stood then, updated by
        # its own outcomes, with the fixed share going to the pool's weights.
        self.owner_log_weight: FloatArray = np.zeros((16, bands, members))
        self.owner_scored = np.zeros(16, dtype=np.bool_)
        # Exits and evictions since the last refit: (group rows, start, uptime seen, exited).
        self.pending: list[Pending] = []
        self.last_scored: float | None = None
        # A mixed row per tuple of the members' chosen group rows (a "combo"):
        # key tuples that back off to the same groups share it. Its rows and
        # the epoch it was computed in (bumped by every refit).
        # With owner weights, the combo of an owner that has its own is keyed
        # by the owner's row as well (last in the key), else by -1.
        self._combos = {}
        self._combo_rows = np.zeros((16, members), dtype=np.int64)
        self._start_combos(bins)
        self._member_m0 = np.zeros((members, bins.count + 1))

    def counted(self) -> GroupedLifeTables:
        """The no-forgetting member: its counts are what a plain ``tables`` model holds."""
        return self.members[0]

    def weights(self) -> FloatArray:
        """Each band's member weights (bands, members), summing to 1 per band."""
        weight: FloatArray = np.exp(self.log_weight)
        return weight

    # ------------------------------------------------------------ predicting

    def rows_for(self, keys: tuple[Hashable, ...]) -> GroupRows:
        """The group rows of ``keys``, numbered by the first member for all of them.

        The members learn from the same VMs in the same groups, so they share
        one numbering: the others only grow their arrays to its size.
        """
        first = self.members[0]
        rows = first.rows_for(keys)
        size = len(first.deaths)
        past_bound = first.groups > first.max_rows  # an overflow row is numbered
        for member in self.members[1:]:
            if len(member.deaths) < size:
                member._grow(size)
            if past_bound:
                member.share_overflow_rows(first)
        self._cover_owners(len(self.owner_scored))
        return rows

    def _grow_owners(self, size: int) -> None:
        self.owner_log_weight = grown(self.owner_log_weight, size)
        self.owner_scored = grown(self.owner_scored, size)

    def _combo_key(self, rows: GroupRows) -> tuple[int, ...]:
        """The members' group rows, then the owner's row if it has weights of its own, else -1."""
        owner = rows[0] if self.owner_weights and self.owner_scored[rows[0]] else -1
        if owner >= 0 and owner == self.members[0].overflow_row(0):
            owner = -1  # the groups past the bound are no owner (``overflow_row``)
        return (*[member.choose(rows) for member in self.members], owner)

    def _fallback_key(self, key: tuple[int, ...], rows: GroupRows) -> tuple[int, ...]:
        # The pool-wide combo: every member's pool table, the pool's weights.
        return (*(rows[-1],) * len(self.members), -1)

    def _grow_combo_rows(self, size: int) -> None:
        self._combo_rows = grown(self._combo_rows, size)

    def _keep_rows(self, combo: int, key: tuple[int, ...]) -> None:
        self._combo_rows[combo] = key[:-1]

    def _compute(self, combo: int) -> None:
        member_m0 = self._member_m0
        for k, row in enumerate(self._combo_rows[combo].tolist()):
            member_m0[k] = self.members[k].m0[row]
        owner = int(self._combo_owner[combo])
        log_weight = self.log_weight if owner < 0 else self.owner_log_weight[owner]
        through = self._through()
        _mixed_through(member_m0, log_weight, self._bin_band, through)
        self._write_row(combo, through)

    # ------------------------------------------------------------ learning

    def observe_exit(self, rows: GroupRows, lifetime: float, now: float = 0.0) -> None:
        for member in self.members:
            member.observe_exit(rows, lifetime, now)
        self.pending.append((rows, now - lifetime, lifetime, True))

    def observe_censored(self, rows: GroupRows, seen: float, now: float = 0.0) -> None:
        for member in self.members:
            member.observe_censored(rows, seen, now)
        self.pending.append((rows, now - seen, seen, False))

    def observe_running(self, row: int, uptimes: FloatArray, now: float = 0.0) -> None:
        for member in self.members:
            member.observe_running(row, uptimes, now)
        self._new_epoch()

    def refit(self, running: RunningVMs, *, now: float = 0.0) -> None:
        """Score the members on the interval since the last refit, then refit them.

        ``running.chosen`` are the combos to bring up to date (the tracker
        repredicts them from ``mass`` right after): each keeps its members'
        group rows, as the plain tables keep a running VM's row. Every other
        combo is recomputed on its next ``choose``.
        """
        self._score(running, now)
        members_running = replace(running, chosen=None)
        for member in self.members:
            member.refit(members_running, now=now)
        self._recompute(running.chosen)

    def _score(self, running: RunningVMs, now: float) -> None:
        """Each member's log score of the outcomes since the last refit, into the weights."""
        # An exit is scored on the whole interval (it died in it); an
        # eviction only as far as it was seen alive.
        interval = self._close_interval(running, now, exits_to_now=True)
        if interval is None:
            return
        _, (all_rows, u0, u1, dead) = interval
        if not len(all_rows):
            return
        scores = self.interval_scores(all_rows, u0, u1, dead)
        owners, inverse, counts = np.unique(all_rows[:, 0], return_inverse=True, return_counts=True)
        if self.per_owner:
            # One owner's VMs (a batch, an app's instances) share their fate:
            # each owner's outcomes in an interval count as one, their mean.
            scores = scores / counts[inverse][:, None]
        band = np.searchsorted(np.asarray(self.band_edges_s), u0, side="right")
        if self.owner_weights:
            self._update_owners(owners, inverse, band, scores)
        bands = len(self.log_weight)
        summed: FloatArray = np.zeros((bands, scores.shape[1]))
        summed[:] = np.stack(
            [
                np.bincount(band, weights=scores[:, k], minlength=bands)
                for k in range(scores.shape[1])
            ],
            axis=1,
        )
        self.log_weight = fixed_share_update(self.log_weight, summed, self.fixed_share)

    def _update_owners(
        self, owners: np.ndarray, inverse: np.ndarray, band: np.ndarray, scores: FloatArray
    ) -> None:
        """Each owner's weights, by its own outcomes (before the pool's update)."""
        self._cover_owners(len(self.owner_scored))
        bands, members = self.log_weight.shape
        own = np.zeros((len(owners), bands, members))
        for k in range(members):
            np.add.at(own[:, :, k], (inverse, band), scores[:, k])
        # An owner's first outcomes start from the pool's weights as they stand.
        first = ~self.owner_scored[owners]
        self.owner_log_weight[owners[first]] = self.log_weight
        self.owner_scored[owners] = True
        posterior = self.owner_log_weight[owners] + own
        posterior -= posterior.max(axis=2, keepdims=True)
        weight = np.exp(posterior)
        weight /= weight.sum(axis=2, keepdims=True)
        # The fixed share goes to the pool's weights: an owner that lost a
        # member's way comes back towards what the pool has since learned.
        pool = np.exp(self.log_weight)[None, :, :]
        share = self.fixed_share
        self.owner_log_weight[owners] = np.log((1.0 - share) * weight + share * pool)

    def interval_scores(
        self, rows: np.ndarray, u0: FloatArray, u1: FloatArray, died: np.ndarray
    ) -> FloatArray:
        """ln P_k(outcome) per VM and member (VMs, K), by each member's tables as they stand.

        A VM that ``died`` ended in (u0, u1]; any other lived past u1.
        """
        rows = np.asarray(rows, dtype=np.int64).reshape(-1, LEVELS)
        scores = np.empty((len(rows), len(self.members)))
        for k, member in enumerate(self.members):
            chosen = chosen_rows(member.observations, rows, self.min_observations)
            start = ahead_of(member, chosen, u0)
            end = ahead_of(member, chosen, np.maximum(u1, u0))
            with np.errstate(divide="ignore", invalid="ignore"):
                lives = np.where(start > 1e-12, np.clip(end / start, 0.0, 1.0), 1.0)
            p = np.where(died, 1.0 - lives, lives)
            scores[:, k] = np.log(np.maximum(p, MIN_PROBABILITY))
        return scores


def chosen_rows(observations: FloatArray, rows: np.ndarray, min_observations: int) -> np.ndarray:
    """``GroupedLifeTables.choose`` for many VMs: the finest group with enough observations."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, LEVELS)
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    enough = observations[rows[:, :-1]] >= min_observations
    first = np.argmax(enough, axis=1)
    level = np.where(enough.any(axis=1), first, LEVELS - 1)
    chosen: np.ndarray = rows[np.arange(len(rows)), level]
    return chosen
