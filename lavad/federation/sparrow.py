"""The random-probing baseline (Sparrow, Ousterhout et al. SOSP'13), in event time.

A job of ``m`` tasks sends ``probes_per_task * m`` probes to workers drawn at random
(seeded per job: ``default_rng((seed, job))``); each worker queues its reservations
FIFO and, with a slot free, asks the job's scheduler for a task (late binding): the
next unlaunched task comes back, or a no-op once all have launched. Every message
takes the network delay; nothing else costs (as in Sparrow's simulator, which Megha
compares against). Allocation time = start - arrival: communication (probe, request,
response) plus the wait in the worker's queue.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from lavad.federation.allocation import AllocationLog
from lavad.federation.messages import Task
from lavad.federation.simulator import FederationResult, SimulationBoundError

_ARRIVE, _PROBE, _REQUEST, _START, _NOOP, _END = range(6)


@dataclass
class _Worker:
    free: int
    reservations: deque[int] = field(default_factory=deque)


def simulate_sparrow(
    tasks: list[Task],
    workers: int,
    *,
    slots_per_worker: int = 1,
    probes_per_task: int = 2,
    network_delay_s: float = 0.0005,
    seed: int = 0,
    max_events: int = 100_000_000,
) -> FederationResult:
    if workers < 1 or slots_per_worker < 1 or probes_per_task < 1:
        raise ValueError("workers, slots_per_worker and probes_per_task must be >= 1")
    d = network_delay_s
    result = FederationResult(
        allocation=AllocationLog(),
        tasks=len(tasks),
        completed=0,
        busy_slot_s=0.0,
        span_s=0.0,
        capacity=workers * slots_per_worker,
    )
    if not tasks:
        return result
    jobs: dict[int, list[Task]] = {}
    for task in tasks:
        jobs.setdefault(task.job, []).append(task)
    launched = dict.fromkeys(jobs, 0)
    pool = [_Worker(free=slots_per_worker) for _ in range(workers)]
    heap: list[tuple[float, int, int, int, int]] = []
    seq = 0

    def push(time: float, kind: int, a: int, b: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (time, seq, kind, a, b))

    for job_id, job_tasks in jobs.items():
        push(job_tasks[0].arrival, _ARRIVE, job_id, 0)
    first = min(t.arrival for t in tasks)
    last_end = first
    result.window_start = first
    result.window_end = max(t.arrival for t in tasks)
    events = 0
    noops = 0

    def next_reservation(w: int, now: float) -> None:
        worker = pool[w]
        while worker.free > 0 and worker.reservations:
            job_id = worker.reservations.popleft()
            worker.free -= 1
            push(now + d, _REQUEST, w, job_id)

    while heap:
        now, _, kind, a, b = heapq.heappop(heap)
        events += 1
        if events > max_events:
            raise SimulationBoundError(f"sparrow replay passed max_events={max_events}")
        if kind == _ARRIVE:
            job_tasks = jobs[a]
            probes = probes_per_task * len(job_tasks)
            rng = np.random.default_rng((seed, a))
            if probes <= workers:
                targets = rng.choice(workers, size=probes, replace=False)
            else:
                targets = rng.integers(0, workers, size=probes)
            for w in targets.tolist():
                push(now + d, _PROBE, w, a)
        elif kind == _PROBE:
            pool[a].reservations.append(b)
            next_reservation(a, now)
        elif kind == _REQUEST:
            job_tasks = jobs[b]
            if launched[b] < len(job_tasks):
                index = launched[b]
                launched[b] += 1
                push(now + d, _START, a, job_tasks[index].task_id)
            else:
                push(now + d, _NOOP, a, b)
        elif kind == _START:
            task = tasks[b]
            wait = now - task.arrival - 3 * d
            result.allocation.add(b, task.tenant, task.arrival, now, (wait, 0.0, 3 * d, 0.0))
            result.add_busy(now, now + task.duration)
            push(now + task.duration, _END, a, b)
        elif kind == _NOOP:
            noops += 1
            pool[a].free += 1
            next_reservation(a, now)
        elif kind == _END:
            result.completed += 1
            last_end = max(last_end, now)
            pool[a].free += 1
            next_reservation(a, now)
    result.events = events
    result.span_s = last_end - first
    result.probe_noops = noops  # probes that found their job done: Sparrow's wasted work
    return result
