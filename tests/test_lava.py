"""LAVA's classes, host states and preference, worked out by hand.

The tracker runs in oracle mode so that each VM's predicted lifetime is the
one the test writes in its request: the state machine is what is tested.
"""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.affinity import DeploymentAffinity
from lavad.core.placement.framework import PlacementRequest
from lavad.core.placement.lava import (
    NO_CLASS,
    HostPhase,
    LavaHosts,
    LavaPreference,
    class_probability,
    lifetime_class,
    preference_cost,
)
from lavad.core.placement.lifetime import (
    LifetimeSettings,
    LifetimeTracker,
    OracleMissing,
    Prediction,
)
from lavad.core.placement.registry import LavaArgs, validate_policy_args
from lavad.models.lifetime.features import LEFT_TRUNCATED, ORACLE_FEATURE
from lavad.streams.schema import VmRequest

HOUR = 3600.0


@pytest.mark.parametrize(
    ("lifetime_h", "klass"),
    [
        (0.0, 0),
        (0.99, 0),
        (1.0, 1),  # a bound belongs to the class above it
        (9.9, 1),
        (10.0, 2),
        (999.0, 3),
        (1000.0, 4),
        (1e6, 4),
    ],
)
def test_lifetime_class_bounds(lifetime_h: float, klass: int) -> None:
    assert lifetime_class(lifetime_h * HOUR) == klass


# Hosts: recycling 100-1000h, recycling 10-100h, open 1-10h, open 10-100h,
# recycling 1-10h, empty, open <1h. A 1-10h VM (class 1):
PREFERENCE_CASES = [
    (HostPhase.RECYCLING, 3, False, 1.0),  # recycling, higher class: 3 - 1 - 1 = 1
    (HostPhase.RECYCLING, 2, False, 0.0),  # recycling, one class above: 0, the best
    (HostPhase.OPEN, 1, False, 4.0),  # open, the VM's own class
    (HostPhase.OPEN, 2, False, 5.0),  # open, another class: "any non-empty host"
    (HostPhase.RECYCLING, 1, False, 5.0),  # recycling but not above the VM's class
    (HostPhase.EMPTY, NO_CLASS, True, 6.0),  # empty: last
    (HostPhase.OPEN, 0, False, 5.0),
]


def test_preference_order_of_section_4_3() -> None:
    phase = np.array([case[0] for case in PREFERENCE_CASES], dtype=np.int8)
    host_class = np.array([case[1] for case in PREFERENCE_CASES], dtype=np.int8)
    empty = np.array([case[2] for case in PREFERENCE_CASES])
    out = np.zeros(len(PREFERENCE_CASES))
    preference_cost(phase, host_class, empty, 1, out)
    assert out.tolist() == [case[3] for case in PREFERENCE_CASES]


def test_a_vm_without_a_class_prefers_every_non_empty_host_alike() -> None:
    # The same hosts for a VM whose class is too uncertain to prefer by
    # (``NO_CLASS``): every non-empty host 5, whatever its phase or class;
    # the empty host still last.
    phase = np.array([case[0] for case in PREFERENCE_CASES], dtype=np.int8)
    host_class = np.array([case[1] for case in PREFERENCE_CASES], dtype=np.int8)
    empty = np.array([case[2] for case in PREFERENCE_CASES])
    out = np.zeros(len(PREFERENCE_CASES))
    preference_cost(phase, host_class, empty, NO_CLASS, out)
    assert out.tolist() == [5.0, 5.0, 5.0, 5.0, 5.0, 6.0, 5.0]


# Eight equally likely lifetimes, in hours: three under 1 h, four from 1 h to
# 10 h (1 h itself belongs to the class above it, as in ``lifetime_class``),
# one of 40 h.
SPREAD_H = [0.1, 0.3, 0.9, 1.0, 2.0, 5.0, 9.0, 40.0]


@pytest.mark.parametrize(
    ("klass", "probability"),
    [(0, 3 / 8), (1, 4 / 8), (2, 1 / 8), (3, 0.0), (4, 0.0)],
)
def test_class_probability_counts_the_quantiles_inside_the_class(
    klass: int, probability: float
) -> None:
    quantiles = np.array(SPREAD_H) * HOUR
    assert class_probability(quantiles, klass) == probability


