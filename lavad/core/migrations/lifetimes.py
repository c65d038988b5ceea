"""Where a queued VM's predicted remaining lifetime comes from.

* ``PolicyLifetimes``: the placement policy's tracker (LAS, LAVA,
  LA-Binary): the same repredictions that placed the VM order its migration.
* ``OwnLifetimes``: a tracker of the planner's own, fed the same bookings,
  for policies that keep no lifetimes (Best Fit, GPA).
* ``OracleLifetimes``: each VM's true exit, attached to its request by the
  replay (``streams/oracle.py``): the paper's section 6.3 setting.
* ``NoLifetimes``: no predictions (Best Fit with only host.drain events, where
  a model of its own would cost every replay for drains that may never
  come): every VM ties, so the queue goes in arrival order, and the
  published plans say "lifetimes": "none".
"""

from __future__ import annotations

from typing import Protocol

from lavad.core.cluster import ClusterState, VmRecord
from lavad.core.placement.framework import Booking, ClusterListener, PredictedLifetimes
from lavad.core.placement.lifetime import LifetimeSettings, LifetimeTracker, OracleMissing
from lavad.core.registry import Entry, Registry
from lavad.models.lifetime.features import ORACLE_FEATURE


class RemainingLifetimes(Protocol):
    name: str
    # False: ``remaining`` is 0 for every VM (no predictions to order by).
    known: bool
    # Whether it learns from bookings (the planner calls the hooks below only then).
    fed: bool

    def remaining(self, cluster: ClusterState, vm_id: str, now: float) -> float:
        """The VM's predicted remaining lifetime at ``now`` (0 when overdue)."""

    def on_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: Booking
    ) -> None: ...

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None: ...

    def on_moved(
        self, cluster: ClusterState, before: VmRecord, after: VmRecord, now: float
    ) -> None: ...


def policy_tracker(hooks: ClusterListener) -> PredictedLifetimes | None:
    """The lifetime tracker a policy keeps, if it keeps one."""
    return hooks.lifetime_tracker()


class PolicyLifetimes(ClusterListener):
    """The placement policy's predictions; the engine already feeds its hooks."""

    name = "policy"
    known = True
    fed = False  # the engine feeds the policy's hooks

    def __init__(self, tracker: PredictedLifetimes) -> None:
        self.tracker = tracker

    def remaining(self, cluster: ClusterState, vm_id: str, now: float) -> float:
        self.tracker.refresh(cluster, now)
        return self.tracker.remaining(vm_id, now)


class OwnLifetimes(ClusterListener):
    """A lifetime model of the planner's own (the policy keeps none).

    Its repredictions are not published: they are the planner's, not a
    placement policy's view of the pool.
    """

    name = "model"
    known = True
    fed = True

    def __init__(self, settings: LifetimeSettings | None = None) -> None:
        self.tracker = LifetimeTracker(settings or LifetimeSettings())

    def remaining(self, cluster: ClusterState, vm_id: str, now: float) -> float:
        tracker = self.tracker
        tracker.refresh(cluster, now)
        tracker.notices.clear()
        return tracker.remaining(vm_id, now)

    def on_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: Booking
    ) -> None:
        tracker = self.tracker
        # Due refits and repredictions first, as a policy's hooks would have.
        tracker.refresh(cluster, now)
        tracker.notices.clear()
        tracker.on_booked(cluster, record, now, event)

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None:
        self.tracker.on_released(cluster, record, now, exited=exited)

    def on_moved(
        self, cluster: ClusterState, before: VmRecord, after: VmRecord, now: float
    ) -> None:
        self.tracker.on_moved(cluster, before, after, now)


class OracleLifetimes(ClusterListener):
    """True exits: start + the true lifetime the replay attached to the request."""

    name = "oracle"
    known = True
    fed = True

    def __init__(self) -> None:
        self.exit_at: dict[str, float] = {}

    def remaining(self, cluster: ClusterState, vm_id: str, now: float) -> float:
        return max(self.exit_at[vm_id] - now, 0.0)

    def on_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: Booking
    ) -> None:
        value = None if event is None else event.features.get(ORACLE_FEATURE)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise OracleMissing(
                f"oracle migration lifetimes need each request's true lifetime in features"
                f"[{ORACLE_FEATURE!r}] (attached by `lavad replay`), got {value!r}"
            )
        self.exit_at[record.vm_id] = record.placed_at + float(value)

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None:
        self.exit_at.pop(record.vm_id, None)


class NoLifetimes(ClusterListener):
    name = "none"
    known = False
    fed = False

    def remaining(self, cluster: ClusterState, vm_id: str, now: float) -> float:
        return 0.0


def _policy_or(
    fallback: RemainingLifetimes, tracker: PredictedLifetimes | None
) -> RemainingLifetimes:
    return fallback if tracker is None else PolicyLifetimes(tracker)


# Where a planner's (or a compared order's) remaining lifetimes come from. A
# factory gets the policy's tracker (None under Best Fit, First Fit, GPA) and
# whether the pool drains by itself (defragmentation, rolling maintenance).
LIFETIME_SOURCES: Registry[RemainingLifetimes] = Registry(
    "lifetime source",
    [
        Entry(
            "policy",
            "the placement policy's (re)predictions; without them, a model of the planner's"
            " own when the pool drains by itself, else none",
            lambda _args, tracker, drains: _policy_or(
                OwnLifetimes() if drains else NoLifetimes(), tracker
            ),
        ),
        Entry(
            "model",
            "always a model: the placement policy's, or the planner's own",
            lambda _args, tracker, _drains: _policy_or(OwnLifetimes(), tracker),
        ),
        Entry(
            "oracle",
            "true lifetimes attached by `lavad replay` (replays only)",
            lambda _args, _tracker, _drains: OracleLifetimes(),
        ),
    ],
)
