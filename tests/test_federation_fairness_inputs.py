"""Algorithm 2's live inputs kept as tasks start and end (each tenant's usage, each
pool's candidates but our preemptions' victims, the launches in flight) equal their
recomputation from everything running, on any stream of starts, ends, replayed
verdicts and preemptions sent and answered. No broker."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.federation.inflight import LaunchesInFlight
from lavad.federation.messages import Task
from lavad.federation.running_tasks import RunningTasks

POOLS, TENANTS, RESOURCES = 3, 3, 2


@dataclass(frozen=True)
class Start:
    task: int
    tenant: int
    pool: int
    demand: tuple[int, int]


@dataclass(frozen=True)
class End:
    task: int


@dataclass(frozen=True)
class Preempting:
    preemption: int
    victims: tuple[int, ...]


@dataclass(frozen=True)
class Answered:
    preemption: int


@dataclass(frozen=True)
class Sent:
    launch: int
    tenant: int
    demand: tuple[int, int]


@dataclass(frozen=True)
class Back:
    launch: int


task_ids = st.integers(0, 15)  # few ids: replayed starts and ends of ended tasks happen
demands = st.tuples(st.integers(0, 4), st.integers(0, 4))
events = st.lists(
    st.one_of(
        st.builds(Start, task_ids, st.integers(0, TENANTS - 1), st.integers(0, POOLS - 1), demands),
        st.builds(End, task_ids),
        st.builds(Preempting, st.integers(0, 4), st.lists(task_ids, max_size=3).map(tuple)),
        st.builds(Answered, st.integers(0, 4)),
        st.builds(Sent, st.integers(0, 6), st.integers(0, TENANTS - 1), demands),
        st.builds(Back, st.integers(0, 6)),
    ),
    max_size=80,
)


def _task(tid: int, tenant: int, demand: tuple[int, int]) -> Task:
    return Task(tid, job=tid, tenant=tenant, demand=demand, constraints=0, duration=1.0, arrival=0)


@settings(max_examples=300, deadline=None)
@given(events)
def test_kept_inputs_equal_their_recomputation(stream: list[object]) -> None:
    running = RunningTasks(POOLS, TENANTS, RESOURCES)
    inflight = LaunchesInFlight(TENANTS, RESOURCES)
    model: dict[int, tuple[int, Task]] = {}  # task -> (pool, task), as the verdicts say
    preemptions: dict[int, tuple[int, ...]] = {}
    sent: dict[int, Task] = {}
    for event in stream:
        if isinstance(event, Start):
            task = _task(event.task, event.tenant, event.demand)
            running.started(task, gm=0, pool=event.pool, host=0, at=0.0)
            model.pop(event.task, None)
            model[event.task] = (event.pool, task)
        elif isinstance(event, End):
            running.ended(event.task)
            model.pop(event.task, None)
        elif isinstance(event, Preempting):
            running.leaving((event.preemption, 1), event.victims)
            preemptions[event.preemption] = event.victims
        elif isinstance(event, Answered):
            running.answered((event.preemption, 1))
            preemptions.pop(event.preemption, None)
        elif isinstance(event, Sent):
            inflight.add((event.launch, 1), _task(event.launch, event.tenant, event.demand))
            sent[event.launch] = _task(event.launch, event.tenant, event.demand)
        elif isinstance(event, Back):
            inflight.pop((event.launch, 1))
            sent.pop(event.launch, None)
        leaving = {victim for victims in preemptions.values() for victim in victims}
        assert running.leaving_now() == leaving
        for pool in range(POOLS):
            expected = [
                tid for tid, (where, _) in model.items() if where == pool and tid not in leaving
            ]
            assert [t.task_id for t in running.pools[pool]] == expected
            assert [t.task_id for t in running.in_pool(pool, leaving)] == expected
        usage = np.zeros((TENANTS, RESOURCES), dtype=np.int64)
        for _, task in model.values():
            usage[task.tenant] += task.demand
        np.testing.assert_array_equal(running.usage, usage)
        in_flight = np.zeros((TENANTS, RESOURCES), dtype=np.int64)
        for task in sent.values():
            in_flight[task.tenant] += task.demand
        np.testing.assert_array_equal(inflight.usage, in_flight)
        assert len(inflight) == len(sent)