def test_an_unbounded_quantile_belongs_to_the_top_class() -> None:
    quantiles = np.array([0.5 * HOUR, 2000.0 * HOUR, np.inf, np.inf])
    assert class_probability(quantiles, 4) == 3 / 4
    assert class_probability(quantiles, 0) == 1 / 4
    assert class_probability(np.zeros(0), 0) == 0.0


def test_the_preference_drops_a_class_its_vm_is_not_sure_of() -> None:
    # E[T] of the spread above is 7.29 h: class 1, with probability 4/8.
    quantiles = np.array(SPREAD_H) * HOUR
    prediction = Prediction((0,), 0, float(np.mean(quantiles)), None, quantiles)
    hosts = LavaHosts(LifetimeTracker(LifetimeSettings()), recycle_above=0.9, deadline_factor=1.0)
    assert LavaPreference(hosts).preferred_class(prediction) == 1  # the paper's: no bar
    assert LavaPreference(hosts, 0.5).preferred_class(prediction) == 1  # 4/8 >= 0.5
    assert LavaPreference(hosts, 0.51).preferred_class(prediction) == NO_CLASS
    # Without quantiles (an oracle, or scoring by the mean) there is nothing to
    # doubt: the class of the point lifetime.
    point = Prediction((0,), 0, float(np.mean(quantiles)))
    assert LavaPreference(hosts, 0.99).preferred_class(point) == 1
    with pytest.raises(ValueError, match="class_confidence"):
        LavaPreference(hosts, 1.5)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_bad_class_confidence_fails_at_start_up_naming_the_key(bad: float) -> None:
    with pytest.raises(ValueError, match="class_confidence"):
        validate_policy_args("lava", {"class_confidence": bad})


class _Pool:
    """One 16-core, 64 GiB host (or more) with LAVA's hooks driven by hand."""

    def __init__(self, hosts: int = 1, deadline_factor: float = 1.1) -> None:
        self.cluster = ClusterState()
        for h in range(hosts):
            self.cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
        tracker = LifetimeTracker(LifetimeSettings(oracle=True))
        # The paper's 90% and 1.1 x the class bound, which the times worked out
        # by hand below use (lavad's default deadline is the bound itself).
        self.lava = LavaHosts(tracker, recycle_above=0.9, deadline_factor=deadline_factor)

    def book(
        self,
        vm_id: str,
        cores: float,
        memory: float,
        lifetime_h: float,
        now: float,
        *,
        preexisting: bool = False,
    ) -> None:
        features: dict[str, float | bool] = {ORACLE_FEATURE: lifetime_h * HOUR}
        if preexisting:
            features[LEFT_TRUNCATED] = True
        event = VmRequest(
            time=now,
            pool="p",
            vm_id=vm_id,
            cores=cores,
            memory_gib=memory,
            features=features,
        )
        record = self.cluster.book(vm_id, 0, (cores, memory, 0.0, 0.0), "", now)
        self.lava.on_booked(self.cluster, record, now, event)

    def exit(self, vm_id: str, now: float) -> None:
        record = self.cluster.release(vm_id)
        self.lava.on_released(self.cluster, record, now, exited=True)

    def state(self) -> tuple[HostPhase, int, float]:
        lava = self.lava
        return HostPhase(int(lava.phase[0])), int(lava.host_class[0]), float(lava.deadline[0])


def test_first_vm_opens_the_host_with_its_class_and_a_deadline() -> None:
    pool = _Pool()
    pool.book("a", 1.0, 4.0, lifetime_h=5.0, now=100.0)
    # 5 h is class 1 (1-10h); deadline = 100 + 1.1 x 10 h = 39,700 s.
    assert pool.state() == (HostPhase.OPEN, 1, 100.0 + 39_600.0)
    (notice,) = pool.lava.take_notices()
    assert notice.subject == "host"
    assert notice.explanation["state"] == "open"
    assert notice.explanation["lifetime_class"] == "1-10h"
    assert notice.explanation["previous_state"] == "empty"


def test_open_becomes_recycling_only_above_90_percent() -> None:
    pool = _Pool()
    # 14.4 of 16 cores is exactly 90%: not above, still open.
    pool.book("a", 14.4, 8.0, lifetime_h=5.0, now=0.0)
    assert pool.state()[0] == HostPhase.OPEN
    # 14.5 cores is 90.6%: recycling; the two VMs there are its residual VMs.
    pool.book("b", 0.1, 1.0, lifetime_h=0.5, now=10.0)
    assert pool.state()[0] == HostPhase.RECYCLING
    assert pool.lava.residual[0] == {"a", "b"}


