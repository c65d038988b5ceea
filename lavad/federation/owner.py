"""A pool owner (Megha's Local Master): the only holder, and changer, of a pool's state.

Every launch and preemption a global scheduler sends is checked against the true state:
accepted (the owner's summary comes back with it, as Megha piggybacks its state on
responses) or refused with the reason and, when the view was merely stale, the owner's
current summary for the scheduler to apply before it retries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lavad.federation.messages import (
    Accepted,
    Ended,
    LaunchRequest,
    PoolSummary,
    PreemptRequest,
    Refused,
    RunningTask,
    Task,
    Verdict,
)
from lavad.federation.topology import IntArray, Pool


@dataclass(eq=False)
class PoolOwner:
    owner_id: str
    pool: Pool
    schedulers: int
    tenants: int
    summaries_carry_tasks: bool = field(default=False, kw_only=True)
    free: IntArray = field(init=False)
    tenant_usage: IntArray = field(init=False)
    running: dict[int, RunningTask] = field(init=False, default_factory=dict)
    seen_seq: list[int] = field(init=False)
    version: int = field(init=False, default=0)
    queue_length: int = field(init=False, default=0)
    repartitions: int = field(init=False, default=0)
    preemptions: int = field(init=False, default=0)
    refusals: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        capacity = self.pool.capacity
        self.free = capacity.copy()
        self.tenant_usage = np.zeros((self.tenants, capacity.shape[1]), dtype=np.int64)
        self.seen_seq = [0] * self.schedulers

    # -- state out ------------------------------------------------------------------

    def summary(self, now: float) -> PoolSummary:
        self.version += 1
        free = self.free.copy()
        free.setflags(write=False)
        usage = self.tenant_usage.copy()
        usage.setflags(write=False)
        running = tuple(self.running.values()) if self.summaries_carry_tasks else None
        return PoolSummary(
            pool=self.pool.index,
            owner=self.owner_id,
            version=self.version,
            sent_at=now,
            free=free,
            seen_seq=tuple(self.seen_seq),
            tenant_usage=usage,
            queue_length=self.queue_length,
            running=running,
        )

    # -- requests in ----------------------------------------------------------------

    def launch(self, request: LaunchRequest, now: float) -> Verdict:
        final = self._check(request.gm, request.seq, request.pool, request.host, request.task)
        if final is not None:
            return self._refuse(request.pool, request.task.task_id, request.seq, final, now, True)
        self._seen(request.gm, request.seq)
        demand = np.asarray(request.task.demand, dtype=np.int64)
        host = request.host
        is_home = int(self.pool.home[host]) == request.gm
        if request.repartition == is_home:
            where = "its own partition" if is_home else f"partition {int(self.pool.home[host])}"
            reason = f"host {host} is in {where}: repartition={request.repartition} is wrong"
            return self._refuse(request.pool, request.task.task_id, request.seq, reason, now, True)
        if not bool(np.all(self.free[host] >= demand)):
            reason = (
                f"stale view: host {host} has {self.free[host].tolist()} free, "
                f"task {request.task.task_id} needs {list(request.task.demand)}"
            )
            return self._refuse(request.pool, request.task.task_id, request.seq, reason, now, False)
        self._start(request.task, request.gm, host, demand, now)
        if request.repartition:
            self.repartitions += 1
        return Accepted(
            pool=self.pool.index,
            host=host,
            task_id=request.task.task_id,
            seq=request.seq,
            repartition=request.repartition,
            preempted=(),
            summary=self.summary(now),
        )

    def preempt(self, request: PreemptRequest, now: float) -> Verdict:
        final = self._check(request.gm, request.seq, request.pool, request.host, request.task)
        if final is not None:
            return self._refuse(request.pool, request.task.task_id, request.seq, final, now, True)
        self._seen(request.gm, request.seq)
        task_id = request.task.task_id
        if not request.victims:
            return self._refuse(request.pool, task_id, request.seq, "no victims named", now, True)
        victims: list[RunningTask] = []
        for victim_id in request.victims:
            victim = self.running.get(victim_id)
            if victim is None:
                reason = f"preemption of task {victim_id}, which is not running (it ended)"
                return self._refuse(request.pool, task_id, request.seq, reason, now, False)
            if victim.host != request.host:
                reason = f"task {victim_id} runs on host {victim.host}, not {request.host}"
                return self._refuse(request.pool, task_id, request.seq, reason, now, False)
            if victim.tenant == request.task.tenant:
                reason = f"task {victim_id} belongs to tenant {victim.tenant}, the requester"
                return self._refuse(request.pool, task_id, request.seq, reason, now, True)
            victims.append(victim)
        demand = np.asarray(request.task.demand, dtype=np.int64)
        freed = self.free[request.host] + np.sum([v.demand for v in victims], axis=0)
        if not bool(np.all(freed >= demand)):
            reason = (
                f"preempting {list(request.victims)} frees {freed.tolist()} on host "
                f"{request.host}, task {task_id} needs {list(request.task.demand)}"
            )
            return self._refuse(request.pool, task_id, request.seq, reason, now, False)
        for victim in victims:
            self._stop(victim)
        self.preemptions += len(victims)
        self._start(request.task, request.gm, request.host, demand, now)
        return Accepted(
            pool=self.pool.index,
            host=request.host,
            task_id=task_id,
            seq=request.seq,
            repartition=int(self.pool.home[request.host]) != request.gm,
            preempted=tuple(victims),
            summary=self.summary(now),
        )

    def end(self, task_id: int, now: float) -> Ended | Refused:
        """The task finished: its resources return to its host (a loan ends with it)."""
        task = self.running.get(task_id)
        if task is None:
            reason = f"end of task {task_id}, which is not running here"
            return self._refuse(self.pool.index, task_id, 0, reason, now, True)
        self._stop(task)
        return Ended(task=task, summary=self.summary(now))

    # -- helpers --------------------------------------------------------------------

    def _check(self, gm: int, seq: int, pool: int, host: int, task: Task) -> str | None:
        """The reason a request is wrong whatever the state, or None."""
        if pool != self.pool.index:
            return f"request for pool {pool} sent to the owner of pool {self.pool.index}"
        if not 0 <= gm < self.schedulers:
            return f"unknown global scheduler {gm}"
        if not 0 <= host < self.pool.hosts:
            return f"pool {pool} has no host {host} (it has {self.pool.hosts})"
        if not 0 <= task.tenant < self.tenants:
            return f"unknown tenant {task.tenant}"
        if len(task.demand) != self.free.shape[1] or min(task.demand) < 0:
            return f"demand {list(task.demand)} is not {self.free.shape[1]} counts >= 0"
        if task.task_id in self.running:
            return f"task {task.task_id} is already running"
        label = int(self.pool.labels[host])
        if label & task.constraints != task.constraints:
            return f"host {host} lacks labels {task.constraints & ~label:#x} of task {task.task_id}"
        if seq <= self.seen_seq[gm]:
            return f"request seq {seq} of scheduler {gm} is not after {self.seen_seq[gm]}"
        return None

    def _seen(self, gm: int, seq: int) -> None:
        self.seen_seq[gm] = seq

    def _start(self, task: Task, gm: int, host: int, demand: np.ndarray, now: float) -> None:
        self.free[host] -= demand
        self.tenant_usage[task.tenant] += demand
        self.running[task.task_id] = RunningTask(
            task_id=task.task_id,
            tenant=task.tenant,
            gm=gm,
            host=host,
            demand=task.demand,
            start=now,
        )

    def _stop(self, task: RunningTask) -> None:
        demand = np.asarray(task.demand, dtype=np.int64)
        self.free[task.host] += demand
        self.tenant_usage[task.tenant] -= demand
        del self.running[task.task_id]

    def _refuse(
        self, pool: int, task_id: int, seq: int, reason: str, now: float, final: bool
    ) -> Refused:
        self.refusals.append(reason)
        if len(self.refusals) > 1000:  # bounded: the newest reasons are kept
            del self.refusals[:500]
        return Refused(
            pool=pool,
            task_id=task_id,
            seq=seq,
            reason=reason,
            final=final,
            summary=None if final else self.summary(now),
        )
