"""Lifetime-aware placement: the VM lifetime tracker and the LAS and LA-Binary scores.

``LifetimeTracker`` is a policy's hooks: it keeps, per running VM, its host,
start time, feature groups and predicted exit, feeds exits (deaths) and
evictions (censorings) to the online model, and runs two kinds of timers:

* a refit of the model's life tables every ``refit_interval_s`` of event
  time, with the running VMs censored at their uptimes, after which every
  running VM is repredicted (not published: it would be one decision per VM
  per hour);
* a VM's predicted exit: when a VM outlives it, it is repredicted from its
  uptime, start + uptime + E[T_r | T_u], and that is published (a
  reprediction decision). This is the paper's adaptation to mispredictions.

With ``oracle`` the prediction is the VM's true lifetime, attached to the
request by the replay (``streams/oracle.py``); no model is fitted and no
reprediction is needed. Oracle policies are upper bounds for a replay.

The score plugins read it:

* ``LasTemporalCost`` (LAVA paper, section 4.2): dT = max(vm_exit -
  host_exit, 0), host_exit the latest *repredicted* exit of the host's VMs,
  quantised into the buckets {0m, 30m, 60m, 90m, 2h, 3h, 4h, 6h, 12h, 24h,
  168h}; the bucket index is the cost, one lexicographic level above Best
  Fit. An empty host's exit is "now", so it costs the VM's whole predicted
  lifetime. With quantile scoring the VM's lifetime is a distribution (the
  expected bucket over its quantiles) and, with ``host_quantiles``, so is
  the host's exit: the quantiles of the remaining life of the VM holding
  the host's exit (the "expected extension of the host's life" the
  design asks distribution-aware scoring to weigh). That VM stands for the
  host: the max over all its VMs would be later still, which the point exit
  ignores too.
* ``LaBinaryClass`` (Barbalho et al., as the paper's sections 2.4 and 5.3
  describe it): one prediction at creation, E[T] from the same model, no
  reprediction; a VM is long when that exceeds 2 hours; a host is long when
  the longest remaining time of its VMs *by their initial predictions*
  exceeds 2 hours. Cost 0 for a non-empty host of the VM's class, 1 for
  another non-empty host, 2 for an empty host; Best Fit below it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

from lavad.core.cluster import ClusterState, FloatArray, VmRecord
from lavad.core.placement.framework import (
    Booking,
    ClusterListener,
    Notice,
    NumpyScorer,
    PlacementRequest,
)
from lavad.core.placement.kernels import (
    GENERATION,
    HOST,
    INITIAL_EXIT,
    LEARNS,
    PREDICTED_EXIT,
    START,
    Direct,
    ModelArrays,
    TrackerArrays,
    rebuild_host_exits,
)
from lavad.core.placement.kernels import _join_host as join_host
from lavad.core.placement.kernels import _leave_host as leave_host
from lavad.core.placement.lifetime_state import HostColumns, SlotColumns
from lavad.core.placement.tracker_state import PackedTracker, check_tracker_state
from lavad.core.registry import Entry, Registry
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.calibrated import CalibratedLifeTables
from lavad.models.lifetime.calibration import SurvivalCalibrator
from lavad.models.lifetime.features import (
    LEVELS,
    ORACLE_FEATURE,
    left_truncated,
    request_keys,
)
from lavad.models.lifetime.frailty import FrailtyLifeTables
from lavad.models.lifetime.grouped import MAX_CACHED_KEYS, MAX_ROWS, GroupedLifeTables
from lavad.models.lifetime.mixture import MixtureLifeTables
from lavad.models.lifetime.protocol import GroupRows, LifetimeModel, RunningVMs
from lavad.models.lifetime.shrunk import ShrunkLifeTables
from lavad.models.lifetime.survival import (
    creation_quantiles,
    expected_remaining,
    median_remaining,
    midpoint_levels,
    remaining_quantiles,
)

HOUR = 3600.0
LAS_BUCKETS_S: FloatArray = (
    np.array([0, 30, 60, 90, 120, 180, 240, 360, 720, 1440, 10080], dtype=np.float64) * 60.0
)
LA_BINARY_CUTOFF_S = 2 * HOUR


def temporal_cost(delta_s: FloatArray) -> FloatArray:
    """LAS temporal cost: the index of the bucket dT falls in (70 min -> 2)."""
    index = np.searchsorted(LAS_BUCKETS_S, np.maximum(delta_s, 0.0), side="right") - 1
    return index.astype(np.float64)


def cost_thresholds(remaining_s: FloatArray) -> FloatArray:
    """The VM's expected LAS cost as a step function of a host's remaining life d.

    With the VM's remaining lifetime taking each value q_k of ``remaining_s``
    with probability 1/Q, E[cost](d) = 1/Q sum_k temporal_cost(q_k - d), and
    temporal_cost(x) counts the bucket bounds B_b > 0 with B_b <= x. So
    Q * E[cost](d) = #{(k, b): d <= q_k - B_b}: the number of these sorted
    thresholds at or above d (``expected_cost_counts``). The per-placement
    cost is then one search of each host in Q x 10 numbers, O(hosts log Q),
    and integer counts tie exactly where the costs do.
    """
    pairs = np.asarray(remaining_s, dtype=np.float64)[:, None] - LAS_BUCKETS_S[None, 1:]
    thresholds: FloatArray = np.sort(pairs, axis=None)
    return thresholds


def expected_cost_counts(thresholds: FloatArray, host_remaining_s: FloatArray) -> FloatArray:
    """Q x E[LAS cost] per host, from ``cost_thresholds`` and each host's remaining life."""
    above = len(thresholds) - np.searchsorted(thresholds, host_remaining_s, side="left")
    return above.astype(np.float64)


