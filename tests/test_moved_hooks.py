"""Policy hooks hearing a live migration (``on_moved``), worked out by hand.

A moved VM is neither an exit nor a new VM: its start time, history and
predictions carry over, and only the per-host state moves. The lifetime
trackers run in oracle mode so that each VM's predicted lifetime is the one
the test writes in its request.
"""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import PlacementRequest
from lavad.core.placement.gpa import UsageHooks
from lavad.core.placement.lava import NO_CLASS, HostPhase, LavaHosts, LavaPreference
from lavad.core.placement.lifetime import LifetimeSettings, LifetimeTracker
from lavad.models.lifetime.features import LEVELS, ORACLE_FEATURE
from lavad.models.usage.hosts import HostUsage, UsagePrior
from lavad.models.usage.moments import CPU, UsageMoments
from lavad.streams.schema import UsageSample, UsageStats, VmRequest

HOUR = 3600.0


class _Pool:
    """16-core, 64 GiB hosts and one policy's hooks driven by hand, as the engine would."""

    def __init__(self, hosts: int) -> None:
        self.cluster = ClusterState()
        for h in range(hosts):
            self.cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
        self.tracker = LifetimeTracker(LifetimeSettings(oracle=True))
        # The paper's 90% and 1.1 x the class bound, which the times worked out
        # by hand below use (lavad's default deadline is the bound itself).
        self.lava = LavaHosts(self.tracker, recycle_above=0.9, deadline_factor=1.1)

    def book(self, vm_id: str, host: int, cores: float, lifetime_h: float, now: float) -> None:
        event = VmRequest(
            time=now,
            pool="p",
            vm_id=vm_id,
            cores=cores,
            memory_gib=4.0,
            features={ORACLE_FEATURE: lifetime_h * HOUR},
        )
        record = self.cluster.book(vm_id, host, (cores, 4.0, 0.0, 0.0), "", now)
        self.lava.on_booked(self.cluster, record, now, event)

    def exit(self, vm_id: str, now: float) -> None:
        record = self.cluster.release(vm_id)
        self.lava.on_released(self.cluster, record, now, exited=True)

    def move(self, vm_id: str, target: int, now: float) -> None:
        # The engine's sequence: release, book keeping placed_at, then the hook.
        before = self.cluster.release(vm_id)
        after = self.cluster.book(vm_id, target, before.demand, before.deployment, before.placed_at)
        self.lava.on_moved(self.cluster, before, after, now)

    def request(self, vm_id: str, now: float) -> PlacementRequest:
        """What the engine asks the policy for a running VM's target (no event)."""
        record = self.cluster.vms[vm_id]
        return PlacementRequest(vm_id, record.demand, record.deployment, None, now, None)

    def state(self, host: int) -> tuple[HostPhase, int, float]:
        lava = self.lava
        return (
            HostPhase(int(lava.phase[host])),
            int(lava.host_class[host]),
            float(lava.deadline[host]),
        )


# ------------------------------------------------------------------ tracker


def test_tracker_moves_the_host_exits_and_keeps_the_vm_history() -> None:
    pool = _Pool(hosts=2)
    tracker = pool.tracker
    pool.book("short", 0, 2.0, lifetime_h=3.0, now=0.0)
    pool.book("long", 0, 2.0, lifetime_h=20.0, now=0.0)
    assert tracker.hosts.exit[0] == 20 * HOUR
    # Asked before the move, while still on host 0: 20 h - 2 h = 18 h remain.
    assert tracker.prediction_for(pool.request("long", 2 * HOUR)).lifetime_s == 18 * HOUR
    pool.move("long", 1, now=2 * HOUR)
    # Host 0 keeps only "short" (exit 3 h); host 1 gets "long"'s 20 h, by
    # the current and the initial predictions alike.
    assert tracker.hosts.exit[:2].tolist() == [3 * HOUR, 20 * HOUR]
    assert tracker.hosts.initial_exit[:2].tolist() == [3 * HOUR, 20 * HOUR]
    slot = tracker._slot["long"]
    assert int(tracker.slots.host[slot]) == 1
    assert tracker.hosts.on_host(tracker.slots)[0] == {tracker._slot["short"]}
    assert tracker.hosts.on_host(tracker.slots)[1] == {slot}
    # Its uptime carries over: started at 0, not at the move.
    assert float(tracker.slots.start[slot]) == 0.0
    long = tracker._slot["long"]
    assert tracker.slots.initial_exit[long] - tracker.slots.start[long] == 20 * HOUR
    # Neither an exit nor a censoring: the model has seen nothing.
    assert tracker.model.deaths.sum() == 0.0
    assert tracker.model.censored.sum() == 0.0
    # At 5 h its repredicted remaining lifetime is 20 h - 5 h = 15 h (not a
    # stale 18 h from the cache of the 2 h request).
    assert tracker.prediction_for(pool.request("long", 5 * HOUR)).lifetime_s == 15 * HOUR


