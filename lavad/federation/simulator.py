"""The event-time replay of a federation: pool owners, global schedulers, the network.

Time is the trace's (seconds); every message takes ``network_delay_s``; each scheduler
and each owner is a server doing one thing at a time, for the cost the timing model
gives it. Same jobs, configuration and timing: the same events, in the same order, so
the same figures. The replay is bounded by work: past ``max_events`` it stops with
``SimulationBoundError`` naming the bound, rather than run on.

The paths a task takes (Megha's Fig. 2): scheduler queue -> match on the view ->
launch (internal partition) or repartition (another scheduler's) -> the owner
validates -> start, or refusal with the owner's summary -> the scheduler applies it
and retries. With fair shares, a task that fits nowhere may preempt (Algorithm 2).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lavad.federation.allocation import AllocationLog
from lavad.federation.directory import OwnerDirectory
from lavad.federation.fairness import Shares
from lavad.federation.messages import (
    Accepted,
    Ended,
    LaunchRequest,
    PoolSummary,
    PreemptRequest,
    Refused,
    Task,
)
from lavad.federation.owner import PoolOwner
from lavad.federation.scheduler import GlobalScheduler, Launch, Preempt, Requeue
from lavad.federation.timing import TimingModel
from lavad.federation.topology import Topology
from lavad.federation.trace import Job
from lavad.federation.view import GlobalView

# event kinds (ints: the heap compares tuples)
_ARRIVE, _GM_WAKE, _GM_MSG, _LM_MSG, _LM_WAKE, _END, _HEARTBEAT, _SAMPLE, _GM_ALL = range(9)


class SimulationBoundError(RuntimeError):
    """The replay passed its work bound (``max_events``)."""


@dataclass(frozen=True)
class FederationSetup:
    """Who is who: tenants' queues and the scheduler each is mapped to, shares if any."""

    topology: Topology
    tenant_scheduler: tuple[int, ...]  # tenant t's queue is on this scheduler
    shares: Shares | None = None
    share_sample_s: float | None = None  # sample each tenant's share this often

    def __post_init__(self) -> None:
        for t, g in enumerate(self.tenant_scheduler):
            if not 0 <= g < self.topology.schedulers:
                raise ValueError(
                    f"tenant {t} mapped to scheduler {g}: there are {self.topology.schedulers}"
                )
        if self.shares is not None and len(self.shares.shares) != len(self.tenant_scheduler):
            raise ValueError(
                f"{len(self.shares.shares)} shares for {len(self.tenant_scheduler)} tenants"
            )


@dataclass
class FederationResult:
    allocation: AllocationLog
    tasks: int
    completed: int
    busy_slot_s: float
    span_s: float
    capacity: int
    stale_refusals: int = 0
    final_refusals: int = 0
    final_reasons: list[str] = field(default_factory=list)
    repartitions: int = 0
    preemption_attempts: int = 0
    preemptions: int = 0
    probe_noops: int = 0
    events: int = 0
    share_times: list[float] = field(default_factory=list)
    share_rows: list[list[float]] = field(default_factory=list)
    backlog_rows: list[list[int]] = field(default_factory=list)  # queued tasks per tenant
    window_start: float = 0.0  # first arrival
    window_end: float = 0.0  # last arrival
    busy_window_s: float = 0.0  # slot-seconds busy inside [window_start, window_end]

    def add_busy(self, start: float, end: float) -> None:
        """A run of one slot from ``start`` to ``end`` (a task's, or a preempted one's)."""
        self.busy_slot_s += end - start
        self.busy_window_s += max(0.0, min(end, self.window_end) - max(start, self.window_start))

    @property
    def utilisation(self) -> float:
        """Busy share of the slots while jobs arrive (first to last arrival); the drain
        after the last arrival (tasks of up to 90 hours) would only dilute it."""
        window = self.window_end - self.window_start
        return self.busy_window_s / max(self.capacity * window, 1e-12)

    @property
    def utilisation_to_last_end(self) -> float:
        return self.busy_slot_s / max(self.capacity * self.span_s, 1e-12)

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.allocation.summary())
        out.update(
            tasks=self.tasks,
            completed=self.completed,
            utilisation=self.utilisation,
            utilisation_to_last_end=self.utilisation_to_last_end,
            stale_refusals=self.stale_refusals,
            final_refusals=self.final_refusals,
            repartitions=self.repartitions,
            preemption_attempts=self.preemption_attempts,
            preemptions=self.preemptions,
            probe_noops=self.probe_noops,
            events=self.events,
        )
        return out


