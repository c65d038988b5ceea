"""LAVA (LAVA paper, section 4.3): lifetime classes and host states, adapting to mispredictions.

Lifetime classes by predicted lifetime: 0 is < 1 h, 1 is 1-10 h, 2 is
10-100 h, 3 is 100-1000 h, 4 is longer. Each host is empty, open or
recycling, and a non-empty host has a class:

* A VM placed on an empty host opens it with the VM's class.
* An open host whose CPU or memory is over 90% booked starts recycling; the
  VMs on it at that moment are its *residual* VMs. (Not on the booking of a
  VM of unknown age: see below.)
* When the last residual VM of a recycling host exits, the host's class goes
  down one (its remaining VMs were placed as shorter-lived) and the
  remaining VMs become the residual ones.
* Each host has a deadline, set whenever its class is set:
  ``deadline_factor`` times the class's upper bound from then (lavad's
  default 1.0, the bound itself; see below). A host still not empty at its
  deadline was underpredicted: its class goes up one, its VMs become
  residual, and a new deadline is set. The top class has none.
* An empty host has no class and no deadline.
* A live-migrated VM leaves its old host as if it exited and arrives on
  the new one as a new VM would, with the class of its repredicted
  remaining lifetime.

Preference, first to last (``LavaPreference``, the cost one level above LAS,
which is above Best Fit): recycling hosts of a higher class than the VM's,
the closest class first (cost 0 for one class above, up to 3); open hosts of
the VM's class (4); any other non-empty host (5); empty hosts (6).

Where this differs from the paper: the paper's deadline is "a time-out per
host" without its length, next to its bound on a correctly predicted host
(it does not outlive 1.1 times its class). lavad's default time-out is the
class's bound itself (``deadline_factor`` 1.0): on the placement matrix
1.0 raised LAVA's worst cell on OpenB (from 0.18 pp of empty hosts below
Best Fit to 0.08) and its worst tail share of the oracle's gain, without a
loss in any worst cell of seeds 0-2. On seeds 3-5, which chose nothing,
OpenB's and the tail's gains held but the least Azure share fell (15%
against 18%, from one seed of one cell; 20.0% against 20.7% over seeds
0-5), so that part of its case rests on the seeds it was chosen on
(docs/results/placement-matrix.md, "The deadline").
The VM's class comes from E[T] at
creation (the paper names the class of "lifetime predictions"); a VM placed
on an open host of another class (the "any non-empty host" case) does not
change the host's class. The LAS level below the preference scores with
distributions on both sides (32 quantiles of the VM's lifetime, 8 of the
host's remaining life), where the paper compares two point predictions.

Where we differ from the paper, by default: ``class_confidence`` (0.3;
0 is the paper's rule). The preference orders hosts by the VM's class only
where the VM's learned distribution gives that class (the class of E[T])
at least this probability (the share of its lifetime quantiles inside the
class's bounds, ``class_probability``). A VM below the bar prefers every
non-empty host alike, then empty hosts, and LAS decides among them; it
still opens an empty host with its class, and recycling and deadlines are
the paper's. The paper's model predicts a class; ours predicts a
distribution, and E[T]'s class is most often not the likely one: 78% of
the Azure V1 dev split's placements fall below 0.3, and 13% of those VMs
live within that class (84% are shorter); on OpenB 34%, and 8% (91%
shorter). Over the placement matrix's seeds 0-5, 0.3 gained more empty
hosts than 0 in 29 of its 30 Azure conditions (27 of 30 on seeds 3-5,
which chose nothing), brought 14 of the 15 tail conditions to half the
oracle's gain (against 11), and gained on DLRM. On OpenB one replay of the
whole trace loses 0.28-0.35 pp more than the paper's rule, but that trace's
seeds only draw ties, so one replay is one draw: with a seeded 95% of its
pods per seed, 0.3 gained 0.14-0.16 pp over the paper's rule on average.
An oracle is sure of every class and places as the paper's
(docs/results/placement-matrix.md, "How sure a class must be").

Learned LAVA trails learned LAS on Azure V1 while their oracles are level
(docs/results/lifetimes.md): its classes amplify a lifetime prediction's
errors, which LAS's quantile costs average out. A longer deadline or an
earlier recycling did not win on both seeds measured, so the paper's 90%
stays. The class comes from E[T], which a heavy tail inflates; the
median instead (``estimate = "median"``) lost in every cell it was tried
on (docs/results/placement-matrix.md). Recycling is most of LAVA's gain on
Azure and most of its loss on DLRM, where nearly every VM is of a class
with almost none above it (the same page): no threshold suits both, so the
paper's 90% stays. Nor does a rule on the request mix by class: Azure's
mix is at times as concentrated in one class as DLRM's.

Where we differ from the paper, for VMs of unknown age: the booking of a
VM that existed before the recording (or before the daemon took the fleet
over; ``features.left_truncated``) does not start a host's recycling; the
next booking of a VM of known age on a host still over the threshold does.
A class is a lifetime predicted from creation, and for such a VM creation
was an unknown time ago, so its class is no guide to when it leaves; and
such VMs come in one burst (the fleet as it stood), where recycling on
their arrival makes the rest of the burst pass the fuller hosts of their
own class by and open new ones. On DLRM (30% of its instances pre-exist)
this takes LAVA from -0.78..-0.90 pp of empty hosts against Best Fit to
-0.31..-0.36, and its oracle from -0.54..-0.60 to +0.13..+0.17; traces
without such VMs place as before (docs/results/placement-matrix.md, "VMs
of unknown age").
"""