def test_tracker_prediction_of_a_running_vm_is_its_remaining_lifetime() -> None:
    pool = _Pool(hosts=1)
    tracker = pool.tracker
    pool.book("a", 0, 2.0, lifetime_h=10.0, now=HOUR)
    slot = tracker._slot["a"]
    prediction = tracker.prediction_for(pool.request("a", 4 * HOUR))
    # Exit at 1 h + 10 h = 11 h; at 4 h, 7 h remain; rows as booked.
    assert prediction.lifetime_s == 7 * HOUR
    assert prediction.row == int(tracker.slots.row[slot])
    assert prediction.rows == tuple(int(r) for r in tracker.levels[slot])
    assert len(prediction.rows) == LEVELS
    # Past its exit: floored, so a migration never sees a VM "ending now".
    late = tracker.prediction_for(pool.request("a", 12 * HOUR))
    assert late.lifetime_s == LifetimeTracker.MIN_REMAINING_S
    # A new VM (not tracked) is predicted from its request, as before.
    event = VmRequest(
        time=12 * HOUR,
        pool="p",
        vm_id="b",
        cores=1.0,
        memory_gib=1.0,
        features={ORACLE_FEATURE: 2 * HOUR},
    )
    request = PlacementRequest("b", (1.0, 1.0, 0.0, 0.0), "", None, 12 * HOUR, event)
    assert tracker.prediction_for(request).lifetime_s == 2 * HOUR


def test_tracker_exit_after_a_move_counts_the_whole_lifetime_on_the_new_host() -> None:
    pool = _Pool(hosts=2)
    tracker = pool.tracker
    pool.book("a", 0, 2.0, lifetime_h=20.0, now=0.0)
    pool.move("a", 1, now=5 * HOUR)
    pool.exit("a", now=20 * HOUR)
    # Host 1 is empty again; the model saw one exit per level, at 20 h
    # (start 0 carried over), not 15 h since the move.
    assert tracker.hosts.exit[:2].tolist() == [-np.inf, -np.inf]
    column = int(tracker.model.bins.index(np.array([20 * HOUR]))[0])
    assert tracker.model.deaths[:, column].sum() == LEVELS
    assert tracker.model.deaths.sum() == LEVELS


def test_tracker_ignores_a_vm_it_does_not_track() -> None:
    pool = _Pool(hosts=2)
    tracker = pool.tracker
    pool.book("a", 0, 2.0, lifetime_h=3.0, now=0.0)
    before = pool.cluster.book("stranger", 0, (1.0, 1.0, 0.0, 0.0), "", 0.0)
    pool.cluster.release("stranger")
    after = pool.cluster.book("stranger", 1, (1.0, 1.0, 0.0, 0.0), "", 0.0)
    tracker.on_moved(pool.cluster, before, after, HOUR)
    assert tracker.hosts.exit[:2].tolist() == [3 * HOUR, -np.inf]
    assert 1 not in tracker.hosts.on_host(tracker.slots)


# --------------------------------------------------------------------- LAVA


