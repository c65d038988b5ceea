"""What the mixture and the frailty share: a model over another model's counts, rows per combo.

Both wrap life tables (the mixture its members, the frailty its base) and
predict a VM with a row of their own per "combo": the wrapped tables'
chosen rows and the VM's owner, if the owner has state of its own (weights,
a frailty), else -1. A combo's row is computed on its first use after a
refit (its epoch), and a key tuple's combo is cached until the next one.
Both learn at refits from the interval since the last one, in event time:
the running VMs and those that left in between (``pending``).

Each model's own maths (how a row is computed, what an interval scores)
stays in its own module; this one holds the bookkeeping around it. The
attributes are the models' own (a snapshot carries them as they are).
How combos are numbered, within a bound, is shared with the shrunk tables
(``NumberedCombos``), whose combos are key tuples of their own groups.
"""

from __future__ import annotations

import numba
import numpy as np

from lavad.models.arrays import FloatArray, grown
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.grouped import MAX_CACHED_KEYS, GroupedLifeTables
from lavad.models.lifetime.pending import Pending
from lavad.models.lifetime.protocol import GroupRows, RunningVMs
from lavad.models.lifetime.survival import fill_suffix_sums


def check_band_edges(band_edges_s: tuple[float, ...]) -> tuple[float, ...]:
    """The upper edges of the uptime bands as floats; ValueError unless positive, increasing."""
    if list(band_edges_s) != sorted(band_edges_s) or any(e <= 0 for e in band_edges_s):
        raise ValueError(f"band_edges_s must be positive and increasing, got {band_edges_s}")
    return tuple(float(e) for e in band_edges_s)


def bin_bands(band_edges_s: tuple[float, ...], bin_edges: FloatArray) -> np.ndarray:
    """The band of each lifetime bin, by its lower edge."""
    bands: np.ndarray = np.searchsorted(
        np.asarray(band_edges_s, dtype=np.float64), bin_edges, side="right"
    ).astype(np.int64)
    return bands


@numba.njit(cache=True, nogil=True)
def mass_from_through(through: FloatArray, mass: FloatArray, out: int) -> None:
    """Row ``out`` of ``mass`` from the survival through each bin but the last
    (what survives them all lives in the last, open bin)."""
    width = mass.shape[1]
    survival = 1.0
    for j in range(width - 1):
        later = survival * through[j]
        mass[out, j] = survival - later
        survival = later
    mass[out, width - 1] = survival


Outcomes = tuple[np.ndarray, FloatArray, FloatArray, np.ndarray]


def interval_outcomes(
    running_rows: np.ndarray,
    uptimes: FloatArray,
    pending: list[Pending],
    previous: float,
    now: float,
    *,
    exits_to_now: bool,
) -> Outcomes:
    """Each VM's outcome in the interval (previous, now]: group rows, u0, u1, died.

    The running VMs lived from their uptime at ``previous`` (0 if created
    since) to their uptime now. A VM that left was seen alive from u0 to
    the uptime it was seen for; if ``exits_to_now``, an exit spans the whole
    interval (it died somewhere in it: the mixture's log score), else only
    as far as seen, u0 capped at it (the frailty's exposure).
    """
    since = now - previous
    rows = [running_rows]
    start_uptime = [np.maximum(uptimes - since, 0.0)]
    end_uptime = [uptimes]
    died = [np.zeros(len(uptimes), dtype=np.bool_)]
    if pending:
        rows.append(np.array([p[0] for p in pending], dtype=np.int64).reshape(-1, LEVELS))
        starts = np.array([p[1] for p in pending])
        seen = np.array([p[2] for p in pending])
        exited = np.array([p[3] for p in pending], dtype=np.bool_)
        if exits_to_now:
            start_uptime.append(np.maximum(previous - starts, 0.0))
            end_uptime.append(np.where(exited, now - starts, seen))
        else:
            start_uptime.append(np.minimum(np.maximum(previous - starts, 0.0), seen))
            end_uptime.append(seen)
        died.append(exited)
    return (
        np.concatenate(rows),
        np.concatenate(start_uptime),
        np.concatenate(end_uptime),
        np.concatenate(died),
    )


