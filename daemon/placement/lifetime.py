"""Lifetime-aware placement: the VM lifetime tracker and the LAS and LA-Binary scores.

``LifetimeTracker`` is a policy's hooks: it keeps, per running VM, its host,
start time, feature groups and predicted distribution, feeds exits (deaths)
and evictions (censorings) to the online model, and refits the model's life
tables every ``refit_interval_s`` of event time with the running VMs
censored at their uptimes. The score plugins read it:

* ``LasTemporalCost`` (LAVA paper, section 4.2): dT = max(vm_exit -
  host_exit, 0), host_exit the latest *repredicted* exit of the host's VMs
  (start + E[T | T > uptime]), quantised into the buckets {0m, 30m, 60m, 90m,
  2h, 3h, 4h, 6h, 12h, 24h, 168h}; the bucket index is the cost, one
  lexicographic level above Best Fit. An empty host's exit is "now", so it
  costs the VM's whole predicted lifetime.
* ``LaBinaryClass`` (Barbalho et al., as the paper's sections 2.4 and 5.3
  describe it): one prediction at creation, E[T] from the same model, no
  reprediction; a VM is long when that exceeds 2 hours; a host is long when
  the longest remaining time of its VMs *by their initial predictions*
  exceeds 2 hours. Cost 0 for a non-empty host of the VM's class, 1 for
  another non-empty host, 2 for an empty host; Best Fit below it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lavad.daemon.cluster import ClusterState, FloatArray, VmRecord
from lavad.daemon.placement.framework import PlacementRequest
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import LEVELS, lifetime_keys
from lavad.models.lifetime.grouped import GroupedLifeTables, GroupRows
from lavad.models.lifetime.survival import expected_remaining
from lavad.streams.schema import VmPlaced, VmRequest

HOUR = 3600.0
LAS_BUCKETS_S: FloatArray = (
    np.array([0, 30, 60, 90, 120, 180, 240, 360, 720, 1440, 10080], dtype=np.float64) * 60.0
)
LA_BINARY_CUTOFF_S = 2 * HOUR


def temporal_cost(delta_s: FloatArray) -> FloatArray:
    """LAS temporal cost: the index of the bucket dT falls in (70 min -> 2)."""
    index = np.searchsorted(LAS_BUCKETS_S, np.maximum(delta_s, 0.0), side="right") - 1
    return index.astype(np.float64)


@dataclass(frozen=True, slots=True)
class LifetimeSettings:
    refit_interval_s: float = 3600.0
    min_observations: int = 30


class LifetimeTracker:
    """Per-VM lifetime state of one pool, and the model it feeds (a policy's hooks).

    Cost per placement is O(hosts) plus the VMs whose predicted exit has
    passed: each VM keeps its predicted exit, and each host the latest of its
    VMs' (``host_exit``), updated on booking and release. A VM is repredicted
    (E[T_r | T_u] from its uptime) when it outlives its prediction, and every
    VM is when the tables are refitted. Repredicting an overdue VM only moves
    its exit later, so the host maximum stays exact without a rescan.
    """

    # An overdue VM is given at least this much more life, so that it is not
    # repredicted again on every placement while its table says "ending now".
    MIN_REMAINING_S = 60.0

    def __init__(self, settings: LifetimeSettings, bins: LifetimeBins | None = None) -> None:
        self.settings = settings
        self.model = GroupedLifeTables(bins or LifetimeBins.log_spaced(), settings.min_observations)
        size = 64
        self.host = np.full(size, -1, dtype=np.int64)
        self.start = np.zeros(size)
        self.row = np.zeros(size, dtype=np.int64)
        self.levels = np.zeros((size, LEVELS), dtype=np.int64)
        # E[T] at creation (LA-Binary's one-shot prediction) and the latest one.
        self.initial_exit = np.zeros(size)
        self.predicted_exit = np.zeros(size)
        self.alive = np.zeros(size, dtype=np.bool_)
        self.host_exit: FloatArray = np.full(0, -np.inf)
        self.host_initial_exit: FloatArray = np.full(0, -np.inf)
        self._on_host: dict[int, set[int]] = {}
        self._slot: dict[str, int] = {}
        self._free: list[int] = list(range(size - 1, -1, -1))
        self._next_refit = float("-inf")
        self.repredictions = 0

    # ------------------------------------------------------------ predicting

    def predict(self, event: VmRequest | VmPlaced | None) -> tuple[GroupRows, int, float]:
        """The VM's groups, its chosen distribution row and E[T] at creation."""
        if event is None:
            keys: tuple[object, ...] = (None, None, None, ())
        else:
            keys = lifetime_keys(
                event.tenant, event.cores, event.memory_gib, event.flavor, event.features
            )
        rows = self.model.rows_for(keys)
        chosen = self.model.choose(rows)
        # E[T | T > 0] is the first moment of the whole table.
        return rows, chosen, float(self.model.m1[chosen, 0] / self.model.m0[chosen, 0])

    def expected_remaining(self, rows: np.ndarray, uptimes: FloatArray) -> FloatArray:
        model = self.model
        return expected_remaining(model.bins, model.mass, model.m0, model.m1, rows, uptimes)

    def refresh(self, now: float) -> None:
        """Refit when due, and repredict the VMs that outlived their predicted exit."""
        if now >= self._next_refit:
            self._refit(now)
            return
        overdue = np.flatnonzero(self.alive & (self.predicted_exit <= now))
        if not len(overdue):
            return
        remaining = self.expected_remaining(self.row[overdue], now - self.start[overdue])
        exits = now + np.maximum(remaining, self.MIN_REMAINING_S)
        self.predicted_exit[overdue] = exits
        np.maximum.at(self.host_exit, self.host[overdue], exits)
        self.repredictions += len(overdue)

    def _refit(self, now: float) -> None:
        alive = np.flatnonzero(self.alive)
        self.model.refit(self.levels[alive], now - self.start[alive])
        if len(alive):
            remaining = self.expected_remaining(self.row[alive], now - self.start[alive])
            self.predicted_exit[alive] = now + np.maximum(remaining, self.MIN_REMAINING_S)
            self.repredictions += len(alive)
        self.host_exit.fill(-np.inf)
        np.maximum.at(self.host_exit, self.host[alive], self.predicted_exit[alive])
        self._next_refit = now + self.settings.refit_interval_s

    def host_exits(self, n_hosts: int, now: float, *, repredict: bool) -> FloatArray:
        """Per host, the latest predicted exit of its VMs (``now`` for a host without any).

        ``repredict``: the current predictions (LAS; call ``refresh`` first);
        else each VM's exit as predicted at its creation (LA-Binary).
        """
        self._grow_hosts(n_hosts)
        exits = self.host_exit if repredict else self.host_initial_exit
        return np.maximum(exits[:n_hosts], now)

    # ----------------------------------------------------------------- hooks

    def on_booked(
        self,
        cluster: ClusterState,
        record: VmRecord,
        now: float,
        event: VmRequest | VmPlaced | None,
    ) -> None:
        rows, chosen, expected = self.predict(event)
        slot = self._take_slot()
        host = record.host
        self._grow_hosts(host + 1)
        self._slot[record.vm_id] = slot
        self._on_host.setdefault(host, set()).add(slot)
        exit_time = record.placed_at + expected
        self.host[slot] = host
        self.start[slot] = record.placed_at
        self.row[slot] = chosen
        self.levels[slot] = rows
        self.initial_exit[slot] = self.predicted_exit[slot] = exit_time
        self.alive[slot] = True
        self.host_exit[host] = max(self.host_exit[host], exit_time)
        self.host_initial_exit[host] = max(self.host_initial_exit[host], exit_time)

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None:
        slot = self._slot.pop(record.vm_id, None)
        if slot is None:
            return
        rows = tuple(int(r) for r in self.levels[slot])
        lived = max(now - self.start[slot], 0.0)
        if exited:
            self.model.observe_exit(rows, lived)
        else:
            # Evicted (host down): it lived at least this long; not an exit.
            self.model.observe_censored(rows, lived)
        host = int(self.host[slot])
        self.alive[slot] = False
        self.host[slot] = -1
        self._free.append(slot)
        others = self._on_host[host]
        others.discard(slot)
        if others:
            members = np.fromiter(others, dtype=np.int64, count=len(others))
            self.host_exit[host] = self.predicted_exit[members].max()
            self.host_initial_exit[host] = self.initial_exit[members].max()
        else:
            self.host_exit[host] = self.host_initial_exit[host] = -np.inf

    def _grow_hosts(self, n_hosts: int) -> None:
        if n_hosts > len(self.host_exit):
            size = max(n_hosts, 2 * len(self.host_exit), 64)
            extra = np.full(size - len(self.host_exit), -np.inf)
            self.host_exit = np.concatenate([self.host_exit, extra])
            self.host_initial_exit = np.concatenate([self.host_initial_exit, extra])

    def _take_slot(self) -> int:
        if not self._free:
            size = len(self.host)
            self.host = np.concatenate([self.host, np.full(size, -1, dtype=np.int64)])
            self.start = np.concatenate([self.start, np.zeros(size)])
            self.row = np.concatenate([self.row, np.zeros(size, dtype=np.int64)])
            self.levels = np.concatenate([self.levels, np.zeros((size, LEVELS), dtype=np.int64)])
            self.initial_exit = np.concatenate([self.initial_exit, np.zeros(size)])
            self.predicted_exit = np.concatenate([self.predicted_exit, np.zeros(size)])
            self.alive = np.concatenate([self.alive, np.zeros(size, dtype=np.bool_)])
            self._free = list(range(2 * size - 1, size - 1, -1))
        return self._free.pop()


class LasTemporalCost:
    """LAS: bucketed dT between the VM's predicted exit and the host's repredicted exit."""

    name = "las"
    kernel = None
    kernel_weights: FloatArray = np.ones(4)

    def __init__(self, tracker: LifetimeTracker) -> None:
        self.tracker = tracker

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        tracker = self.tracker
        now = request.now
        tracker.refresh(now)
        _, _, expected = tracker.predict(request.event)
        host_exit = tracker.host_exits(cluster.n_hosts, now, repredict=True)
        out[:] = temporal_cost(now + expected - host_exit)


class LaBinaryClass:
    """LA-Binary: same class (short/long at 2 h, initial predictions) first, empty hosts last."""

    name = "la_binary"
    kernel = None
    kernel_weights: FloatArray = np.ones(4)

    def __init__(self, tracker: LifetimeTracker) -> None:
        self.tracker = tracker

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        tracker = self.tracker
        now = request.now
        # The model learns as for LAS; only the initial predictions are used.
        tracker.refresh(now)
        _, _, expected = tracker.predict(request.event)
        n = cluster.n_hosts
        remaining = tracker.host_exits(n, now, repredict=False) - now
        host_long = remaining > LA_BINARY_CUTOFF_S
        vm_long = expected > LA_BINARY_CUTOFF_S
        out[:] = np.where(host_long == vm_long, 0.0, 1.0)
        empty = cluster.vm_count[:n] == 0
        out[empty] = 2.0
