"""The LAS scan's floors, one set per recent thresholds array.

A floor is a lower bound of a host's LAS cost for one VM's thresholds,
valid while time goes on and the host's quantiles stay as they were
(``lifetime_scan``); kept until when it is the host's exact
cost, it is that cost without a search (``kernels._costed``). VMs of one
group share one thresholds array until the next refit, and the trace
interleaves a few groups: a single set, started anew whenever the array
changes, would lose its floors at each change (a fifth of the scans on the
Azure dev split), though the group before comes back within a few
placements. So the floors are kept per thresholds array, for the ``SETS`` arrays used
last: a scan with an array of one of them continues that set's epoch (when
time has not gone back since it was last used), any other array takes the
set used longest ago, in a new epoch.

The arrays are told apart by identity, as the scan's epochs always were:
the tracker keeps one array per distribution row until a refit, and a
restored snapshot keeps the identities (the state codec writes an object
reached twice once).
"""

from __future__ import annotations

import numpy as np

from lavad.core.cluster import FloatArray, IntArray

# How many thresholds arrays keep their floors. On the Azure dev split 16
# would have found their set again at 97% of the changes of array, 8 at 77%.
SETS = 16


class FloorSets:
    """Per host and thresholds array: LAS floors, until when each is exact, and the
    epoch and quantile stamp each was costed in."""

    def __init__(self, sets: int = SETS) -> None:
        if sets < 1:
            raise ValueError(f"floor sets must be >= 1, got {sets}")
        # Per set: the floors (row 0) and until when each is its host's exact
        # cost (row 1); the epochs (row 0) and quantile stamps (row 1) they
        # were costed in. Epoch -1 is never current: no floor yet.
        self.floors: FloatArray = np.zeros((sets, 2, 0))
        self.marks: IntArray = np.zeros((sets, 2, 0), dtype=np.int64)
        self.thresholds: list[FloatArray | None] = [None] * sets
        # id() of each set's array -> its set: a cache that saves a pass over
        # the sets at each change of array (a fifth of the scans), trusted only
        # when the set still holds that very array (an id can come back for a
        # new array once the old one is freed, and a restored snapshot's
        # arrays have new ids).
        self.by_id: dict[int, int] = {}
        self.epochs = [0] * sets
        self.last_now = [float("-inf")] * sets
        self.last_used = [0] * sets
        self.uses = 0
        self.epoch = 0
        self.current = 0

    def for_scan(self, thresholds: FloatArray, now: float, n_hosts: int) -> tuple[int, int]:
        """The set a scan with ``thresholds`` at ``now`` over ``n_hosts`` hosts uses, and
        its epoch: the array's own set while time has not gone back, else a new epoch."""
        found = self.current
        if not (
            self.thresholds[found] is thresholds
            and now >= self.last_now[found]
            and self.floors.shape[2] >= n_hosts
            and len(self.by_id) <= 2 * len(self.thresholds)
        ):
            # Most scans skip this: the last scan's array, time gone on (its
            # ``by_id`` entry was written when it became current).
            found = self._settle(thresholds, now, n_hosts)
        self.uses += 1
        self.last_now[found] = now
        self.last_used[found] = self.uses
        self.current = found
        return found, self.epochs[found]

    def _settle(self, thresholds: FloatArray, now: float, n_hosts: int) -> int:
        """``thresholds``' set, found or taken (the least recently used), its epoch
        moved on unless time went on since its last scan; the cache kept bounded."""
        if self.floors.shape[2] < n_hosts:
            self._grow(n_hosts)
        found = self.current
        if self.thresholds[found] is not thresholds:
            found = self.by_id.get(id(thresholds), -1)
            if found < 0 or self.thresholds[found] is not thresholds:
                found = next((i for i, t in enumerate(self.thresholds) if t is thresholds), -1)
        # ``not >=``: a NaN time (which the engine's input bounds refuse before
        # the core) starts a new epoch too, so no floor outlives a time it
        # cannot be compared with.
        if found < 0 or not now >= self.last_now[found]:
            if found < 0:
                found = min(range(len(self.thresholds)), key=self.last_used.__getitem__)
            self.epoch += 1
            self.epochs[found] = self.epoch
            if self.thresholds[found] is not thresholds:
                self.by_id.pop(id(self.thresholds[found]), None)
                self.thresholds[found] = thresholds
        self.by_id[id(thresholds)] = found
        if len(self.by_id) > 2 * len(self.thresholds):
            # Entries a restored snapshot brought (ids of another process) are
            # never popped: rebuilt from the sets, the cache stays bounded.
            self.by_id = {id(t): i for i, t in enumerate(self.thresholds) if t is not None}
        return found

    def _grow(self, n_hosts: int) -> None:
        size = max(n_hosts, 2 * self.floors.shape[2], 64)
        grown = size - self.floors.shape[2]
        sets = self.floors.shape[0]
        floors = np.zeros((sets, 2, grown))
        floors[:, 1] = -np.inf  # no floor is an exact cost yet
        self.floors = np.concatenate([self.floors, floors], axis=2)
        marks = np.zeros((sets, 2, grown), dtype=np.int64)
        marks[:, 0] = -1
        self.marks = np.concatenate([self.marks, marks], axis=2)