def test_a_vm_of_unknown_age_does_not_start_recycling() -> None:
    pool = _Pool()
    # A VM that existed before the recording fills 15 of 16 cores (93.8%):
    # the host opens with its class (10-100h) but does not recycle.
    pool.book("old", 15.0, 8.0, lifetime_h=50.0, now=0.0, preexisting=True)
    assert pool.state()[:2] == (HostPhase.OPEN, 2)
    # The next VM of known age finds it still over 90%: it recycles, and
    # both VMs are its residual VMs.
    pool.book("new", 0.5, 1.0, lifetime_h=0.5, now=60.0)
    assert pool.state()[:2] == (HostPhase.RECYCLING, 2)
    assert pool.lava.residual[0] == {"old", "new"}


def test_memory_alone_triggers_recycling() -> None:
    pool = _Pool()
    # 1 core but 58 of 64 GiB (90.6%).
    pool.book("a", 1.0, 58.0, lifetime_h=20.0, now=0.0)
    assert pool.state()[0] == HostPhase.RECYCLING
    assert pool.state()[1] == 2  # 20 h: 10-100h


def test_last_residual_exit_moves_the_class_down_and_renews_residuals() -> None:
    pool = _Pool()
    pool.book("a", 10.0, 8.0, lifetime_h=50.0, now=0.0)  # opens class 2 (10-100h)
    pool.book("b", 5.0, 8.0, lifetime_h=50.0, now=0.0)  # 15/16 cores: recycling
    assert pool.state()[:2] == (HostPhase.RECYCLING, 2)
    pool.exit("a", now=HOUR)
    pool.book("c", 2.0, 8.0, lifetime_h=5.0, now=2 * HOUR)  # not residual
    # One residual (b) remains: no change yet.
    assert pool.state()[:2] == (HostPhase.RECYCLING, 2)
    pool.lava.take_notices()
    pool.exit("b", now=3 * HOUR)
    # The last residual exited: class 2 -> 1, c is now residual, and the
    # deadline restarts: 3 h + 1.1 x 10 h = 14 h.
    assert pool.state() == (HostPhase.RECYCLING, 1, 14 * HOUR)
    assert pool.lava.residual[0] == {"c"}
    (notice,) = pool.lava.take_notices()
    assert notice.explanation["previous_class"] == "10-100h"
    assert notice.explanation["lifetime_class"] == "1-10h"
    assert notice.explanation["residual_vms"] == 1


def test_class_never_goes_below_zero() -> None:
    pool = _Pool()
    pool.book("a", 15.0, 8.0, lifetime_h=0.2, now=0.0)  # class 0, recycling at once
    pool.book("b", 0.5, 1.0, lifetime_h=0.2, now=0.0)
    pool.exit("a", now=60.0)
    assert pool.state()[:2] == (HostPhase.RECYCLING, 0)  # b is still residual
    pool.book("c", 0.5, 1.0, lifetime_h=0.2, now=70.0)
    pool.exit("b", now=80.0)
    assert pool.state()[:2] == (HostPhase.RECYCLING, 0)


def test_deadline_moves_the_class_up_at_the_deadline_time() -> None:
    pool = _Pool()
    pool.book("a", 1.0, 4.0, lifetime_h=0.5, now=0.0)  # class 0, deadline 1.1 h
    pool.lava.take_notices()
    assert pool.lava.next_deadline == pytest.approx(1.1 * HOUR)
    pool.lava.advance(pool.cluster, 1.0 * HOUR)
    assert pool.state()[1] == 0  # not yet
    pool.lava.advance(pool.cluster, 2.0 * HOUR)
    # Underpredicted: class 0 -> 1 at 1.1 h, next deadline 1.1 h + 11 h.
    assert pool.state() == (HostPhase.OPEN, 1, pytest.approx(12.1 * HOUR))
    (notice,) = pool.lava.take_notices()
    assert notice.time == pytest.approx(1.1 * HOUR)  # when it was due, not when seen
    assert notice.explanation["lifetime_class"] == "1-10h"
    assert pool.lava.residual[0] == {"a"}