class OracleMissing(ValueError):
    """An oracle policy got a request without its true lifetime."""


@dataclass(frozen=True, slots=True)
class LifetimeSettings:
    refit_interval_s: float = 3600.0
    min_observations: int = 30
    # Publish and act on repredictions when a VM outlives its prediction
    # (LAS, LAVA); LA-Binary predicts once.
    repredict: bool = True
    oracle: bool = False
    # The point a distribution is summarised by: "mean" (E[T_r | T_u], the
    # paper's) or "median" (see ``median_remaining``).
    estimate: Literal["mean", "median"] = "mean"
    # How LAS scores a host: "mean" buckets dT of the point estimate above;
    # "quantiles" takes the expected bucket over ``quantiles`` evenly spread
    # quantiles of the VM's lifetime distribution (the host keeps its point
    # exit), so a VM the model is unsure about is not placed by one number.
    scoring: Literal["mean", "quantiles"] = "mean"
    quantiles: int = 32
    # With quantile scoring, how a host's remaining life enters the cost: 0
    # is its point exit; H > 0 takes H evenly spread quantiles of the
    # remaining life of the VM holding that exit and averages the VM's
    # expected cost over them (``host_exit_quantiles``). The policies' default
    # is 8 (``registry.LifetimeArgs``); 0 here keeps a bare tracker's point exit.
    host_quantiles: int = 0
    # Whose remaining life a host's quantiles are: "latest_vm", the VM holding
    # its latest predicted exit; "all_vms", the latest exit of all its VMs,
    # taken independent (``kernels._latest_of_all``).
    host_life: Literal["latest_vm", "all_vms"] = "latest_vm"
    # The class-valued request features the feature groups are keyed by
    # (``features.DECLARED_CATEGORICAL`` for those the adapters declare).
    categorical: tuple[str, ...] = ()
    # The online model (``LIFETIME_MODELS``): "tables" backs off to the finest
    # group with ``min_observations``; "shrunk" blends every level's hazards,
    # each shrunk towards the coarser one with a prior of ``prior_strength`` VMs.
    model: str = "tables"
    prior_strength: float = 10.0
    # Sibling evidence: when a VM exits, its owner group
    # (tenant or deployment, and shape: an Azure batch) is recounted at once
    # with its running siblings censored at their uptimes, and those siblings
    # are repredicted from it, through the model's own shrinkage towards the
    # coarser groups, instead of waiting for the next refit. Milestones: the
    # group's 1st, 2nd, 4th, 8th... exit.
    siblings: bool = False
    # Forgetting: observations count half as much every ``half_life_s`` of
    # event time (None: never forgotten), for workloads that drift.
    half_life_s: float | None = None
    # The bound on feature groups (``grouped.MAX_ROWS``): past it a new
    # group takes the row of a group that no longer counts (model "tables"),
    # or its VMs are predicted from their coarser groups.
    max_groups: int = MAX_ROWS


# The online lifetime models a tracker can learn with; a factory gets the
# bins and the tracker's settings. All refit at event times only (the
# tracker's timers), so a replay and the live daemon learn the same tables.
# A model is here only if it is the default or the best somewhere on
# placement or calibration (docs/policies/lifetime-models.md gives each
# one's figures): "tables" is the default; "shrunk" has the best log score
# on every trace; "mixture" the best ECE at 1 h on Azure V1 and at 24 h on
# DLRM; "mixture-calibrated" the best ECE at 1 h on DLRM; and
# "mixture-frailty-calibrated" is the only one within the ECE goal on every
# trace at both thresholds. The tables or shrunk tables recalibrated, the
# frailty on the tables and on the mixture are best nowhere: they are
# built by the evaluation only (``lavad evaluate lifetime --models``).
LIFETIME_MODELS: Registry[LifetimeModel] = Registry(
    "lifetime model",
    [
        Entry(
            "tables",
            "life tables per feature group, censoring-aware; the finest group with "
            "min_observations predicts",
            lambda _args, bins, settings: GroupedLifeTables(
                bins,
                settings.min_observations,
                half_life_s=settings.half_life_s,
                max_rows=settings.max_groups,
                reclaim_groups=True,
            ),
        ),
        Entry(
            "shrunk",
            "every group level's hazards, bin by bin, shrunk from the pool to the owner "
            "(a Beta prior of prior_strength VMs at each level); censoring-aware",
            lambda _args, bins, settings: ShrunkLifeTables(
                bins,
                settings.min_observations,
                prior_strength=settings.prior_strength,
                half_life_s=settings.half_life_s,
                max_rows=settings.max_groups,
            ),
        ),
        Entry(
            "mixture",
            "life tables with no forgetting and with half-lives of 7 d, 72 h and 24 h, mixed "
            "per uptime band by each one's recent log score on resolved VMs (mixture.py)",
            lambda _args, bins, settings: MixtureLifeTables(
                bins, settings.min_observations, max_rows=settings.max_groups
            ),
        ),
        Entry(
            "mixture-calibrated",
            "model 'mixture', P(T > e) recalibrated online from the outcomes of its "
            "predictions at creation (calibrated.py, calibration.py)",
            lambda _args, bins, settings: CalibratedLifeTables(
                MixtureLifeTables(bins, settings.min_observations, max_rows=settings.max_groups),
                SurvivalCalibrator(bins),
            ),
        ),
        Entry(
            "mixture-frailty-calibrated",
            "model 'mixture', each owner's hazard times its frailty (the gamma posterior of its "
            "recent deaths over the hazard expected for them: frailty.py), recalibrated online "
            "as 'mixture-calibrated'",
            lambda _args, bins, settings: CalibratedLifeTables(
                FrailtyLifeTables(
                    MixtureLifeTables(bins, settings.min_observations, max_rows=settings.max_groups)
                ),
                SurvivalCalibrator(bins),
            ),
        ),
    ],
)