def test_lava_moving_the_only_vm_empties_its_host_and_opens_the_target_by_remaining() -> None:
    pool = _Pool(hosts=2)
    pool.book("a", 0, 2.0, lifetime_h=50.0, now=0.0)  # opens host 0 with class 2 (10-100h)
    pool.lava.take_notices()
    pool.move("a", 1, now=45 * HOUR)
    # Host 0: empty, no class, no deadline.
    assert pool.state(0) == (HostPhase.EMPTY, NO_CLASS, float("inf"))
    # Host 1: 50 h - 45 h = 5 h remain, class 1 (1-10h), not its creation
    # class 2; deadline 45 h + 1.1 x 10 h = 56 h.
    assert pool.state(1)[:2] == (HostPhase.OPEN, 1)
    assert pool.state(1)[2] == pytest.approx(56 * HOUR)
    assert pool.lava.vm_class["a"] == 1
    empty, opened = pool.lava.take_notices()
    assert (empty.subject_id, empty.reason) == ("h0", "empty")
    assert empty.explanation["previous_state"] == "open"
    assert empty.explanation["previous_class"] == "10-100h"
    assert empty.explanation["lifetime_class"] is None
    assert (opened.subject_id, opened.reason) == ("h1", "opened with the class of its first VM")
    assert opened.explanation["lifetime_class"] == "1-10h"
    assert opened.time == 45 * HOUR


def test_lava_moving_the_last_residual_vm_away_moves_the_class_down() -> None:
    pool = _Pool(hosts=2)
    pool.book("a", 0, 10.0, lifetime_h=50.0, now=0.0)  # opens host 0, class 2
    pool.book("b", 0, 5.0, lifetime_h=50.0, now=0.0)  # 15/16 cores: recycling, {a, b}
    pool.exit("a", now=HOUR)
    pool.book("c", 0, 2.0, lifetime_h=5.0, now=2 * HOUR)  # not residual
    pool.lava.take_notices()
    pool.move("b", 1, now=3 * HOUR)
    # b was the last residual: class 2 -> 1, c residual, deadline 3 h + 11 h.
    assert pool.state(0)[:2] == (HostPhase.RECYCLING, 1)
    assert pool.state(0)[2] == pytest.approx(14 * HOUR)
    assert pool.lava.residual[0] == {"c"}
    # b has 50 h - 3 h = 47 h left: it opens host 1 with class 2, deadline
    # 3 h + 1.1 x 100 h = 113 h.
    assert pool.state(1)[:2] == (HostPhase.OPEN, 2)
    assert pool.state(1)[2] == pytest.approx(113 * HOUR)
    down, opened = pool.lava.take_notices()
    assert down.reason == "its last residual VM migrated away: class down, VMs residual"
    assert down.explanation["residual_vms"] == 1
    assert opened.subject_id == "h1"


def test_lava_a_vm_moved_onto_an_open_host_can_make_it_recycle() -> None:
    pool = _Pool(hosts=2)
    pool.book("d", 1, 14.0, lifetime_h=5.0, now=0.0)  # host 1: open, class 1, 87.5%
    pool.book("e", 0, 1.0, lifetime_h=8.0, now=0.0)
    pool.lava.take_notices()
    pool.move("e", 1, now=HOUR)
    # 15 of 16 cores (93.75% > 90%): recycling, both VMs residual; the
    # class stays the host's (an open host is not reclassed by a newcomer).
    assert pool.state(1)[:2] == (HostPhase.RECYCLING, 1)
    assert pool.lava.residual[1] == {"d", "e"}
    assert pool.state(0)[0] == HostPhase.EMPTY
    # e: 8 h - 1 h = 7 h left, class 1.
    assert pool.lava.vm_class["e"] == 1


