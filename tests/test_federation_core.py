"""The federation core: owners validate, views take only owners' summaries, Algorithm 2's
choices, and the event-time replay, on hand-worked cases and the bundled Megha slice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lavad.federation.directory import OwnerDirectory
from lavad.federation.fairness import Shares, may_preempt, victims_on_host, violators
from lavad.federation.matching import first_fit
from lavad.federation.messages import (
    Accepted,
    LaunchRequest,
    PreemptRequest,
    Refused,
    RunningTask,
    Task,
)
from lavad.federation.owner import PoolOwner
from lavad.federation.scheduler import GlobalScheduler, Launch, Preempt, Requeue
from lavad.federation.simulator import (
    FederationSetup,
    FederationSimulator,
    SimulationBoundError,
    tasks_of,
)
from lavad.federation.sparrow import simulate_sparrow
from lavad.federation.timing import TimingModel
from lavad.federation.topology import make_pool, uniform_topology
from lavad.federation.trace import TraceError, read_jobs
from lavad.federation.view import GlobalView

SLICE = (
    Path(__file__).resolve().parents[1] / "data" / "megha-goog-slice" / ("GOOG_subtrace_head200.tr")
)


def task(
    tid: int,
    tenant: int = 0,
    demand: tuple[int, ...] = (1,),
    constraints: int = 0,
    duration: float = 10.0,
    arrival: float = 0.0,
) -> Task:
    return Task(
        tid,
        job=tid,
        tenant=tenant,
        demand=demand,
        constraints=constraints,
        duration=duration,
        arrival=arrival,
    )


def two_host_owner(schedulers: int = 2, tenants: int = 2) -> PoolOwner:
    # host 0 (2 cpu, label bit 0) is scheduler 0's, host 1 (1 cpu, no label) is 1's
    pool = make_pool(0, np.array([[2], [1]]), np.array([1, 0], dtype=np.uint64), schedulers)
    return PoolOwner("owner-a", pool, schedulers, tenants)


# -- the owner's validation --------------------------------------------------------------


def launch(
    seq: int, host: int, t: Task, gm: int = 0, repartition: bool = False, pool: int = 0
) -> LaunchRequest:
    return LaunchRequest(gm=gm, seq=seq, pool=pool, host=host, task=t, repartition=repartition)


def test_owner_accepts_then_refuses_a_stale_launch_with_its_summary() -> None:
    owner = two_host_owner()
    first = owner.launch(launch(1, 0, task(1, demand=(2,))), now=0.0)
    assert isinstance(first, Accepted)
    assert first.summary.free.tolist() == [[0], [1]]
    # the scheduler's view still shows host 0 free: stale, may retry, summary attached
    second = owner.launch(launch(2, 0, task(2)), now=1.0)
    assert isinstance(second, Refused) and not second.final
    assert "stale view" in second.reason and "host 0 has [0] free" in second.reason
    assert second.summary is not None and second.summary.free.tolist() == [[0], [1]]
    assert second.summary.seen_seq == (2, 0)
    # processing goes on: a launch that fits is accepted after the refusal
    third = owner.launch(launch(1, 1, task(3), gm=1), now=2.0)
    assert isinstance(third, Accepted)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (launch(1, 0, task(1), pool=7), "request for pool 7 sent to the owner of pool 0"),
        (launch(1, 5, task(1)), "pool 0 has no host 5"),
        (launch(1, 0, task(1), gm=9), "unknown global scheduler 9"),
        (launch(1, 0, task(1, tenant=4)), "unknown tenant 4"),
        (launch(1, 0, task(1, demand=(1, 1))), "is not 1 counts"),
        (launch(1, 1, task(1, constraints=1), gm=1), "host 1 lacks labels 0x1"),
        (launch(1, 1, task(1), gm=0), "repartition=False is wrong"),
        (launch(1, 0, task(1), gm=0, repartition=True), "repartition=True is wrong"),
        (launch(0, 0, task(1)), "request seq 0 of scheduler 0 is not after 0"),
    ],
)
def test_owner_refuses_wrong_requests_as_final(request_: LaunchRequest, reason: str) -> None:
    owner = two_host_owner()
    verdict = owner.launch(request_, now=0.0)
    assert isinstance(verdict, Refused) and verdict.final and verdict.summary is None
    assert reason in verdict.reason
    assert owner.free.tolist() == [[2], [1]] and not owner.running  # nothing changed
    assert isinstance(owner.launch(launch(5, 0, task(9)), now=1.0), Accepted)


def test_directory_refuses_a_launch_for_an_unknown_pool_and_goes_on() -> None:
    owner = two_host_owner()
    directory = OwnerDirectory([owner])
    verdict = directory.deliver(launch(1, 0, task(1), pool=3), now=0.0)
    assert isinstance(verdict, Refused) and verdict.final
    assert verdict.reason == "unknown pool 3: no owner holds it (pools: 0)"
    assert isinstance(directory.deliver(launch(1, 0, task(1)), now=0.0), Accepted)


def test_preemption_of_a_task_that_already_ended_is_refused_and_processing_goes_on() -> None:
    owner = two_host_owner()
    assert isinstance(owner.launch(launch(1, 0, task(1, tenant=1, demand=(2,))), 0.0), Accepted)
    ended = owner.end(1, now=5.0)
    assert not isinstance(ended, Refused)
    assert isinstance(owner.launch(launch(2, 0, task(2, tenant=1, demand=(2,))), 6.0), Accepted)
    stale = PreemptRequest(gm=0, seq=3, pool=0, host=0, victims=(1,), task=task(3, demand=(2,)))
    verdict = owner.preempt(stale, now=7.0)
    assert isinstance(verdict, Refused) and not verdict.final
    assert verdict.reason == "preemption of task 1, which is not running (it ended)"
    assert verdict.summary is not None and [r.task_id for r in verdict.summary.running or ()] == []
    again = owner.end(1, now=8.0)
    assert isinstance(again, Refused) and "not running" in again.reason
    good = PreemptRequest(gm=0, seq=4, pool=0, host=0, victims=(2,), task=task(3, demand=(2,)))
    accepted = owner.preempt(good, now=9.0)
    assert isinstance(accepted, Accepted)
    assert [v.task_id for v in accepted.preempted] == [2]
    assert owner.tenant_usage.tolist() == [[2], [0]]


def test_preempting_the_requesters_own_task_is_final() -> None:
    owner = two_host_owner()
    owner.launch(launch(1, 0, task(1, tenant=0, demand=(2,))), 0.0)
    own = PreemptRequest(gm=0, seq=2, pool=0, host=0, victims=(1,), task=task(2, tenant=0))
    verdict = owner.preempt(own, 1.0)
    assert isinstance(verdict, Refused) and verdict.final and "the requester" in verdict.reason


# -- the view ------------------------------------------------------------------------------


def test_view_refuses_a_summary_from_a_non_owner_and_keeps_taking_the_owners() -> None:
    topology = uniform_topology(1, 2, 1, host_capacity=(1,))
    owner = PoolOwner("owner-a", topology.pools[0], 1, 1)
    impostor = PoolOwner("owner-b", topology.pools[0], 1, 1)
    view = GlobalView(0, topology, {0: "owner-a"}, tenants=1)
    impostor.launch(launch(1, 0, task(1)), 0.0)
    reason = view.apply(impostor.summary(0.0))
    assert reason == "summary for pool 0 from 'owner-b', not its owner 'owner-a'"
    assert view.free[0].tolist() == [[1], [1]]
    assert view.apply(owner.summary(1.0)) is None
    old = owner.summary(2.0)
    assert view.apply(owner.summary(3.0)) is None
    assert view.apply(old) == "older"


def test_view_reapplies_in_flight_launches_over_a_summary_that_predates_them() -> None:
    topology = uniform_topology(1, 2, 1, host_capacity=(1,))
    owner = PoolOwner("owner-a", topology.pools[0], 1, 1)
    view = GlobalView(0, topology, {0: "owner-a"}, tenants=1)
    view.reserve(0, 0, np.array([1]), seq=1)
    view.reserve(0, 1, np.array([1]), seq=2)
    owner.launch(launch(1, 0, task(1)), 0.0)  # the owner has seen seq 1, not yet seq 2
    assert view.apply(owner.summary(0.1)) is None
    assert view.free[0].tolist() == [[0], [0]]  # host 1 stays counted: seq 2 in flight
    owner.launch(launch(2, 1, task(2)), 0.2)
    owner.end(1, 0.3)
    assert view.apply(owner.summary(0.4)) is None
    assert view.free[0].tolist() == [[1], [0]] and view.pending[0] == {}


# -- Algorithm 1 and 2 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("demand", "constraints", "expected"),
    [
        ((1, 1), 0, (1, 2)),  # host 0 is full in cpu: host 1, two scanned
        ((1, 1), 0b10, (2, 3)),  # host 1 lacks bit 1
        ((3, 1), 0, (-1, 4)),  # nobody has 3 cpu free
        ((1, 4), 0b01, (3, 4)),  # only host 3 has 4 memory and a cpu free
    ],
)
def test_first_fit(demand: tuple[int, int], constraints: int, expected: tuple[int, int]) -> None:
    free = np.array([[0, 4], [2, 2], [1, 1], [2, 4]], dtype=np.int64)
    labels = np.array([0b11, 0b01, 0b11, 0b11], dtype=np.uint64)
    got = first_fit(free, labels, np.arange(4), np.array(demand), constraints)
    assert got == expected


SHARES = Shares((0.10, 0.25, 0.15, 0.50))
TOTAL = np.array([20])


@pytest.mark.parametrize(
    ("usage", "requester", "allowed", "order"),
    [
        # shares of 20 slots: 0.2, 0.25, 0.15, 0.4 -> only tenant 0 (+0.10) over
        ([4, 5, 3, 8], 3, True, [0]),  # 3: (8+1)/20 = 0.45 <= 0.50
        ([4, 5, 3, 8], 0, False, [1]),  # 0 already over: requeued; 1 is at +0.0? no: 0.25-0.25
        # 0.3, 0.1, 0.3, 0.3: over are 0 (+0.20) and 2 (+0.15), largest first
        ([6, 2, 6, 6], 1, True, [0, 2]),  # 1: 3/20 = 0.15 <= 0.25
        ([2, 5, 3, 10], 1, False, []),  # 1 at its share: one more passes it
        ([4, 0, 4, 0], 3, True, [0, 2]),  # equal violations (+0.10, +0.05): 0 first
    ],
)
def test_fair_share_choice(
    usage: list[int], requester: int, allowed: bool, order: list[int]
) -> None:
    used = np.array(usage, dtype=np.int64).reshape(4, 1)
    assert may_preempt(requester, used, TOTAL, np.array([1]), SHARES) is allowed
    expected = [t for t in order if t != requester and used[t, 0] / 20 - SHARES.shares[t] > 0]
    assert violators(requester, used, TOTAL, SHARES) == expected


def test_violators_order_by_violation_then_index() -> None:
    used = np.array([[4], [7], [5], [0]])  # +0.10, +0.10, +0.10, -0.50
    assert violators(3, used, TOTAL, SHARES) == [0, 1, 2]


def test_victims_newest_first_and_only_as_many_as_needed() -> None:
    running = [
        RunningTask(1, 2, 0, 0, (1,), start=1.0),
        RunningTask(2, 2, 0, 0, (1,), 5.0),
        RunningTask(3, 1, 0, 0, (1,), 9.0),
        RunningTask(4, 2, 0, 0, (1,), 3.0),
    ]
    assert victims_on_host(running, 2, np.array([0]), np.array([2])) == (2, 4)
    assert victims_on_host(running, 2, np.array([1]), np.array([2])) == (2,)
    assert victims_on_host(running, 1, np.array([0]), np.array([2])) == ()


def test_shares_are_checked() -> None:
    with pytest.raises(ValueError, match=r"sum to 1\.1000"):
        Shares((0.6, 0.5))
    with pytest.raises(ValueError, match="each must be in"):
        Shares((0.0, 0.5))


def test_scheduler_tries_internal_then_repartition_then_preempts_or_requeues() -> None:
    topology = uniform_topology(2, 2, 2, host_capacity=(1,))  # per pool: host 0 -> gm 0
    view = GlobalView(0, topology, {0: "a", 1: "b"}, tenants=2)
    sched = GlobalScheduler(0, topology, view, [0], Shares((0.5, 0.5)))
    choice, scanned = sched.decide(task(1))
    assert choice == Launch(pool=0, host=0, repartition=False) and scanned == 1
    view.reserve(0, 0, np.array([1]), 1)
    assert sched.decide(task(2))[0] == Launch(pool=1, host=0, repartition=False)
    view.reserve(1, 0, np.array([1]), 2)
    choice, scanned = sched.decide(task(3))
    assert choice == Launch(pool=0, host=1, repartition=True) and scanned == 1 + 1 + 1
    view.reserve(0, 1, np.array([1]), 3)
    view.reserve(1, 1, np.array([1]), 4)
    # full: tenant 1 holds 2 of 4 slots (share 0.5 -> at it, not over): nobody to preempt
    view.usage[0] = [[1], [1]]
    view.usage[1] = [[0], [1]]
    view.running[0] = (RunningTask(7, 1, 1, 1, (1,), 0.0),)
    assert isinstance(sched.decide(task(4))[0], Requeue)
    # tenant 1 with 3 of 4 (0.75 > 0.5) and tenant 0 with 1 (0.25): preempt tenant 1
    view.usage[1] = [[0], [2]]
    choice = sched.decide(task(4))[0]
    assert choice == Preempt(pool=0, host=1, victims=(7,), victim_tenant=1)
    # tenant 0 (this scheduler's own: its exact count, not the view's) over its share
    sched.charge(0, np.array([3]), +1)
    assert sched.decide(task(5))[0] == Requeue("tenant 0 would pass its share: requeued")


# -- the replay ---------------------------------------------------------------------------

HAND = TimingModel(
    network_delay_s=0.0005,
    decide_s=0.001,
    scan_per_host_s=0.0,
    apply_per_host_s=0.0,
    validate_s=0.002,
    heartbeat_s=10.0,
)


def test_replay_timeline_worked_by_hand() -> None:
    topology = uniform_topology(1, 2, 1)
    sim = FederationSimulator(FederationSetup(topology, (0,)), HAND)
    result = sim.run([task(0), task(1)])
    log = result.allocation
    # task 0: decide 1 ms, 0.5 ms to the owner, validate 2 ms, 0.5 ms to the host
    # task 1: waits 1 ms for the scheduler, then 1 ms for the owner (busy with task 0)
    assert log.start == pytest.approx([0.004, 0.006])
    assert log.queueing == pytest.approx([0.0, 0.002])
    assert log.processing == pytest.approx([0.003, 0.003])
    assert log.communication == pytest.approx([0.001, 0.001])
    assert log.retries == pytest.approx([0.0, 0.0])
    assert result.completed == 2 and result.stale_refusals == 0


def test_stale_view_launch_is_refused_then_retried() -> None:
    # one pool, hosts 0 (gm 0) and 1 (gm 1), 1 slot each. gm 0 gets 2 tasks: the second
    # takes host 1 by repartition; gm 1's task goes to host 1 (its own) at the same time.
    topology = uniform_topology(1, 2, 2)
    sim = FederationSimulator(FederationSetup(topology, (0, 1)), HAND)
    tasks = [task(0, tenant=0), task(1, tenant=0), task(2, tenant=1, duration=1.0)]
    result = sim.run(tasks)
    assert result.completed == 3
    assert result.stale_refusals == 1 and result.repartitions >= 1
    log = result.allocation
    refused = [i for i, r in enumerate(log.retries) if r > 0]
    assert len(refused) == 1
    times = log.times()
    parts = np.array([log.queueing, log.processing, log.communication, log.retries]).sum(0)
    assert parts == pytest.approx(times)
    assert all((o.free == o.pool.capacity).all() for o in sim.owners)


def test_replay_on_the_megha_slice_is_deterministic_and_consistent() -> None:
    jobs = read_jobs(SLICE, max_jobs=40)  # 1,690 tasks
    topology = uniform_topology(4, 100, 4)
    setup = FederationSetup(topology, (0, 1, 2, 3))
    tasks = tasks_of(jobs, 4, (1,))
    first = FederationSimulator(setup, TimingModel()).run(tasks)
    second = FederationSimulator(setup, TimingModel()).run(tasks)
    assert first.figures() == second.figures()
    assert first.completed == len(tasks) and first.final_refusals == 0
    assert len(first.allocation.start) == len(tasks)
    log = first.allocation
    parts = np.array([log.queueing, log.processing, log.communication, log.retries]).sum(0)
    assert parts == pytest.approx(log.times(), abs=1e-6)
    assert 0.0 < first.utilisation <= 1.0
    assert first.stale_refusals > 0 and first.repartitions > 0  # 4 schedulers contend


def test_replay_stops_at_its_work_bound() -> None:
    jobs = read_jobs(SLICE, max_jobs=5)
    topology = uniform_topology(1, 10, 1)
    with pytest.raises(SimulationBoundError, match="max_events=50"):
        FederationSimulator(FederationSetup(topology, (0,)), TimingModel(), max_events=50).run(
            tasks_of(jobs, 1, (1,))
        )


def test_sparrow_worked_by_hand() -> None:
    # 2 tasks, 8 idle workers: each starts after probe + request + response = 1.5 ms
    result = simulate_sparrow([task(0, arrival=1.0), Task(1, 0, 0, (1,), 0, 5.0, 1.0)], 8)
    assert result.allocation.start == pytest.approx([1.0015, 1.0015])
    assert result.completed == 2
    again = simulate_sparrow([task(0, arrival=1.0), Task(1, 0, 0, (1,), 0, 5.0, 1.0)], 8)
    assert again.figures() == result.figures()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("1.0 2 5.0 1.0", "says 2 tasks but gives 1 durations"),
        ("x 1 5.0 1.0", "arrival 'x' is not a number"),
        ("1.0 1 5.0 -3", "duration '-3' is not a finite number >= 0"),
        ("1.0 1 5.0 nan", "duration 'nan' is not a finite number >= 0"),
        ("1.0 0 5.0", "want 'arrival n mean d_1..d_n'"),
        ("1.0 200000 5.0 1.0", "task count 200000 outside"),
        ("1.0 x 5.0 1.0", "task count 'x' is not a number"),
        ("1.0 inf 5.0 1.0", "task count 'inf' is not a finite number >= 0"),
        ("1.0 1e400 5.0 1.0", "task count '1e400' is not a finite number >= 0"),
        ("1.0 1.5 5.0 1.0", "task count '1.5' is not a whole number"),
        # An arrival plus a duration of 1e308 overflowed, and the latencies were NaN.
        ("1.0 1 5.0 1e308", "duration '1e308' is over 1e+09"),
        ("2e9 1 5.0 1.0", "arrival '2e9' is over 1e+09"),
    ],
)
def test_trace_lines_refused_with_the_reason(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "t.tr"
    path.write_text("0.0 1 1.0 1.0\n" + line + "\n")
    with pytest.raises(TraceError, match="line 2: ") as caught:
        read_jobs(path)
    assert reason in str(caught.value)