def tasks_of(
    jobs: list[Job], tenants: int, demand: tuple[int, ...], *, by: str = "job"
) -> list[Task]:
    """Every task of ``jobs``; with ``by`` "job", job ``j``'s tasks go to tenant
    ``j % tenants``; with "task", task ``i`` (in trace order) to tenant ``i % tenants``, so
    every tenant has work whenever any has (the fair-share study's contention)."""
    if by not in ("job", "task"):
        raise ValueError(f"by: want 'job' or 'task', got {by!r}")
    tasks: list[Task] = []
    for job in jobs:
        for duration in job.durations:
            owner = job.index if by == "job" else len(tasks)
            tasks.append(
                Task(
                    task_id=len(tasks),
                    job=job.index,
                    tenant=owner % tenants,
                    demand=demand,
                    constraints=0,
                    duration=duration,
                    arrival=job.arrival,
                )
            )
    return tasks


class _Server:
    __slots__ = ("busy_until", "inbox", "latest", "waking")

    def __init__(self) -> None:
        self.busy_until = 0.0
        self.inbox: deque[Any] = deque()
        # heartbeats not yet applied, the newest per pool (an older one is worth nothing
        # once a newer arrived); a scheduler with nothing queued leaves them here
        self.latest: dict[int, PoolSummary] = {}
        self.waking = False