def test_lava_preference_ranks_a_migrating_vm_by_its_remaining_class() -> None:
    pool = _Pool(hosts=3)
    # Host 0: "a" (50 h, 1 core), open class 2. Host 1: "big" (15 cores,
    # 500 h): recycling class 3. Host 2: empty.
    pool.book("a", 0, 1.0, lifetime_h=50.0, now=0.0)
    pool.book("big", 1, 15.0, lifetime_h=500.0, now=0.0)
    out = np.zeros(3)
    preference = LavaPreference(pool.lava)
    # At 1 h a has 49 h left (class 2): host 1 is one class above: cost 0.
    preference.score(pool.cluster, pool.request("a", HOUR), out, np.zeros(3))
    assert out.tolist() == [4.0, 0.0, 6.0]
    # At 45 h it has 5 h left (class 1): host 1 is two classes above (cost
    # 1), and its own host, open class 2, is "any other non-empty host" (5).
    preference.score(pool.cluster, pool.request("a", 45 * HOUR), out, np.zeros(3))
    assert out.tolist() == [5.0, 1.0, 6.0]


# ---------------------------------------------------------------------- GPA


def _sample(vm_id: str, time: float, cpu: float) -> UsageSample:
    return UsageSample(
        time=time, pool="p", vm_id=vm_id, interval_s=300.0, cpu=UsageStats(mean=cpu, peak=cpu)
    )


def test_usage_hooks_move_the_vm_sums_and_keep_its_moments() -> None:
    cluster = ClusterState()
    cluster.add_host("h0", (6.0, 64.0, 0.0, 0.0))
    cluster.add_host("h1", (8.0, 64.0, 0.0, 0.0))
    usage = HostUsage(UsageMoments(), UsagePrior(min_samples=4))
    hooks = UsageHooks(usage, rho=0.01, calibrate=False)
    for vm_id in ("a", "b"):
        record = cluster.book(vm_id, 0, (4.0, 8.0, 0.0, 0.0), "", 0.0)
        hooks.on_booked(cluster, record, 0.0, None)
    # a uses 0.2, 0.4, 0.2, 0.4 of its 4 cores: mean 0.3 -> 1.2 cores;
    # variance (4 x 0.1^2) / 3 = 0.01333 -> x 4^2 = 0.2133 cores^2. b stays
    # on the prior (4 cores, no variance). Host 0: mean 5.2, sd 0.462, so
    # P(usage > 6) = P(Z > 1.73) = 4.2% > rho: at risk.
    for k, cpu in enumerate((0.2, 0.4, 0.2, 0.4)):
        hooks.observe(cluster, _sample("a", 300.0 * (k + 1), cpu))
    variance_a = 16 * 0.04 / 3
    assert usage.mean_sum[CPU, :2].tolist() == pytest.approx([5.2, 0.0])
    assert usage.variance_sum[CPU, :2].tolist() == pytest.approx([variance_a, 0.0])
    assert [n.reason for n in hooks.take_notices()] == ["overflow_risk"]

    before = cluster.release("a")
    after = cluster.book("a", 1, before.demand, before.deployment, before.placed_at)
    hooks.on_moved(cluster, before, after, 1500.0)
    # a's own estimate goes with it: host 0 keeps b's prior (4 cores, no
    # variance), host 1 gets 1.2 cores and 0.2133.
    assert usage.mean_sum[CPU, :2].tolist() == pytest.approx([4.0, 1.2])
    assert usage.variance_sum[CPU, :2].tolist() == pytest.approx([0.0, variance_a], abs=1e-12)
    assert usage.vm_count[:2].tolist() == [1, 1]
    assert usage.host_of("a") == 1
    assert usage.estimated("a", CPU)  # its 4 samples are kept
    # Host 0 fell back under rho (4 <= 6) and host 1 is far under it (1.2
    # of 8): no notice, and host 0's risk re-arms.
    assert hooks.take_notices() == []

    # Moving a back crosses rho again on host 0: a notice, once per crossing.
    before = cluster.release("a")
    after = cluster.book("a", 0, before.demand, before.deployment, before.placed_at)
    hooks.on_moved(cluster, before, after, 1800.0)
    notices = hooks.take_notices()
    assert [(n.subject_id, n.reason) for n in notices] == [("h0", "overflow_risk")]
    assert notices[0].explanation["probability"] == pytest.approx(0.0416, abs=1e-3)
