"""The tasks running in every pool as the verdicts topic tells them (every global
scheduler reads it whole): what Algorithm 2 needs live to pick victims and to know each
tenant's usage. An accepted launch or preemption starts a task, a preemption's verdict
names the tasks it ended, an accepted end ends one."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lavad.federation.messages import RunningTask, Task


class RunningTasks:
    def __init__(self, pools: int, tenants: int, resources: int) -> None:
        self._by_pool: list[dict[int, RunningTask]] = [{} for _ in range(pools)]
        self._where: dict[int, tuple[int, Task]] = {}  # task -> (pool, the task)
        self.usage = np.zeros((tenants, resources), dtype=np.int64)

    def started(self, task: Task, gm: int, pool: int, host: int, at: float) -> None:
        self.ended(task.task_id)  # a replayed verdict: the same task, not a second one
        self._by_pool[pool][task.task_id] = RunningTask(
            task.task_id, task.tenant, gm, host, task.demand, at
        )
        self._where[task.task_id] = (pool, task)
        self.usage[task.tenant] += np.asarray(task.demand, dtype=np.int64)

    def ended(self, task_id: int) -> Task | None:
        """The task, if it was running."""
        found = self._where.pop(task_id, None)
        if found is None:
            return None
        pool, task = found
        del self._by_pool[pool][task_id]
        self.usage[task.tenant] -= np.asarray(task.demand, dtype=np.int64)
        return task

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._where

    def in_pool(self, pool: int, leaving: set[int]) -> tuple[RunningTask, ...]:
        """Pool ``pool``'s tasks but those in ``leaving`` (a preemption of them in flight)."""
        return tuple(t for t in self._by_pool[pool].values() if t.task_id not in leaving)

    def tenant_usage(self) -> npt.NDArray[np.int64]:
        return self.usage.copy()