_Scalar = TypeVar("_Scalar", bound=np.generic)


def _row(packed: NDArray[_Scalar], index: int) -> NDArray[_Scalar]:
    """Row ``index`` of a packed 2-D array: one column of the tracker, a contiguous view."""
    row: NDArray[_Scalar] = packed[index]
    return row


@dataclass(slots=True)
class Prediction:
    rows: GroupRows
    row: int
    lifetime_s: float
    # ``cost_thresholds`` of the VM's lifetime quantiles (quantile scoring only).
    thresholds: FloatArray | None = None
    # The quantiles themselves, ascending (quantile scoring only).
    quantiles: FloatArray | None = None


# A distribution row's prediction at creation: (lifetime, LAS cost thresholds,
# the quantiles they come from), the last two under quantile scoring only.
AtCreation = tuple[float, FloatArray | None, FloatArray | None]


def _true_lifetime(event: Booking) -> float:
    value = None if event is None else event.features.get(ORACLE_FEATURE)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise OracleMissing(
            f"an oracle policy needs each request's true lifetime in features"
            f"[{ORACLE_FEATURE!r}] (attached by `lavad replay`; the live daemon has none),"
            f" got {value!r}"
        )
    return float(value)


class LifetimeTracker(ClusterListener):
    """Per-VM lifetime state of one pool, and the model it feeds (a policy's hooks).

    Cost per placement is O(hosts): each VM keeps its predicted exit, and
    each host the latest of its VMs' (``host_exit``), updated on booking,
    release, migration and reprediction. A reprediction only moves a VM's exit later
    (it outlived the old one), so the host maximum stays exact without a
    rescan; a refit rebuilds it.
    """

    # An overdue VM is given at least this much more life, so that a table
    # saying "ending now" does not reschedule it at the same instant forever.
    MIN_REMAINING_S = 60.0

    def __init__(self, settings: LifetimeSettings, bins: LifetimeBins | None = None) -> None:
        self.settings = settings
        self.model = LIFETIME_MODELS.build(
            settings.model, None, bins or LifetimeBins.log_spaced(), settings
        )
        size = 64
        # Per slot and per host, packed by type (``lifetime_state.py``).
        self.slots = SlotColumns(size)
        self.levels = np.zeros((size, LEVELS), dtype=np.int64)
        self.vm_ids: list[str] = [""] * size
        # Each slot's group rows as the tuple the model takes (``levels`` as
        # Python ints): a release hands them to the model without a numpy read.
        self.slot_rows: list[GroupRows] = [()] * size
        self.hosts = HostColumns(settings.host_quantiles)
        self._host_levels = midpoint_levels(max(settings.host_quantiles, 1))
        # The open bin's lifetime, as the quantile kernels take it.
        self._open_lifetime = float(self.model.bins.representative[-1])
        # Per distribution row, its host quantiles at uptime 0 and whether
        # they are known (until the next refit): most holders are VMs just
        # booked, never repredicted.
        self._creation_q: FloatArray = np.zeros((0, settings.host_quantiles))
        self._creation_known = np.zeros(0, dtype=np.bool_)
        # Whether a release may add the VM's exit or censoring to the model's
        # counts itself (``LifetimeModel.counts_plainly``), in the same call.
        self._counts_plainly = self.model.counts_plainly()
        self._slot: dict[str, int] = {}
        self._free: list[int] = list(range(size - 1, -1, -1))
        self._next_refit = float("inf") if settings.oracle else float("-inf")
        # (predicted exit, slot, generation) of VMs that may outlive it before
        # the next refit. An exit at or after it is not kept: the refit
        # repredicts every running VM and rebuilds this heap first, so such
        # an entry would never be due (``_earliest_exit`` stands in for them).
        self._exits: list[tuple[float, int, int]] = []
        # ``next_deadline`` as last computed (None: to recompute). The engine
        # reads it several times per event; it changes only when the heap, a
        # generation or the next refit does.
        self._deadline: float | None = None
        self._cached: tuple[str, float, Prediction] | None = None
        # Per distribution row, its lifetime at creation (the mean or median),
        # and its quantiles at creation with their LAS cost thresholds (quantile
        # scoring), until the next refit: a row's table changes only then.
        self._at_creation: dict[int, AtCreation] = {}
        self._levels = midpoint_levels(settings.quantiles)
        # The prediction at creation of each keys tuple, until the model's
        # distributions or choices change (a refit, a sibling's recount):
        # ``rows_for`` and ``choose`` give the same rows and row until then.
        # Only for models whose ``choose`` records nothing (``pure_choice``);
        # never with the oracle (its lifetime is the request's own).
        self._by_keys: dict[tuple[object, ...], tuple[Prediction, AtCreation]] | None = (
            {} if self.model.pure_choice and not settings.oracle else None
        )
        # Owner group row -> its running VMs the model learns from, and how
        # many of its VMs have exited (``siblings``).
        self._siblings: dict[int, set[int]] = {}
        self._sibling_exits: dict[int, int] = {}
        # The settings a booking reads, once (they are frozen).
        self._learns_siblings = settings.siblings and not settings.oracle
        self._repredicts = settings.repredict and not settings.oracle
        # A host's quantiles read every VM on it: a VM joining or leaving
        # makes them stale, not only a change of its latest exit.
        self._all_vms = settings.host_life == "all_vms"
        self.repredictions = 0
        # The initial lifetime of the VM booked last (``initial_lifetime``).
        self.booked_lifetime = 0.0
        self.notices: list[Notice] = []

    # ------------------------------------------------------------ predicting

    def predict(self, event: Booking) -> Prediction:
        """The VM's groups, its chosen distribution row and its lifetime at creation."""
        if event is None:
            keys: tuple[object, ...] = (None,) * (LEVELS - 1) + ((),)
        else:
            keys = request_keys(event, self.settings.categorical)
        memo = self._by_keys
        if memo is not None:
            known = memo.get(keys)
            # Valid while its row's answers at creation are those it was made with.
            if known is not None and self._at_creation.get(known[0].row) is known[1]:
                return known[0]
        rows = self.model.rows_for(keys)
        chosen = self.model.choose(rows)
        if self.settings.oracle:
            return Prediction(rows, chosen, _true_lifetime(event))
        at_creation = self._at_creation.get(chosen)
        if at_creation is None:
            at_creation = self._at_creation[chosen] = self._creation_prediction(chosen)
        prediction = Prediction(rows, chosen, at_creation[0], at_creation[1], at_creation[2])
        if memo is not None:
            if len(memo) >= MAX_CACHED_KEYS:
                memo.clear()
            memo[keys] = (prediction, at_creation)
        return prediction

    def _forget_predictions(self) -> None:
        """The model's distributions or choices changed: per-row and per-keys caches go."""
        self._at_creation.clear()
        if self._by_keys is not None:
            self._by_keys.clear()

    def _creation_prediction(self, chosen: int) -> AtCreation:
        """A distribution row's lifetime at creation and LAS thresholds (kept until a refit)."""
        model = self.model
        thresholds = quantiles = None
        if self.settings.scoring == "quantiles":
            # remaining_quantiles at uptime 0, compiled (the same numbers).
            quantiles = creation_quantiles(model, chosen, self._levels)
            thresholds = cost_thresholds(quantiles)
        if self.settings.estimate == "median":
            lifetime = float(self.remaining_estimate(np.array([chosen]), np.zeros(1))[0])
        else:
            # E[T | T > 0] is the first moment of the whole table.
            lifetime = float(model.m1[chosen, 0] / model.m0[chosen, 0])
        return lifetime, thresholds, quantiles

    def remaining_quantiles(self, row: int, uptime: float) -> FloatArray:
        """The ``settings.quantiles`` quantiles of one VM's T_r | T_u."""
        quantiles: FloatArray = remaining_quantiles(
            self.model, np.array([row]), np.array([uptime]), self._levels
        )[0]
        return quantiles

    def prediction_for(self, request: PlacementRequest) -> Prediction:
        """``predict`` for a placement, computed once for all of a policy's scorers."""
        cached = self._cached
        if cached is not None and cached[0] == request.vm_id and cached[1] == request.now:
            return cached[2]
        slot = self._slot.get(request.vm_id)
        if slot is None:
            prediction = self.predict(request.event)
        else:
            # A running VM asking for a host is being migrated: LAS and LAVA
            # place it by its repredicted remaining lifetime, not its lifetime
            # at creation.
            remaining = max(
                float(self.slots.predicted_exit[slot]) - request.now, self.MIN_REMAINING_S
            )
            rows = self.slot_rows[slot]
            row = int(self.slots.row[slot])
            thresholds = quantiles = None
            if self.settings.scoring == "quantiles" and not self.settings.oracle:
                uptime = request.now - float(self.slots.start[slot])
                quantiles = self.remaining_quantiles(row, uptime)
                thresholds = cost_thresholds(quantiles)
            prediction = Prediction(rows, row, remaining, thresholds, quantiles)
        self._cached = (request.vm_id, request.now, prediction)
        return prediction

    def is_running(self, vm_id: str) -> bool:
        """Whether the tracker holds ``vm_id`` (placed and not yet gone)."""
        return vm_id in self._slot

    def vm_quantiles(self, request: PlacementRequest) -> FloatArray:
        """The remaining lifetimes LAS takes its expected cost over, for ``request``.

        The quantiles behind ``prediction_for(request).thresholds`` (those of
        T at creation, or of T_r | T_u for a running VM being moved); the
        point lifetime alone where LAS scores by a point.
        """
        # The prediction carries them (``prediction_for``): kept per row until
        # a refit, or taken at the moving VM's uptime.
        prediction = self.prediction_for(request)
        if prediction.quantiles is None:
            return np.array([prediction.lifetime_s])
        return prediction.quantiles

    def remaining_estimate(self, rows: np.ndarray, uptimes: FloatArray) -> FloatArray:
        """Each VM's remaining lifetime from its uptime: the mean or the median of T_r | T_u."""
        estimator = median_remaining if self.settings.estimate == "median" else expected_remaining
        return estimator(self.model, rows, uptimes)

    # ---------------------------------------------------------------- timers

    def _first_exit(self) -> float:
        exits = self._exits
        generation = self.slots.ints[GENERATION]
        while exits and exits[0][2] != generation[exits[0][1]]:
            heapq.heappop(exits)
        return exits[0][0] if exits else float("inf")

    @property
    def next_deadline(self) -> float:
        deadline = self._deadline
        if deadline is None:
            deadline = self._deadline = min(self._next_refit, self._first_exit())
        return deadline

    def advance(self, cluster: ClusterState, now: float) -> None:
        """Refits and repredictions due by ``now``, in time order (a refit first on a tie)."""
        self._deadline = None
        while True:
            first_exit = self._first_exit()
            refit = self._next_refit
            if refit <= now and refit <= first_exit:
                # A refit rebuilds the tables, so of several refits due with
                # nothing between them only the last counts: jump to it (an
                # idle gap of days would otherwise cost one refit per hour).
                # The heap keeps no exit at or after the refit: the earliest
                # one, whether it holds it or not, is every running VM's.
                until = min(now, self._earliest_exit())
                if refit == float("-inf"):  # the first one: on the first event
                    self._refit(until)
                else:
                    interval = self.settings.refit_interval_s
                    self._refit(refit + (until - refit) // interval * interval)
            elif first_exit <= now:
                self._repredict_overdue(now, refit)
            else:
                return

    def _earliest_exit(self) -> float:
        """The earliest predicted exit of a running VM (inf: none, or no repredictions).

        What the heap's first entry would be if it held every running VM's
        exit: each running VM's one current entry is its ``predicted_exit``.
        """
        if not self.settings.repredict or self.settings.oracle or not self.slots.alive.any():
            return float("inf")
        return float(self.slots.predicted_exit[self.slots.alive].min())

    def refresh(self, cluster: ClusterState, now: float) -> None:
        """Catch up when used outside an engine (which fires the timers itself)."""
        deadline = self._deadline  # ``next_deadline`` without its call when known
        if deadline is None:
            deadline = self.next_deadline
        if now >= deadline:
            self.advance(cluster, now)

    def lifetime_tracker(self) -> LifetimeTracker:
        return self

    def take_notices(self) -> list[Notice]:
        """The notices in time order: a VM repredicted twice in one advance (its
        new exit was also due) is reported after VMs due earlier in the batch."""
        notices = self.notices
        if not notices:
            return []
        self.notices = []
        notices.sort(key=lambda notice: notice.time)
        return notices

    def _repredict_overdue(self, now: float, refit: float) -> None:
        """Repredict, each at its own predicted exit, the VMs whose exit is due by ``now``.

        Only those due before the next refit: the refit changes the model.
        Batched, since the VMs do not depend on each other between refits.
        """
        self._deadline = None
        exits = self._exits
        generation = self.slots.generation
        due_times: list[float] = []
        slots: list[int] = []
        while exits and exits[0][0] <= now and exits[0][0] < refit:
            due, slot, gen = heapq.heappop(exits)
            if gen == generation[slot]:
                due_times.append(due)
                slots.append(slot)
        if not slots:
            return
        at = np.asarray(due_times)
        index = np.asarray(slots, dtype=np.int64)
        uptimes = at - self.slots.start[index]
        remaining = np.maximum(
            self.remaining_estimate(self.slots.row[index], uptimes), self.MIN_REMAINING_S
        )
        new_exits = at + remaining
        previous = self.slots.predicted_exit[index].copy()
        self.slots.predicted_exit[index] = new_exits
        self.slots.predicted_at[index] = at
        hosts = self.slots.host[index]
        np.maximum.at(self.hosts.exit, hosts, new_exits)
        if self._all_vms:
            self.hosts.quantiles_exit[hosts] = np.nan
        self.hosts.holder[hosts] = -1  # found again from the hosts' VMs when needed
        self.repredictions += len(index)
        for i, slot in enumerate(slots):
            exit_time = float(new_exits[i])
            if exit_time < refit:  # else the refit repredicts it first
                heapq.heappush(exits, (exit_time, slot, int(generation[slot])))
            self.notices.append(
                Notice(
                    float(at[i]),
                    "vm",
                    self.vm_ids[slot],
                    "outlived its predicted exit: repredicted from its uptime",
                    {
                        "uptime_s": float(uptimes[i]),
                        "predicted_remaining_s": float(remaining[i]),
                        "predicted_exit": exit_time,
                        "previous_exit": float(previous[i]),
                    },
                )
            )

    def _refit(self, now: float) -> None:
        self._deadline = None
        alive = np.flatnonzero(self.slots.alive)
        # Censor only the VMs the model learns from; bring every running VM's
        # distribution row up to date (they are all repredicted below).
        counted = alive[self.slots.learns[alive]]
        running = RunningVMs(
            self.levels[counted], now - self.slots.start[counted], self.slots.row[alive]
        )
        self.model.refit(running, now=now)
        self._forget_predictions()
        self._creation_known.fill(False)
        # The model changed: every host's quantiles are recomputed when next read.
        self.hosts.quantiles_exit.fill(np.nan)
        self._next_refit = now + self.settings.refit_interval_s
        if not self.settings.repredict:
            return
        if len(alive):
            remaining = self.remaining_estimate(
                self.slots.row[alive], now - self.slots.start[alive]
            )
            self.slots.predicted_exit[alive] = now + np.maximum(remaining, self.MIN_REMAINING_S)
            self.slots.predicted_at[alive] = now
            self.repredictions += len(alive)
        # Each host's latest exit and holder (the lowest slot with it), compiled.
        rebuild_host_exits(
            alive, self.slots.times, self.slots.ints, self.hosts.times, self.hosts.ints
        )
        exits = self.slots.predicted_exit[alive]
        generation = self.slots.generation
        # The same tuples as one per slot would give, built column-wise, for
        # the VMs that may outlive their exit before the next refit.
        due = alive[exits < self._next_refit]
        self._exits = list(
            zip(
                self.slots.predicted_exit[due].tolist(),
                due.tolist(),
                generation[due].tolist(),
                strict=True,
            )
        )
        heapq.heapify(self._exits)

    def host_exit_quantiles(self, n_hosts: int) -> FloatArray:
        """Per host, (hosts, H) absolute exit times: H quantiles of the host's remaining life.

        The host's life is taken as that of the VM holding ``host_exit`` (its
        latest predicted exit): the quantiles of its T_r | T_u at the uptime
        its exit was last predicted at, as times. A host without VMs has
        -inf everywhere (the caller clips at now, as for the point exit).
        Recomputed only for hosts whose ``host_exit`` changed since (all of
        them after a refit), so the cost per placement is one comparison.
        """
        tracker, model = self.quantile_refresh(n_hosts)
        # ``kernels.compiled_refresh_host_quantiles``, without numba's type dispatch.
        Direct.refresh_host_quantiles(n_hosts, tracker, model)
        return self.hosts.quantiles[:n_hosts]

    def quantile_refresh(self, n_hosts: int) -> tuple[TrackerArrays, ModelArrays]:
        """The arguments of ``lifetime_scan._refreshed_lifetime_scan`` after the floors'
        epoch: the tracker's packed arrays and host quantiles (all hosts, not
        yet refreshed), then what refreshing them reads.

        For a scan that brings ``host_exit_quantiles`` up to date itself, in
        the same call, and for ``host_exit_quantiles``'s own pass: the hosts
        grown to ``n_hosts`` first.
        """
        # ``grow`` makes no room when there is enough; the test saves its call.
        if n_hosts > self.hosts.times.shape[1]:
            self.hosts.grow(n_hosts)
        if len(self._creation_known) < len(self.model.mass):
            self._grow_creation_quantiles(len(self.model.mass))
        # What refreshing a host's quantiles reads and writes (``kernels._refresh_host``):
        # the same arrays for the scan that refreshes as it goes and for the pass alone.
        model = self.model
        return (
            (
                self.slots.times,
                self.slots.ints,
                self.hosts.times,
                self.hosts.ints,
                self.hosts.quantiles,
            ),
            (
                self._creation_q,
                self._creation_known,
                model.mass,
                model.m0,
                model.bins.edges,
                self._open_lifetime,
                self._host_levels,
                self._all_vms,
            ),
        )

    def _grow_creation_quantiles(self, rows: int) -> None:
        size = max(rows, 2 * len(self._creation_known), 64)
        grown = size - len(self._creation_known)
        self._creation_q = np.concatenate(
            [self._creation_q, np.zeros((grown, self._creation_q.shape[1]))]
        )
        self._creation_known = np.concatenate(
            [self._creation_known, np.zeros(grown, dtype=np.bool_)]
        )

    @property
    def uses_host_quantiles(self) -> bool:
        """Whether LAS costs a host by its remaining-life quantiles (not its point exit)."""
        settings = self.settings
        quantile_scoring = settings.scoring == "quantiles" and not settings.oracle
        return settings.host_quantiles > 0 and quantile_scoring

    def remaining(self, vm_id: str, now: float) -> float:
        """The VM's current predicted remaining lifetime (0 when its exit has passed)."""
        return max(float(self.slots.predicted_exit[self._slot[vm_id]]) - now, 0.0)

    # ----------------------------------------------------------------- hooks

    def on_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: Booking
    ) -> None:
        cached = self._cached
        if cached is not None and cached[0] == record.vm_id and cached[1] == now:
            prediction = cached[2]  # scored a moment ago
        else:
            prediction = self.predict(event)
        slot = self._take_slot()
        host = record.host
        if host >= self.hosts.times.shape[1]:
            self.hosts.grow(host + 1)
        vm_id = record.vm_id
        self._slot[vm_id] = slot
        self.vm_ids[slot] = vm_id
        rows = self.slot_rows[slot] = prediction.rows
        placed_at = record.placed_at
        exit_time = placed_at + prediction.lifetime_s
        # ``initial_lifetime`` of this VM, for LAVA's class without a lookup.
        self.booked_lifetime = exit_time - placed_at
        learns = event is None or not left_truncated(event.features)
        # The slot's and host's arrays, the host's list, latest exits and holder.
        packed = self.slots.packed_with(self.levels, self.hosts)
        generation = Direct.book_slot(
            slot, host, placed_at, prediction.row, rows, exit_time, learns, packed
        )
        if self._all_vms:
            self.hosts.quantiles_exit[host] = np.nan
        # The groups past the bound on groups share an owner row, but are no one batch.
        if learns and self._learns_siblings and rows[0] != self.model.overflow_row(0):
            self._siblings.setdefault(rows[0], set()).add(slot)
        if self._repredicts and exit_time < self._next_refit:
            heapq.heappush(self._exits, (exit_time, slot, generation))
            deadline = self._deadline
            if deadline is not None and exit_time < deadline:
                self._deadline = exit_time  # a new entry only brings the first one earlier

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None:
        slot = self._slot.pop(record.vm_id, None)
        if slot is None:
            return
        rows = self.slot_rows[slot]
        model = self.model
        count = self._counts_plainly
        weight = 1.0
        # (Not when left-truncated: its age is unknown, so is its lifetime.)
        if (not count or model.counts_by_age) and self.slots.flags[LEARNS, slot]:
            lived = max(now - self.slots.times[START, slot], 0.0)
            if count:
                # Forgetting: the weight of the VM's creation, taken (and the
                # counts re-anchored) before the compiled call adds it.
                weight = model.count_weight(now - lived)
            elif exited:
                model.observe_exit(rows, lived, now)
            else:
                # Evicted (host down): it lived at least this long; not an exit.
                model.observe_censored(rows, lived, now)
        # The exit or censoring counted (``count``), the slot freed, the host's
        # latest exits from the VMs left on it: one compiled call.
        if self._all_vms:
            self.hosts.quantiles_exit[self.slots.host[slot]] = np.nan
        packed = self.slots.packed_with(self.levels, self.hosts)
        _, learns = Direct.release_slot(
            slot, now, exited, count, weight, model.deaths, model.censored, model.bins.edges, packed
        )
        if count and learns:
            model.touch(rows)
        cached = self._cached
        if cached is not None and cached[0] == record.vm_id:
            # A running VM's cached prediction must not serve a new VM reusing its id.
            self._cached = None
        heap = self._exits
        if heap and heap[0][1] == slot:
            self._deadline = None  # the first entry went stale: a later one is first
        self._free.append(slot)
        if self._siblings and learns:
            owner = rows[0]
            siblings = self._siblings.get(owner)
            if siblings is not None:
                siblings.discard(slot)
                exits = self._sibling_exits.get(owner, 0) + exited
                if not siblings:
                    del self._siblings[owner]
                    self._sibling_exits.pop(owner, None)
                    return
                self._sibling_exits[owner] = exits
                # At the 1st, 2nd, 4th, 8th... exit: the evidence changes by a
                # factor each time, and a batch of n costs O(n log n)
                # repredictions, not O(n^2) (Azure V1 dev has batches of 587
                # VMs of one shape: 11 million repredictions at every exit).
                if exited and exits & (exits - 1) == 0:
                    self._repredict_siblings(owner, sorted(siblings), now, record.vm_id)

    def _repredict_siblings(self, row: int, slots: list[int], now: float, exited: str) -> None:
        """A sibling exited: recount the owner group now and repredict its running VMs.

        Their exits may move earlier, so each host's latest exit is recomputed
        from its VMs, and their old heap entries are made stale.
        """
        self._deadline = None
        index = np.asarray(slots, dtype=np.int64)
        uptimes = now - self.slots.start[index]
        model = self.model
        model.observe_running(row, uptimes, now)
        # The group may now be the one chosen (tables), or a combo to recompute.
        self.slots.row[index] = [
            model.choose(tuple(levels)) for levels in self.levels[index].tolist()
        ]
        # The model's distributions changed between refits: per-row caches go.
        self._forget_predictions()
        self._creation_known.fill(False)
        remaining = np.maximum(
            self.remaining_estimate(self.slots.row[index], uptimes), self.MIN_REMAINING_S
        )
        new_exits = now + remaining
        self.slots.predicted_exit[index] = new_exits
        self.slots.predicted_at[index] = now
        self.repredictions += len(index)
        self.slots.generation[index] += 1
        generation = self.slots.generation
        hosts = set()
        next_refit = self._next_refit
        for i, slot in enumerate(slots):
            if new_exits[i] < next_refit:
                heapq.heappush(self._exits, (float(new_exits[i]), slot, int(generation[slot])))
            hosts.add(int(self.slots.host[slot]))
            self.notices.append(
                Notice(
                    now,
                    "vm",
                    self.vm_ids[slot],
                    "a sibling exited: repredicted from its owner group",
                    {
                        "uptime_s": float(uptimes[i]),
                        "predicted_remaining_s": float(remaining[i]),
                        "predicted_exit": float(new_exits[i]),
                        "sibling": exited,
                    },
                )
            )
        for host in sorted(hosts):
            members = np.asarray(self.hosts.members(host, self.slots), dtype=np.int64)
            self.hosts.exit[host] = self.slots.predicted_exit[members].max()
            self.hosts.quantiles_exit[host] = np.nan
            self.hosts.holder[host] = -1

    def on_moved(
        self, cluster: ClusterState, before: VmRecord, after: VmRecord, now: float
    ) -> None:
        """The VM keeps its slot, start and predictions; only the host maxima change.

        Its heap entry stays valid (same slot and generation), and a
        reprediction reads ``self.slots.host`` when due, so it lands on the new host.
        """
        slot = self._slot.get(after.vm_id)
        if slot is None:
            return
        new_host = after.host
        self.hosts.grow(new_host + 1)
        if self._all_vms:
            self.hosts.quantiles_exit[[int(self.slots.host[slot]), new_host]] = np.nan
        # Rare: the compiled helpers through numba's dispatch.
        times = self.slots.times
        ints = self.slots.ints
        leave_host(slot, int(ints[HOST, slot]), times, ints, self.hosts.times, self.hosts.ints)
        join_host(
            slot, new_host, float(times[PREDICTED_EXIT, slot]), float(times[INITIAL_EXIT, slot]),
            ints, self.hosts.times, self.hosts.ints,
        )  # fmt: skip

    def check_restored(self) -> None:
        """Refuse (ValueError) restored arrays the compiled kernels could overrun.

        The snapshot codec calls this once per restored tracker.
        """
        check_tracker_state(
            PackedTracker(
                self.slots.times,
                self.slots.ints,
                self.slots.flags,
                self.levels,
                self.hosts.times,
                self.hosts.ints,
                self.hosts.quantiles,
                self.vm_ids,
                self.slot_rows,
                self._free,
                self.model,
            )
        )

    def _take_slot(self) -> int:
        if not self._free:
            size = self.slots.grow()
            self.levels = np.concatenate([self.levels, np.zeros((size, LEVELS), dtype=np.int64)])
            self.vm_ids.extend([""] * size)
            self.slot_rows.extend([()] * size)
            self._free = list(range(2 * size - 1, size - 1, -1))
        return self._free.pop()