from __future__ import annotations

import bisect
import heapq
from enum import IntEnum
from typing import Final

import numpy as np

from lavad.core.cluster import ClusterState, FloatArray, VmRecord
from lavad.core.placement.framework import (
    Booking,
    ClusterListener,
    Notice,
    PlacementRequest,
    StackedScorer,
)
from lavad.core.placement.kernels import Direct
from lavad.core.placement.lifetime import LifetimeTracker, Prediction
from lavad.models.lifetime.features import left_truncated

HOUR = 3600.0
# Upper bounds of classes 0..3; class 4 is everything longer.
CLASS_BOUNDS_S: FloatArray = np.array([1.0, 10.0, 100.0, 1000.0]) * HOUR
TOP_CLASS = len(CLASS_BOUNDS_S)
# The bounds as Python floats: ``lifetime_class`` runs on every booking and
# placement, and numpy's searchsorted on one number costs a microsecond.
_CLASS_BOUNDS: Final = CLASS_BOUNDS_S.tolist()
CLASS_NAMES = ("<1h", "1-10h", "10-100h", "100-1000h", ">=1000h")
NO_CLASS = -1


class HostPhase(IntEnum):
    EMPTY = 0
    OPEN = 1
    RECYCLING = 2


# The phases as plain ints for the per-event paths: comparing a numpy int8
# with an IntEnum member goes through Python 3.11's EnumType.__getattr__, a
# dozen lookups per event on LAVA's hottest path.
_EMPTY: Final = int(HostPhase.EMPTY)
_OPEN: Final = int(HostPhase.OPEN)
_RECYCLING: Final = int(HostPhase.RECYCLING)
# A phase's name in notices, by its int (``HostPhase(p).name`` costs an enum lookup).
_PHASE_NAMES: Final = tuple(phase.name.lower() for phase in HostPhase)


def lifetime_class(lifetime_s: float) -> int:
    """0 below 1 h, 1 from 1 h to 10 h, ..., 4 from 1000 h on."""
    # searchsorted(side="right") on the bounds; NaN lands past them in both.
    return bisect.bisect_right(_CLASS_BOUNDS, lifetime_s)


def class_probability(quantiles: FloatArray, klass: int) -> float:
    """The share of ``quantiles`` (ascending, equally likely) inside class ``klass``'s bounds:
    how sure the VM's lifetime distribution is of that class."""
    count = len(quantiles)
    if count == 0:
        return 0.0
    # As ``lifetime_class`` bins a lifetime: a bound belongs to the class above
    # it, and the top class has no upper bound (an infinite quantile is in it).
    below = bisect.bisect_left(quantiles, _CLASS_BOUNDS[klass - 1]) if klass > 0 else 0
    upto = bisect.bisect_left(quantiles, _CLASS_BOUNDS[klass]) if klass < TOP_CLASS else count
    return (upto - below) / count


