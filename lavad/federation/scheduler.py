"""A global scheduler (Megha's Global Master): tenant queues served round-robin, and for
each task a choice made on the eventually consistent view:

1. its internal partitions, one pool after the other from a round-robin cursor
   (Algorithm 1 in each);
2. else the other schedulers' partitions, pools again round-robin: a repartition;
3. else, with fair shares configured, a preemption (Algorithm 2);
4. else requeue: "unfit, may retry" once the view changes.

The scheduler decides; the owner validates. ``decide`` never changes the view: the
caller reserves what it sends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lavad.federation.fairness import Shares, may_preempt, victims_on_host, violators
from lavad.federation.messages import RunningTask, Task
from lavad.federation.running_tasks import of_tenant
from lavad.federation.topology import Topology
from lavad.federation.view import GlobalView


@dataclass(frozen=True, slots=True)
class Launch:
    pool: int
    host: int
    repartition: bool


@dataclass(frozen=True, slots=True)
class Preempt:
    pool: int
    host: int
    victims: tuple[int, ...]
    victim_tenant: int


@dataclass(frozen=True, slots=True)
class Requeue:
    """Unfit on this view, may retry when it changes."""

    reason: str


Choice = Launch | Preempt | Requeue


class GlobalScheduler:
    def __init__(
        self,
        gm: int,
        topology: Topology,
        view: GlobalView,
        tenants: list[int],
        shares: Shares | None = None,
    ) -> None:
        self.gm = gm
        self.topology = topology
        self.view = view
        self.shares = shares
        self.total = topology.total_capacity()
        # per partition kind, the pool its round-robin search starts from
        self._cursors = dict.fromkeys(("internal", "external"), gm % len(topology.pools))
        self.queues: dict[int, deque[Task]] = {t: deque() for t in tenants}
        self._order = list(tenants)
        self._next = 0
        self._blocked_epoch: dict[int, int] = {}
        self._count = 0
        self.seq = 0
        # the resources this scheduler's own tenants hold or have launches in flight for:
        # exact (Megha: "each GM has consistent state information about its own queues"),
        # where the view's usage of other tenants may be up to a heartbeat old
        self.own_usage = {t: np.zeros(len(topology.resources), dtype=np.int64) for t in tenants}

    # -- queues ---------------------------------------------------------------------

    def enqueue(self, task: Task, *, front: bool = False) -> None:
        queue = self.queues.get(task.tenant)
        if queue is None:
            raise ValueError(f"tenant {task.tenant}'s queue is not on scheduler {self.gm}")
        if front:
            queue.appendleft(task)
        else:
            queue.append(task)
        self._count += 1

    def queued(self) -> int:
        return self._count

    def next_task(self) -> Task | None:
        """The head of the next tenant queue, round-robin, skipping queues parked on this view."""
        for _ in range(len(self._order)):
            tenant = self._order[self._next]
            self._next = (self._next + 1) % len(self._order)
            queue = self.queues[tenant]
            if queue and self._blocked_epoch.get(tenant, -1) != self.view.epoch:
                self._count -= 1
                return queue.popleft()
        return None

    def park(self, task: Task) -> None:
        """The task found no host: back to its queue's head; the queue waits for a new view."""
        self.queues[task.tenant].appendleft(task)
        self._count += 1
        self._blocked_epoch[task.tenant] = self.view.epoch

    def drop(self, tasks: set[int]) -> int:
        """Take ``tasks`` out of the queues (their tenant queue moved to another scheduler);
        how many were queued."""
        dropped = 0
        for tenant, queue in self.queues.items():
            kept = deque(t for t in queue if t.task_id not in tasks)
            dropped += len(queue) - len(kept)
            self.queues[tenant] = kept
        self._count -= dropped
        return dropped

    def charge(self, tenant: int, demand: npt.NDArray[np.int64], sign: int) -> None:
        """A launch sent (+1), or a task of ``tenant`` refused, ended or preempted (-1)."""
        self.own_usage[tenant] += sign * demand

    # -- decisions ------------------------------------------------------------------

    def decide(self, task: Task) -> tuple[Choice, int]:
        """The choice for ``task`` and the hosts scanned to make it."""
        demand = np.asarray(task.demand, dtype=np.int64)
        scanned = 0
        for kind, repartition in (("internal", False), ("external", True)):
            pool, host, looked = self._round_robin_fit(kind, demand, task.constraints)
            scanned += looked
            if host >= 0:
                return Launch(pool=pool, host=host, repartition=repartition), scanned
        if self.shares is None:
            return Requeue("no host fits on this view"), scanned
        return self._preemption(task, demand), scanned

    def _round_robin_fit(
        self, kind: str, demand: npt.NDArray[np.int64], constraints: int
    ) -> tuple[int, int, int]:
        """The first pool from ``kind``'s cursor on with a host that fits on those partitions,
        that host (-1: none fits anywhere) and the hosts scanned; the cursor moves past the pool
        that fits."""
        n = len(self.topology.pools)
        start = self._cursors[kind]
        scanned = 0
        for step in range(n):
            p = (start + step) % n
            host, looked = self.view.fit(p, kind, demand, constraints)
            scanned += looked
            if host >= 0:
                self._cursors[kind] = (p + 1) % n
                return p, host, scanned
        return -1, -1, scanned

    def _preemption(self, task: Task, demand: npt.NDArray[np.int64]) -> Choice:
        assert self.shares is not None
        usage = self.view.tenant_usage().copy()
        for tenant, held in self.own_usage.items():
            usage[tenant] = held
        if not may_preempt(task.tenant, usage, self.total, demand, self.shares):
            return Requeue(f"tenant {task.tenant} would pass its share: requeued")
        for victim_tenant in violators(task.tenant, usage, self.total, self.shares, demand):
            found = self._victims(victim_tenant, demand, task.constraints)
            if found is not None:
                return found
        return Requeue("no tenant over its share has a task to preempt on a fitting host")

    def _victims(
        self, tenant: int, demand: npt.NDArray[np.int64], constraints: int
    ) -> Preempt | None:
        for pool in self.topology.pools:
            by_host: dict[int, list[RunningTask]] = {}
            for running in of_tenant(self.view.running[pool.index], tenant):
                by_host.setdefault(running.host, []).append(running)
            for host in sorted(by_host):
                label = int(pool.labels[host])
                if label & constraints != constraints:
                    continue
                chosen = victims_on_host(
                    by_host[host], tenant, self.view.free[pool.index][host], demand
                )
                if chosen:
                    return Preempt(pool=pool.index, host=host, victims=chosen, victim_tenant=tenant)
        return None
