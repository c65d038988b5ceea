"""A global scheduler's launches whose verdict it acts on, and the resources they ask
for per tenant, kept as launches go out and verdicts come back (Algorithm 2 counts a
tenant's launches in flight as its usage, and a round must not sum them again)."""

from __future__ import annotations

import numpy as np

from lavad.federation.messages import Task
from lavad.federation.request_ledger import LaunchId


class LaunchesInFlight:
    def __init__(self, tenants: int, resources: int) -> None:
        self._tasks: dict[LaunchId, Task] = {}
        self.usage = np.zeros((tenants, resources), dtype=np.int64)

    def add(self, launch: LaunchId, task: Task) -> None:
        self.pop(launch)  # the same launch twice counts once
        self._tasks[launch] = task
        self.usage[task.tenant] += np.asarray(task.demand, dtype=np.int64)

    def pop(self, launch: LaunchId) -> Task | None:
        task = self._tasks.pop(launch, None)
        if task is not None:
            self.usage[task.tenant] -= np.asarray(task.demand, dtype=np.int64)
        return task

    def ids(self) -> list[LaunchId]:
        return list(self._tasks)

    def tasks(self) -> list[Task]:
        return list(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)