def preference_cost(
    phase: np.ndarray, host_class: np.ndarray, empty: np.ndarray, vm_class: int, out: FloatArray
) -> None:
    """The section 4.3 order as a cost per host (lower is preferred); see the module doc.

    A VM without a class (``NO_CLASS``) prefers any non-empty host alike, then empty ones."""
    out.fill(5.0)
    if vm_class == NO_CLASS:
        out[empty] = 6.0
        return
    recycling_above = (phase == _RECYCLING) & (host_class > vm_class)
    np.copyto(out, (host_class - vm_class - 1).astype(np.float64), where=recycling_above)
    out[(phase == _OPEN) & (host_class == vm_class)] = 4.0
    out[empty] = 6.0


class LavaHosts(ClusterListener):
    """Per-host LAVA state (phase, class, deadline, residual VMs): a policy's hooks.

    Wraps the ``LifetimeTracker``, which predicts and repredicts the VMs
    (LAS, the tie-breaker, reads it too).
    """

    def __init__(
        self, tracker: LifetimeTracker, *, recycle_above: float, deadline_factor: float
    ) -> None:
        if not 0.0 < recycle_above <= 1.0:
            raise ValueError(f"recycle_above must be in (0, 1], got {recycle_above}")
        if deadline_factor < 1.0:
            raise ValueError(f"deadline_factor must be >= 1, got {deadline_factor}")
        self.tracker = tracker
        self.recycle_above = recycle_above
        self.deadline_factor = deadline_factor
        self.phase = np.zeros(0, dtype=np.int8)
        self.host_class = np.zeros(0, dtype=np.int8)
        self.deadline: FloatArray = np.zeros(0)
        self.residual: dict[int, set[str]] = {}
        self.vm_class: dict[str, int] = {}
        # (deadline, host, generation): a host's entries go stale when its deadline moves.
        self._deadlines: list[tuple[float, int, int]] = []
        self._generation = np.zeros(0, dtype=np.int64)
        # ``_first_deadline`` as last computed (None: to recompute).
        self._first: float | None = None
        self.notices: list[Notice] = []

    # ----------------------------------------------------------------- state

    def _grow(self, n_hosts: int) -> None:
        if n_hosts <= len(self.phase):
            return
        size = max(n_hosts, 2 * len(self.phase), 64)
        extra = size - len(self.phase)
        self.phase = np.concatenate([self.phase, np.zeros(extra, dtype=np.int8)])
        self.host_class = np.concatenate([self.host_class, np.full(extra, NO_CLASS, dtype=np.int8)])
        self.deadline = np.concatenate([self.deadline, np.full(extra, np.inf)])
        self._generation = np.concatenate([self._generation, np.zeros(extra, dtype=np.int64)])

    def _set_class(self, host: int, new_class: int, now: float) -> None:
        self.host_class[host] = new_class
        self._generation[host] += 1
        deadlines = self._deadlines
        if deadlines and deadlines[0][1] == host:
            self._first = None  # the first entry went stale
        if new_class == NO_CLASS or new_class >= TOP_CLASS:
            self.deadline[host] = np.inf
            return
        deadline = now + self.deadline_factor * float(CLASS_BOUNDS_S[new_class])
        self.deadline[host] = deadline
        heapq.heappush(deadlines, (deadline, host, int(self._generation[host])))
        first = self._first
        if first is not None and deadline < first:
            self._first = deadline

    def _report(
        self, cluster: ClusterState, host: int, now: float, reason: str, before: tuple[int, int]
    ) -> None:
        phase, klass = int(self.phase[host]), int(self.host_class[host])
        self.notices.append(
            Notice(
                now,
                "host",
                cluster.host_ids[host],
                reason,
                {
                    "state": _PHASE_NAMES[phase],
                    "lifetime_class": CLASS_NAMES[klass] if klass != NO_CLASS else None,
                    "previous_state": _PHASE_NAMES[before[0]],
                    "previous_class": CLASS_NAMES[before[1]] if before[1] != NO_CLASS else None,
                    "deadline": float(self.deadline[host]),
                    "residual_vms": len(self.residual.get(host, ())),
                },
            )
        )

    def _over_threshold(self, cluster: ClusterState, host: int) -> bool:
        """CPU or memory booked above ``recycle_above`` of the host's capacity."""
        # ``kernels._over_threshold`` without numba's type dispatch: two numpy
        # reads and three operations per resource cost more in Python.
        over: bool = Direct.over_threshold(cluster.capacity, cluster.free, host, self.recycle_above)
        return over

    # ----------------------------------------------------------------- hooks

    def on_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: Booking
    ) -> None:
        tracker = self.tracker
        tracker.on_booked(cluster, record, now, event)
        klass = lifetime_class(tracker.booked_lifetime)
        self.vm_class[record.vm_id] = klass
        age_known = event is None or not left_truncated(event.features)
        self._vm_arrived(cluster, record.host, klass, now, may_recycle=age_known)

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None:
        self.tracker.on_released(cluster, record, now, exited=exited)
        self.vm_class.pop(record.vm_id, None)
        self._vm_left(cluster, record.host, record.vm_id, now, how="exited")

    def on_moved(
        self, cluster: ClusterState, before: VmRecord, after: VmRecord, now: float
    ) -> None:
        """The old host sees the VM leave and the new one a VM arrive.

        On arrival the VM's class is that of its repredicted *remaining*
        lifetime (a 50 h VM moved after 45 h is a 1-10h VM now), as the
        paper's migration uses repredictions.
        """
        tracker = self.tracker
        tracker.on_moved(cluster, before, after, now)
        if after.vm_id not in self.vm_class:
            return  # never booked through these hooks: no class to carry
        self._vm_left(cluster, before.host, before.vm_id, now, how="migrated away")
        klass = lifetime_class(tracker.remaining(after.vm_id, now))
        self.vm_class[after.vm_id] = klass
        self._vm_arrived(cluster, after.host, klass, now)

    def _vm_arrived(
        self, cluster: ClusterState, host: int, klass: int, now: float, *, may_recycle: bool = True
    ) -> None:
        """An empty host opens with the VM's class; an open host over the threshold recycles
        (unless ``may_recycle`` is False: a VM of unknown age, see the module doc)."""
        self._grow(host + 1)
        # The state before is read only when there is a change to report.
        phase = int(self.phase[host])
        if phase == _EMPTY:
            before = (phase, int(self.host_class[host]))
            phase = self.phase[host] = _OPEN
            self._set_class(host, klass, now)
            self._report(cluster, host, now, "opened with the class of its first VM", before)
        if phase == _OPEN and may_recycle and self._over_threshold(cluster, host):
            before = (phase, int(self.host_class[host]))
            self.phase[host] = _RECYCLING
            self.residual[host] = set(cluster.host_vms[host])
            self._report(
                cluster,
                host,
                now,
                f"over {self.recycle_above:.0%} of CPU or memory: recycling, its VMs residual",
                before,
            )

    def _vm_left(self, cluster: ClusterState, host: int, vm_id: str, now: float, how: str) -> None:
        """The host empties, or its class goes down when its last residual VM has gone."""
        if host >= len(self.phase):
            return
        residual = self.residual.get(host)
        was_residual = residual is not None and vm_id in residual
        if residual is not None:
            residual.discard(vm_id)
        if not cluster.host_vms[host]:
            before = (int(self.phase[host]), int(self.host_class[host]))
            self.phase[host] = _EMPTY
            self.residual.pop(host, None)
            self._set_class(host, NO_CLASS, now)
            self._report(cluster, host, now, "empty", before)
        elif was_residual and not residual and self.phase[host] == _RECYCLING:
            before = (_RECYCLING, int(self.host_class[host]))
            self._set_class(host, max(int(self.host_class[host]) - 1, 0), now)
            self.residual[host] = set(cluster.host_vms[host])
            self._report(
                cluster,
                host,
                now,
                f"its last residual VM {how}: class down, VMs residual",
                before,
            )

    # ---------------------------------------------------------------- timers

    def _first_deadline(self) -> float:
        first = self._first
        if first is not None:
            return first
        deadlines = self._deadlines
        generation = self._generation
        while deadlines and deadlines[0][2] != generation[deadlines[0][1]]:
            heapq.heappop(deadlines)
        first = self._first = deadlines[0][0] if deadlines else float("inf")
        return first

    @property
    def next_deadline(self) -> float:
        # Read on every event, several times: both parts are cached until their heaps change.
        first = self._first
        if first is None:
            first = self._first_deadline()
        tracker_deadline = self.tracker._deadline
        if tracker_deadline is None:
            tracker_deadline = self.tracker.next_deadline
        return first if first < tracker_deadline else tracker_deadline

    def advance(self, cluster: ClusterState, now: float) -> None:
        """VM repredictions and host deadlines due by ``now``, notices in time order.

        The two do not read each other's state, so they run one after the
        other; the notices are merged by time.
        """
        tracker = self.tracker
        tracker.advance(cluster, now)
        while self._first_deadline() <= now:
            due, host, _ = heapq.heappop(self._deadlines)
            self._first = None
            before = (int(self.phase[host]), int(self.host_class[host]))
            self._set_class(host, min(before[1] + 1, TOP_CLASS), due)
            self.residual[host] = set(cluster.host_vms[host])
            self._report(
                cluster,
                host,
                due,
                "deadline passed (underpredicted): class up, VMs residual",
                before,
            )
        if tracker.notices:
            self.notices.extend(tracker.notices)
            tracker.notices.clear()
            self.notices.sort(key=lambda notice: notice.time)

    def lifetime_tracker(self) -> LifetimeTracker:
        return self.tracker

    def take_notices(self) -> list[Notice]:
        notices = self.notices
        if not notices and not self.tracker.notices:
            return []
        if self.tracker.notices:
            notices.extend(self.tracker.notices)
            self.tracker.notices.clear()
        self.notices = []
        notices.sort(key=lambda notice: notice.time)
        return notices


