"""The tasks running in every pool as the verdicts topic tells them (every global
scheduler reads it whole): what Algorithm 2 needs live to pick victims and to know each
tenant's usage. An accepted launch or preemption starts a task, a preemption's verdict
names the tasks it ended, an accepted end ends one.

Both inputs are kept as tasks start and end, so a scheduling round costs nothing per
running task: each tenant's usage is a running sum, and each pool's candidates are a
read-through view of its tasks but those some preemption in flight is ending
(``leaving``), never copied. ``in_pool`` is the recomputation they must equal."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import numpy.typing as npt

from lavad.federation.messages import RunningTask, Task


class PoolTasks:
    """One pool's running tasks but those leaving, read in place, and by tenant (a
    preemption's victim search reads only the tenant it takes from)."""

    __slots__ = ("_by_tenant", "_leaving", "_tasks")

    def __init__(
        self,
        tasks: Mapping[int, RunningTask],
        by_tenant: list[dict[int, RunningTask]],
        leaving: set[int],
    ) -> None:
        self._tasks = tasks
        self._by_tenant = by_tenant
        self._leaving = leaving

    def __iter__(self) -> Iterator[RunningTask]:
        leaving = self._leaving
        return (task for task in self._tasks.values() if task.task_id not in leaving)

    def of_tenant(self, tenant: int) -> Iterator[RunningTask]:
        leaving = self._leaving
        tasks = self._by_tenant[tenant].values() if 0 <= tenant < len(self._by_tenant) else ()
        return (task for task in tasks if task.task_id not in leaving)


def of_tenant(tasks: Iterable[RunningTask], tenant: int) -> Iterator[RunningTask]:
    """``tenant``'s tasks among ``tasks``: from the index where they are a pool's view."""
    if isinstance(tasks, PoolTasks):
        return tasks.of_tenant(tenant)
    return (task for task in tasks if task.tenant == tenant)


class RunningTasks:
    def __init__(self, pools: int, tenants: int, resources: int) -> None:
        self._by_pool: list[dict[int, RunningTask]] = [{} for _ in range(pools)]
        self._by_tenant: list[list[dict[int, RunningTask]]] = [
            [{} for _ in range(tenants)] for _ in range(pools)
        ]
        self._where: dict[int, tuple[int, Task]] = {}  # task -> (pool, the task)
        self.usage = np.zeros((tenants, resources), dtype=np.int64)
        self._leaving: dict[object, tuple[int, ...]] = {}  # a preemption in flight -> victims
        self._leaving_tasks: set[int] = set()
        self.pools = [
            PoolTasks(tasks, by_tenant, self._leaving_tasks)
            for tasks, by_tenant in zip(self._by_pool, self._by_tenant, strict=True)
        ]

    def started(self, task: Task, gm: int, pool: int, host: int, at: float) -> None:
        self.ended(task.task_id)  # a replayed verdict: the same task, not a second one
        running = RunningTask(task.task_id, task.tenant, gm, host, task.demand, at)
        self._by_pool[pool][task.task_id] = running
        self._by_tenant[pool][task.tenant][task.task_id] = running
        self._where[task.task_id] = (pool, task)
        self.usage[task.tenant] += np.asarray(task.demand, dtype=np.int64)

    def ended(self, task_id: int) -> Task | None:
        """The task, if it was running."""
        found = self._where.pop(task_id, None)
        if found is None:
            return None
        pool, task = found
        del self._by_pool[pool][task_id]
        del self._by_tenant[pool][task.tenant][task_id]
        self.usage[task.tenant] -= np.asarray(task.demand, dtype=np.int64)
        return task

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._where

    def leaving(self, preemption: object, victims: tuple[int, ...]) -> None:
        """A preemption of ours in flight: its victims are no longer candidates."""
        self.answered(preemption)  # the same preemption again replaces its victims
        self._leaving[preemption] = victims
        self._leaving_tasks.update(victims)

    def answered(self, preemption: object) -> None:
        """The preemption's verdict came: its victims ended, or are candidates again."""
        victims = self._leaving.pop(preemption, None)
        if victims is None:
            return
        self._leaving_tasks.difference_update(victims)
        for others in self._leaving.values():  # a victim named by two: still leaving
            self._leaving_tasks.update(v for v in others if v in victims)

    def leaving_now(self) -> set[int]:
        return set(self._leaving_tasks)

    def in_pool(self, pool: int, leaving: set[int]) -> tuple[RunningTask, ...]:
        """Pool ``pool``'s tasks but those in ``leaving``, recomputed (a copy)."""
        return tuple(t for t in self._by_pool[pool].values() if t.task_id not in leaving)

    def tenant_usage(self) -> npt.NDArray[np.int64]:
        return self.usage.copy()