def test_the_default_deadline_is_the_class_bound_itself() -> None:
    pool = _Pool(deadline_factor=LavaArgs().deadline_factor)
    pool.book("a", 1.0, 4.0, lifetime_h=0.5, now=0.0)  # class 0 (< 1 h): deadline 1 h
    pool.lava.take_notices()
    assert pool.lava.next_deadline == pytest.approx(1.0 * HOUR)
    pool.lava.advance(pool.cluster, 1.05 * HOUR)
    # Still there at 1 h: class 0 -> 1, next deadline 1 h + 10 h.
    assert pool.state() == (HostPhase.OPEN, 1, pytest.approx(11.0 * HOUR))


def test_an_absurd_deadline_factor_never_times_a_host_out() -> None:
    # The largest factor the settings accept: the deadline overflows to inf, so a
    # jump of a thousand years finds nothing due and moves no class.
    pool = _Pool(deadline_factor=1e308)
    pool.book("a", 1.0, 4.0, lifetime_h=0.5, now=0.0)
    pool.lava.take_notices()
    assert pool.lava.next_deadline == float("inf")
    pool.lava.advance(pool.cluster, 1000 * 365 * 24 * HOUR)
    assert pool.state() == (HostPhase.OPEN, 0, float("inf"))
    assert pool.lava.take_notices() == []


def test_top_class_has_no_deadline_and_empty_host_has_no_class() -> None:
    pool = _Pool()
    pool.book("a", 1.0, 4.0, lifetime_h=2000.0, now=0.0)
    assert pool.state() == (HostPhase.OPEN, 4, float("inf"))
    pool.exit("a", now=10.0)
    assert pool.state() == (HostPhase.EMPTY, NO_CLASS, float("inf"))


def test_preference_scorer_routes_a_short_vm_to_a_recycling_longer_host() -> None:
    pool = _Pool(hosts=3)
    cluster = pool.cluster
    # Host 0: recycling, class 2. Host 1: open, class 0. Host 2: empty.
    for vm_id, host, cores, lifetime_h in (("a", 0, 15.0, 50.0), ("b", 1, 1.0, 0.5)):
        event = VmRequest(
            time=0.0,
            pool="p",
            vm_id=vm_id,
            cores=cores,
            memory_gib=1.0,
            features={ORACLE_FEATURE: lifetime_h * HOUR},
        )
        record = cluster.book(vm_id, host, (cores, 1.0, 0.0, 0.0), "", 0.0)
        pool.lava.on_booked(cluster, record, 0.0, event)
    scorer = LavaPreference(pool.lava)
    out = np.zeros(3)

    def request(lifetime_h: float, deployment: str = "") -> PlacementRequest:
        event = VmRequest(
            time=60.0,
            pool="p",
            vm_id=f"new{lifetime_h}",
            cores=0.5,
            memory_gib=1.0,
            features={ORACLE_FEATURE: lifetime_h * HOUR},
        )
        return PlacementRequest(event.vm_id, (0.5, 1.0, 0.0, 0.0), deployment, None, 60.0, event)

    def score(lifetime_h: float) -> list[float]:
        scorer.score(cluster, request(lifetime_h), out, np.zeros(3))
        return out.tolist()

    # A class-0 VM: recycling class 2 costs 2 - 0 - 1 = 1; open class 0 is
    # its own class, 4; empty 6.
    assert score(0.5) == [1.0, 4.0, 6.0]
    # A class-2 VM: host 0 is recycling but not above it, host 1 open of
    # another class: both 5; empty 6.
    assert score(50.0) == [5.0, 5.0, 6.0]
    # Under the deployment affinity, which writes its level (16 on the hosts
    # without a VM of the deployment) and the preference in one pass: a
    # class-0 VM of "d", which runs on host 1 alone, keys 16 + 1, 0 + 4, 16 + 6.
    cluster.book("d0", 1, (0.5, 1.0, 0.0, 0.0), "d", 0.0)
    affinity = DeploymentAffinity(scorer)
    packed = np.full(4, -1.0)  # longer than the pool: only the first 3 are written
    affinity.score(cluster, request(0.5, "d"), packed, np.zeros(4))
    assert packed.tolist() == [17.0, 4.0, 22.0, -1.0]


def test_oracle_policy_without_true_lifetime_is_a_clear_error() -> None:
    pool = _Pool()
    event = VmRequest(time=0.0, pool="p", vm_id="a", cores=1.0, memory_gib=1.0)
    record = pool.cluster.book("a", 0, (1.0, 1.0, 0.0, 0.0), "", 0.0)
    with pytest.raises(OracleMissing, match=ORACLE_FEATURE):
        pool.lava.on_booked(pool.cluster, record, 0.0, event)