class LavaPreference(StackedScorer):
    """LAVA's host preference by lifetime class and state (the level above LAS)."""

    name = "lava"

    def __init__(self, hosts: LavaHosts, class_confidence: float = 0.0) -> None:
        if not 0.0 <= class_confidence <= 1.0:
            raise ValueError(f"class_confidence must be in [0, 1], got {class_confidence}")
        self.hosts = hosts
        self.class_confidence = class_confidence
        # The last prediction's class for the preference: a batch's VMs share
        # one memoised prediction, so most placements reuse it. Held, so that
        # the identity test cannot match a new object at a freed address.
        self._last: tuple[Prediction | None, int] = (None, NO_CLASS)

    def preferred_class(self, prediction: Prediction) -> int:
        """The VM's class for the preference: that of its predicted lifetime, or
        ``NO_CLASS`` where its distribution gives that class less than
        ``class_confidence`` (``class_probability``)."""
        last, klass = self._last
        if prediction is last:
            return klass
        klass = lifetime_class(prediction.lifetime_s)
        quantiles = prediction.quantiles
        if (
            self.class_confidence > 0.0
            and quantiles is not None
            and class_probability(quantiles, klass) < self.class_confidence
        ):
            klass = NO_CLASS
        self._last = (prediction, klass)
        return klass

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        self._score(cluster, request, out, False, out)

    def score_onto(
        self, cluster: ClusterState, request: PlacementRequest, base: FloatArray, out: FloatArray
    ) -> None:
        self._score(cluster, request, base, True, out)

    def _score(
        self,
        cluster: ClusterState,
        request: PlacementRequest,
        base: FloatArray,
        on_base: bool,
        out: FloatArray,
    ) -> None:
        hosts = self.hosts
        now = request.now
        if now >= hosts.next_deadline:
            hosts.advance(cluster, now)
        n = cluster.n_hosts
        hosts._grow(n)
        vm_class = self.preferred_class(hosts.tracker.prediction_for(request))
        # ``preference_cost`` compiled: the same costs without six numpy passes.
        # (``kernels.compiled_lava_preference`` without numba's type dispatch.)
        Direct.lava_preference(
            hosts.phase, hosts.host_class, cluster.vm_count, n, vm_class, base, on_base, out
        )