class FederationSimulator:
    def __init__(
        self,
        setup: FederationSetup,
        timing: TimingModel,
        *,
        max_events: int = 100_000_000,
    ) -> None:
        self.setup = setup
        self.timing = timing
        self.max_events = max_events
        topology = setup.topology
        tenants = len(setup.tenant_scheduler)
        carry = setup.shares is not None
        self.owners = [
            PoolOwner(
                f"owner-{p.index}", p, topology.schedulers, tenants, summaries_carry_tasks=carry
            )
            for p in topology.pools
        ]
        self.directory = OwnerDirectory(self.owners)
        names = {o.pool.index: o.owner_id for o in self.owners}
        self.schedulers = []
        for g in range(topology.schedulers):
            mine = [t for t, s in enumerate(setup.tenant_scheduler) if s == g]
            view = GlobalView(g, topology, names, tenants)
            self.schedulers.append(GlobalScheduler(g, topology, view, mine, setup.shares))
        self.gm = [_Server() for _ in range(topology.schedulers)]
        self.lm = [_Server() for _ in topology.pools]
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    # -- event plumbing ---------------------------------------------------------------

    def _push(self, time: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, kind, payload))

    def _wake(self, servers: list[_Server], index: int, kind: int, now: float) -> None:
        server = servers[index]
        if not server.waking:
            server.waking = True
            self._push(max(now, server.busy_until), kind, index)

    # -- the run ----------------------------------------------------------------------

    def run(self, tasks: list[Task]) -> FederationResult:
        timing = self.timing
        d = timing.network_delay_s
        topology = self.setup.topology
        n_tasks = len(tasks)
        capacity = int(topology.total_capacity()[0])
        result = FederationResult(
            allocation=AllocationLog(),
            tasks=n_tasks,
            completed=0,
            busy_slot_s=0.0,
            span_s=0.0,
            capacity=capacity,
        )
        if not tasks:
            return result
        by_id = {task.task_id: task for task in tasks}
        if len(by_id) != n_tasks:
            raise ValueError("task ids repeat")
        self._mark: dict[int, float] = {}
        self._parts: dict[int, list[float]] = {}
        self._retrying: set[int] = set()
        self._remaining = n_tasks
        mark, parts, retrying = self._mark, self._parts, self._retrying
        run_of: dict[int, int] = {}
        started_at: dict[int, float] = {}
        first = min(task.arrival for task in tasks)
        last_end = first
        result.window_start = first
        result.window_end = max(task.arrival for task in tasks)
        # arrivals: one event a distinct arrival time
        arrivals: dict[float, list[Task]] = {}
        for task in tasks:
            arrivals.setdefault(task.arrival, []).append(task)
        for time in sorted(arrivals):
            self._push(time, _ARRIVE, arrivals[time])
        for p in range(len(self.owners)):
            offset = timing.heartbeat_s * (p + 1) / len(self.owners)
            self._push(first + offset, _HEARTBEAT, p)
        if self.setup.share_sample_s is not None:
            self._push(first, _SAMPLE, None)
        total_capacity = topology.total_capacity()
        events = 0

        while self._heap:
            now, _, kind, payload = heapq.heappop(self._heap)
            events += 1
            if events > self.max_events:
                raise SimulationBoundError(
                    f"replay passed max_events={self.max_events} at t={now:.3f} s with "
                    f"{self._remaining} of {n_tasks} tasks unfinished"
                )
            if kind == _ARRIVE:
                for task in payload:
                    self._arrive(task, now)
            elif kind == _GM_WAKE:
                g = payload
                server = self.gm[g]
                server.waking = False
                sched = self.schedulers[g]
                if server.inbox:
                    message = server.inbox.popleft()
                    cost = self._gm_handle(g, message, now, result)
                elif server.latest and sched.queued():
                    pool_index = min(server.latest)
                    cost = self._gm_handle(g, server.latest.pop(pool_index), now, result)
                elif (task := sched.next_task()) is not None:
                    tid = task.task_id
                    if tid in retrying:
                        retrying.discard(tid)
                        parts[tid][3] += now - mark[tid]
                    else:
                        parts[tid][0] += now - mark[tid]
                    choice, scanned = sched.decide(task)
                    cost = timing.decide_s + timing.scan_per_host_s * scanned
                    parts[tid][1] += cost
                    send = now + cost
                    mark[tid] = send
                    if isinstance(choice, Requeue):
                        sched.park(task)
                    else:
                        sched.seq += 1
                        demand = np.asarray(task.demand, dtype=np.int64)
                        request: LaunchRequest | PreemptRequest
                        if isinstance(choice, Launch):
                            request = LaunchRequest(
                                gm=g,
                                seq=sched.seq,
                                pool=choice.pool,
                                host=choice.host,
                                task=task,
                                repartition=choice.repartition,
                            )
                        else:
                            assert isinstance(choice, Preempt)
                            result.preemption_attempts += 1
                            request = PreemptRequest(
                                gm=g,
                                seq=sched.seq,
                                pool=choice.pool,
                                host=choice.host,
                                victims=choice.victims,
                                task=task,
                            )
                        sched.view.reserve(request.pool, request.host, demand, sched.seq)
                        sched.charge(task.tenant, demand, +1)
                        self._push(send + d, _LM_MSG, request)
                else:
                    continue
                server.busy_until = now + cost
                if server.inbox or sched.queued():
                    self._wake(self.gm, g, _GM_WAKE, now + cost)
            elif kind == _GM_MSG:
                g, message = payload
                self.gm[g].inbox.append(message)
                self._wake(self.gm, g, _GM_WAKE, now)
            elif kind == _GM_ALL:
                for g in range(len(self.schedulers)):
                    self.gm[g].latest[payload.pool] = payload
                    if self.schedulers[g].queued():
                        self._wake(self.gm, g, _GM_WAKE, now)
            elif kind == _LM_MSG:
                request = payload
                pool = request.pool
                if not 0 <= pool < len(self.lm):
                    verdict = self.directory.deliver(request, now)
                    self._push(now + d, _GM_MSG, (request.gm, (verdict, request)))
                    continue
                self.lm[pool].inbox.append((now, request))
                self.owners[pool].queue_length = len(self.lm[pool].inbox)
                self._wake(self.lm, pool, _LM_WAKE, now)
            elif kind == _LM_WAKE:
                p = payload
                server = self.lm[p]
                server.waking = False
                if not server.inbox:
                    continue
                received, request = server.inbox.popleft()
                self.owners[p].queue_length = len(server.inbox)
                done = now + timing.validate_s
                verdict = self.directory.deliver(request, done)
                server.busy_until = done
                if server.inbox:
                    self._wake(self.lm, p, _LM_WAKE, done)
                if isinstance(verdict, Accepted):
                    task = request.task
                    tid = task.task_id
                    part = parts[tid]
                    part[2] += 2 * d
                    part[0] += now - received
                    part[1] += timing.validate_s
                    start = done + d
                    result.allocation.add(
                        tid,
                        task.tenant,
                        start - sum(part),
                        start,
                        (part[0], part[1], part[2], part[3]),
                    )
                    run_of[tid] = run_of.get(tid, 0) + 1
                    started_at[tid] = start
                    self._push(start + task.duration, _END, (p, tid, run_of[tid]))
                    if verdict.repartition:
                        result.repartitions += 1
                    for victim in verdict.preempted:
                        result.preemptions += 1
                        vid = victim.task_id
                        result.add_busy(started_at[vid], max(done, started_at[vid]))
                        run_of[vid] += 1  # its pending end is void
                        victim_task = by_id[vid]
                        g_victim = self.setup.tenant_scheduler[victim_task.tenant]
                        self._push(done + d, _GM_MSG, (g_victim, ("preempted", victim_task)))
                self._push(done + d, _GM_MSG, (request.gm, (verdict, request)))
            elif kind == _END:
                p, tid, run = payload
                if run_of.get(tid) != run:
                    continue  # preempted: this end never happens
                ended = self.owners[p].end(tid, now)
                if isinstance(ended, Ended):
                    result.add_busy(started_at[tid], now)
                    result.completed += 1
                    self._remaining -= 1
                    last_end = max(last_end, now)
                    self._push(now + d, _GM_MSG, (ended.task.gm, ended))
            elif kind == _HEARTBEAT:
                p = payload
                if self._remaining > 0:
                    summary = self.owners[p].summary(now)
                    self._push(now + d, _GM_ALL, summary)
                    self._push(now + timing.heartbeat_s, _HEARTBEAT, p)
            elif kind == _SAMPLE and self._remaining > 0:
                usage = sum(o.tenant_usage for o in self.owners)
                shares = (usage / np.maximum(total_capacity, 1)).max(axis=1)
                result.share_times.append(now)
                result.share_rows.append([float(s) for s in shares])
                backlog = [0] * len(self.setup.tenant_scheduler)
                for sched in self.schedulers:
                    for tenant, queue in sched.queues.items():
                        backlog[tenant] += len(queue)
                result.backlog_rows.append(backlog)
                assert self.setup.share_sample_s is not None
                self._push(now + self.setup.share_sample_s, _SAMPLE, None)
        result.events = events
        result.span_s = last_end - first
        return result

    def _arrive(self, task: Task, now: float) -> None:
        """``task`` enters its tenant's queue (anew, after a preemption)."""
        self._mark[task.task_id] = now
        self._parts[task.task_id] = [0.0, 0.0, 0.0, 0.0]
        self._retrying.discard(task.task_id)
        g = self.setup.tenant_scheduler[task.tenant]
        self.schedulers[g].enqueue(task)
        self._wake(self.gm, g, _GM_WAKE, now)

    def _gm_handle(
        self,
        g: int,
        message: Any,
        now: float,
        result: FederationResult,
    ) -> float:
        """Apply one message at scheduler ``g``; its processing cost."""
        sched = self.schedulers[g]
        per_host = self.timing.apply_per_host_s
        if isinstance(message, PoolSummary):
            sched.view.apply(message)
            return per_host * int(message.free.shape[0])
        if isinstance(message, Ended):
            ended = message.task
            sched.charge(ended.tenant, np.asarray(ended.demand, dtype=np.int64), -1)
            sched.view.apply(message.summary)
            return per_host * int(message.summary.free.shape[0])
        if isinstance(message, tuple) and message and message[0] == "preempted":
            victim: Task = message[1]
            sched.charge(victim.tenant, np.asarray(victim.demand, dtype=np.int64), -1)
            self._arrive(victim, now)
            return 0.0
        verdict, request = message
        if isinstance(verdict, Accepted):
            sched.view.apply(verdict.summary)
            return per_host * int(verdict.summary.free.shape[0])
        assert isinstance(verdict, Refused)
        sched.view.forget(request.pool, request.seq)
        sched.charge(request.task.tenant, np.asarray(request.task.demand, dtype=np.int64), -1)
        if verdict.final:
            # the request itself was wrong: the task is dropped with the reason
            result.final_refusals += 1
            if len(result.final_reasons) < 100:
                result.final_reasons.append(verdict.reason)
            self._remaining -= 1
            return 0.0
        result.stale_refusals += 1
        cost = 0.0
        if verdict.summary is not None:
            sched.view.apply(verdict.summary)
            cost = per_host * int(verdict.summary.free.shape[0])
        self._retrying.add(request.task.task_id)
        sched.enqueue(request.task, front=True)
        return cost