class TrackerScorer(NumpyScorer):
    """A scorer that reads the lifetime tracker: the tracker is brought up to date
    (exits, repredictions, refits due by ``request.now``) before ``score_current`` reads
    it, so no scorer can read a state the request's time has already moved past."""

    def __init__(self, tracker: LifetimeTracker) -> None:
        self.tracker = tracker

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        self.tracker.refresh(cluster, request.now)
        self.score_current(cluster, request, out)

    def score_current(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray
    ) -> None:
        raise NotImplementedError


class LasTemporalCost(TrackerScorer):
    """LAS: bucketed dT between the VM's predicted exit and the host's repredicted exit.

    ``tolerance``: hosts whose cost is within this many buckets per (VM
    quantile, host quantile) pair of the least tie with it, so Best Fit
    decides among them. A learned distribution spreads its quantiles over
    days, and between hosts a few buckets' difference in their sum is
    within what the prediction cannot tell; ranking on it alone packs by
    noise and strands capacity (``docs/results/placement-matrix.md``).
    """

    name = "las"

    def __init__(self, tracker: LifetimeTracker, tolerance: float = 0.0) -> None:
        if not (math.isfinite(tolerance) and tolerance >= 0.0):
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        super().__init__(tracker)
        self.tie_tolerance = tolerance * self.pairs

    @property
    def pairs(self) -> int:
        """The bucket indices a host's cost sums: a tolerance in buckets per pair
        times this is the tie width in the cost's own units."""
        tracker = self.tracker
        settings = tracker.settings
        # One per pair: a point has one, quantile scoring Q per host exit, by H
        # host quantiles or the point exit.
        vm_points = settings.quantiles if settings.scoring == "quantiles" else 1
        if settings.oracle:
            vm_points = 1
        host_points = settings.host_quantiles if tracker.uses_host_quantiles else 1
        return vm_points * host_points

    def score_current(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray
    ) -> None:
        tracker = self.tracker
        now = request.now
        prediction = tracker.prediction_for(request)
        host_exit = tracker.hosts.exits(cluster.n_hosts, now, repredict=True)
        if prediction.thresholds is not None and tracker.uses_host_quantiles:
            # The sum over the host's quantiles, in the compiled scan's order.
            host_q = np.maximum(tracker.host_exit_quantiles(cluster.n_hosts), now) - now
            total = np.zeros(cluster.n_hosts)
            for j in range(host_q.shape[1]):
                total += expected_cost_counts(prediction.thresholds, host_q[:, j])
            out[:] = total
        elif prediction.thresholds is not None:
            out[:] = expected_cost_counts(prediction.thresholds, host_exit - now)
        else:
            # An infinite (oracle) lifetime on a host with an infinite exit is
            # NaN, which searchsorted puts in the last bucket: the most costly.
            with np.errstate(invalid="ignore"):
                out[:] = temporal_cost(now + prediction.lifetime_s - host_exit)


class LaBinaryClass(TrackerScorer):
    """LA-Binary: same class (short/long at 2 h, initial predictions) first, empty hosts last.

    The model learns as for LAS; only the initial predictions are used.
    """

    name = "la_binary"

    def score_current(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray
    ) -> None:
        tracker = self.tracker
        now = request.now
        lifetime = tracker.prediction_for(request).lifetime_s
        n = cluster.n_hosts
        remaining = tracker.hosts.exits(n, now, repredict=False) - now
        host_long = remaining > LA_BINARY_CUTOFF_S
        vm_long = lifetime > LA_BINARY_CUTOFF_S
        out[:] = np.where(host_long == vm_long, 0.0, 1.0)
        empty = cluster.vm_count[:n] == 0
        out[empty] = 2.0
