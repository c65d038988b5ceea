"""What a lifetime model is to its users: the tracker, the evaluation and the contract suite.

A model learns from exits (deaths) and from VMs seen alive (censorings:
evictions, and the running VMs at each refit), and predicts each VM a
distribution over ``bins``: row ``choose(rows_for(keys))`` of ``mass``, with
its suffix sums ``m0`` and ``m1`` for the repredictions (``survival.py``).
It checkpoints as plain data: every field is something the snapshot codec
writes and reads back (``lavad/daemon/live/state_codec.py``), and the model
read back predicts what the one written did.

What a caller may skip is declared, not guessed from which methods a class
overrides: ``pure_choice`` (a keys tuple's prediction may be cached until the
next refit or recount) and ``counts_plainly`` (a caller may add an exit or a
censoring, weighed by ``count_weight``, to ``deaths`` or ``censored`` itself).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from lavad.models.arrays import FloatArray
from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.survival import LifeTables

GroupRows = tuple[int, ...]


@dataclass(frozen=True)
class RunningVMs:
    """The VMs running at a refit: those censored, and the rows to bring up to date.

    ``rows`` (VMs, levels) and ``uptimes`` are the running VMs the model
    learns from, censored at their uptimes. ``chosen``, when given, are the
    distribution rows (``choose``'s answers) of every running VM, counted or
    not: the caller repredicts them from ``mass`` right after the refit, so
    the model brings them up to date there rather than on their next
    ``choose``. The caller's arrays are read, never written.
    """

    rows: np.ndarray
    uptimes: FloatArray
    chosen: np.ndarray | None = None

    def __post_init__(self) -> None:
        # One layout for every model and caller: int64 rows of LEVELS
        # columns (an empty list of VMs included), float64 uptimes, and each
        # chosen row once (a model brings a row up to date once).
        rows = np.asarray(self.rows, dtype=np.int64).reshape(-1, LEVELS)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "uptimes", np.asarray(self.uptimes, dtype=np.float64))
        if self.chosen is not None:
            chosen = np.unique(np.asarray(self.chosen, dtype=np.int64))
            object.__setattr__(self, "chosen", chosen)


@runtime_checkable
class LifetimeModel(LifeTables, Protocol):
    """An online, censoring-aware model of VM lifetimes as distributions over bins.

    Its distributions (``bins``, ``mass``, ``m0``, ``m1``) are ``LifeTables``,
    which the repredictions in ``survival`` read.
    """

    @property
    def deaths(self) -> FloatArray:
        """Per group row and bin, the exits counted (``counts_plainly``: a caller may add)."""
        ...

    @property
    def censored(self) -> FloatArray:
        """Per group row and bin, the censorings counted."""
        ...

    @property
    def pure_choice(self) -> bool:
        """Whether ``choose`` records nothing and answers alike until the next refit or recount.

        A caller may then keep a keys tuple's prediction until either; a
        model that learns from its own predictions (recalibration) or
        computes rows per epoch says False.
        """
        ...

    def rows_for(self, keys: tuple[Hashable, ...]) -> GroupRows:
        """The group row of each level's key (``features.lifetime_keys``); new groups get rows."""
        ...

    @property
    def groups(self) -> int:
        """The feature groups the model has numbered (its bound's overflow rows included)."""
        ...

    @property
    def lookups_past_bound(self) -> int:
        """Lookups of a group that has no row of its own past the bound (``overflow_row``)."""
        ...

    @property
    def groups_reclaimed(self) -> int:
        """Groups whose rows went to new groups past the bound (0 if the model never reclaims)."""
        ...

    def overflow_row(self, level: int) -> int | None:
        """The row ``level``'s groups past the bound on groups share (no evidence), if any."""
        ...

    def choose(self, rows: GroupRows) -> int:
        """The distribution row a VM of these group rows is predicted with."""
        ...

    def observe_exit(self, rows: GroupRows, lifetime: float, now: float = 0.0) -> None:
        """A death at ``lifetime``, seen at ``now``."""
        ...

    def observe_censored(self, rows: GroupRows, seen: float, now: float = 0.0) -> None:
        """A VM seen alive for ``seen`` and then lost (evicted), at ``now``."""
        ...

    def observe_running(self, row: int, uptimes: FloatArray, now: float = 0.0) -> None:
        """Recount group ``row`` between refits, its running VMs censored at ``uptimes``."""
        ...

    def refit(self, running: RunningVMs, *, now: float = 0.0) -> None:
        """Rebuild the distributions with the running VMs censored; bring ``chosen`` up to date."""
        ...

    def counts_plainly(self) -> bool:
        """Whether an exit or censoring only adds ``count_weight`` at its rows and column.

        A caller may then add it to ``deaths`` or ``censored`` itself and
        ``touch`` the rows, instead of calling ``observe_exit`` or
        ``observe_censored``.
        """
        ...

    @property
    def counts_by_age(self) -> bool:
        """Whether ``count_weight`` depends on the VM's creation (forgetting); else it is 1.0."""
        ...

    def count_weight(self, born: float) -> float:
        """What one exit or censoring of a VM created at ``born`` adds to its counts.

        It may rescale the stored counts first (forgetting's re-anchoring):
        take it before adding.
        """
        ...

    def touch(self, rows: GroupRows) -> None:
        """Rows whose counts a caller changed (``counts_plainly``): the next refit rebuilds them."""
        ...