class _Counted:
    """A wrapper's count array: the counted model's array of the same name.

    Writing it is a no-op: the base class's constructor sets empty counts,
    and the wrapped model holds the real ones.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, model: CountsOf, owner: type | None = None) -> FloatArray:
        array: FloatArray = getattr(model.counted(), self.name)
        return array

    def __set__(self, model: CountsOf, value: FloatArray) -> None:
        del model, value


class CountsOf(GroupedLifeTables):
    """Life tables whose counts are another model's (``counted``): a wrapper's."""

    def counted(self) -> GroupedLifeTables:
        """The model whose counts these are."""
        raise NotImplementedError

    @property
    def pure_choice(self) -> bool:
        # A wrapper computes its rows per epoch, or records what it predicted.
        return False

    def counts_plainly(self) -> bool:
        # A wrapper learns from each exit itself (weights, frailty, calibration),
        # not only through the wrapped model's counts.
        return False

    deaths = _Counted()
    censored = _Counted()
    observations = _Counted()

    @property
    def groups(self) -> int:
        return self.counted().groups

    @property
    def lookups_past_bound(self) -> int:
        return self.counted().lookups_past_bound

    @property
    def groups_reclaimed(self) -> int:
        return self.counted().groups_reclaimed

    def overflow_row(self, level: int) -> int | None:
        return self.counted().overflow_row(level)


class NumberedCombos(GroupedLifeTables):
    """Life tables with a row per combo (a key of group rows), numbered as keys come.

    At most ``max_combos``: past ``max_combos - 1`` a new key is numbered as
    its ``_fallback_key``, which keeps the last number for such keys. A
    subclass keeps what a combo stands for (``_keep_combo``) and grows its
    own per-combo arrays with the tables (``_grow_combos``).
    """

    _combos: dict[tuple[int, ...], int]
    _combo_epoch: np.ndarray
    max_combos: int

    @property
    def combos(self) -> int:
        return len(self._combos)

    def _fallback_key(self, key: tuple[int, ...], rows: GroupRows) -> tuple[int, ...]:
        raise NotImplementedError

    def _grow_combos(self, size: int) -> None:
        raise NotImplementedError

    def _keep_combo(self, combo: int, key: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _new_combo(self, key: tuple[int, ...], rows: GroupRows) -> int:
        """The number of ``key`` (the combo of group rows ``rows``), not numbered yet."""
        if len(self._combos) >= self.max_combos - 1:
            key = self._fallback_key(key, rows)
            known = self._combos.get(key)
            if known is not None:
                return known
        combo = self._combos[key] = len(self._combos)
        if combo >= len(self._combo_epoch):
            size = 2 * len(self._combo_epoch)
            self._grow_combos(size)
            self._combo_epoch = grown(self._combo_epoch, size, -1)
            self._grow_tables(size)
        self._keep_combo(combo, key)
        return combo


class ComboLifeTables(CountsOf, NumberedCombos):
    """A wrapper predicting with a row per combo (key: wrapped rows, then owner row or -1).

    A subclass sets, in its constructor, ``max_combos``, ``_combos`` (key ->
    combo) and its array of the combos' wrapped rows, then calls
    ``_start_combos`` for the rest; and it gives the key of a VM's rows (``_combo_key``), the
    key past ``max_combos`` (``_fallback_key``), where a key's wrapped rows
    are kept (``_keep_rows``), how a combo's row is computed (``_compute``:
    its survival through each bin, then ``_write_row``) and how its owner
    state grows (``_grow_owners``).
    """

    _combo_owner: np.ndarray
    _epoch: int
    _current: dict[GroupRows, int]
    _representative: FloatArray
    _bin_band: np.ndarray
    # Exits and evictions since the last refit, and when it was.
    pending: list[Pending]
    last_scored: float | None

    def _start_combos(self, bins: LifetimeBins) -> None:
        """No combos yet, room for 16, in epoch 0 (after ``_combos`` and the wrapped rows)."""
        self._combo_owner = np.full(16, -1, dtype=np.int64)
        self._combo_epoch = np.full(16, -1, dtype=np.int64)
        self._epoch = 0
        # Key tuple (group rows) -> its combo, as of this epoch.
        self._current = {}
        width = bins.count
        self.mass = np.zeros((16, width))
        self.m0 = np.zeros((16, width + 1))
        self.m1 = np.zeros((16, width + 1))
        self._representative = np.ascontiguousarray(bins.representative, dtype=np.float64)

    def _combo_key(self, rows: GroupRows) -> tuple[int, ...]:
        raise NotImplementedError

    def _grow_combo_rows(self, size: int) -> None:
        raise NotImplementedError

    def _keep_rows(self, combo: int, key: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _compute(self, combo: int) -> None:
        raise NotImplementedError

    def choose(self, rows: GroupRows) -> int:
        """The combo of these group rows, its distribution brought up to the last refit."""
        combo = self._current.get(rows)
        if combo is not None:
            return combo
        key = self._combo_key(rows)
        combo = self._combos.get(key)
        if combo is None:
            combo = self._new_combo(key, rows)
        if self._combo_epoch[combo] != self._epoch:
            self._compute(combo)
        if len(self._current) >= MAX_CACHED_KEYS:
            self._current.clear()
        self._current[rows] = combo
        return combo

    def _grow_combos(self, size: int) -> None:
        self._grow_combo_rows(size)
        self._combo_owner = grown(self._combo_owner, size)

    def _keep_combo(self, combo: int, key: tuple[int, ...]) -> None:
        self._keep_rows(combo, key)
        self._combo_owner[combo] = key[-1]

    def _new_epoch(self) -> None:
        """The wrapped tables or the owners' state changed: each combo is recomputed on next use."""
        self._epoch += 1
        self._current.clear()

    def _grow_owners(self, size: int) -> None:
        raise NotImplementedError

    def _cover_owners(self, owners: int) -> None:
        """Owner state (for ``owners`` so far) for every group the counted model numbers.

        An owner is a level-0 group row; the wrapped model adds groups as
        key tuples come, so the owner arrays follow it.
        """
        size = len(self.counted().deaths)
        if owners < size:
            self._grow_owners(size)

    def _recompute(self, combos: np.ndarray | None) -> None:
        """A new epoch after a refit; ``combos`` (the running VMs', repredicted next) now."""
        self._new_epoch()
        if combos is not None:
            for combo in combos.tolist():
                self._compute(combo)

    def _through(self) -> FloatArray:
        """Room for a combo's survival through each bin but the last (``_write_row``)."""
        return np.empty(self.mass.shape[1] - 1)

    def _write_row(self, combo: int, through: FloatArray) -> None:
        """Row ``combo`` of ``mass`` and its suffix sums, from its survival through each bin."""
        mass_from_through(through, self.mass, combo)
        fill_suffix_sums(self.mass, self._representative, self.m0, self.m1, combo)
        self._combo_epoch[combo] = self._epoch

    def _close_interval(
        self, running: RunningVMs, now: float, *, exits_to_now: bool
    ) -> tuple[float, Outcomes] | None:
        """The interval since the last refit, closed at ``now``: its length and every outcome in it.

        None when there is none yet (the first refit) or it is empty. The
        VMs that left in it (``pending``) are consumed either way.
        """
        pending = self.pending
        self.pending = []
        previous = self.last_scored
        self.last_scored = now
        if previous is None or now <= previous:
            return None
        outcomes = interval_outcomes(
            running.rows, running.uptimes, pending, previous, now, exits_to_now=exits_to_now
        )
        return now - previous, outcomes
