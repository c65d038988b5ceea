"""What a live global scheduler's round costs to prepare Algorithm 2's inputs, recomputed
from every running task (as it was) against kept as tasks start and end (as it is), at
1,000, 10,000 and 100,000 running tasks.

The round (``Scheduler.fairness_view`` in ``lavad/federation/live_scheduler.py``): each
pool's candidates (its running tasks but the victims of our preemptions in flight) and
every tenant's usage with our launches in flight. Recomputed: a tuple per pool built
from all running tasks, and the in-flight launches summed. Kept: the read-through pool
views and the two running sums (``running_tasks.py``, ``inflight.py``). A preemption's
victim search then reads the pool's tasks either way; it happens only when no host
fits, and is timed apart (one search over every pool, the victims' tenant's tasks).

``python -m benchmarks.federation_fairness_round``
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from lavad.federation.inflight import LaunchesInFlight
from lavad.federation.messages import RunningTask, Task
from lavad.federation.running_tasks import RunningTasks, of_tenant

POOLS, TENANTS, RESOURCES = 10, 4, 2
IN_FLIGHT = 200  # launches awaiting their verdict
PREEMPTIONS = 4  # preemptions in flight, 2 victims each
REPEATS = 5


def populated(count: int, seed: int = 0) -> tuple[RunningTasks, LaunchesInFlight]:
    rng = random.Random(seed)
    running = RunningTasks(POOLS, TENANTS, RESOURCES)
    for tid in range(count):
        task = Task(tid, tid, rng.randrange(TENANTS), (1, rng.randrange(1, 4)), 0, 60.0, 0.0)
        running.started(task, gm=0, pool=tid % POOLS, host=rng.randrange(1000), at=float(tid))
    inflight = LaunchesInFlight(TENANTS, RESOURCES)
    for i in range(IN_FLIGHT):
        task = Task(count + i, 0, i % TENANTS, (1, 1), 0, 60.0, 0.0)
        inflight.add((count + i, 1), task)
    for p in range(PREEMPTIONS):
        running.leaving((count + IN_FLIGHT + p, 1), (2 * p, 2 * p + 1))
    return running, inflight


def recomputed_round(
    running: RunningTasks, inflight: LaunchesInFlight
) -> tuple[list[Iterable[RunningTask]], npt.NDArray[np.int64]]:
    """As the round was: every pool's tuple and the in-flight sum built again."""
    leaving = running.leaving_now()
    pools: list[Iterable[RunningTask]] = [running.in_pool(p, leaving) for p in range(POOLS)]
    usage = running.tenant_usage()
    for task in inflight.tasks():
        usage[task.tenant] += np.asarray(task.demand, dtype=np.int64)
    return pools, usage


def kept_round(
    running: RunningTasks, inflight: LaunchesInFlight
) -> tuple[list[Iterable[RunningTask]], npt.NDArray[np.int64]]:
    """As the round is: the views as they are, the running sums added."""
    pools: list[Iterable[RunningTask]] = list(running.pools)
    return pools, running.usage + inflight.usage


def victim_search(pools: list[Iterable[RunningTask]], tenant: int) -> int:
    """What ``GlobalScheduler._victims`` reads: the tenant's tasks by host, every pool
    (``of_tenant``: from the per-tenant index on views, by filtering on tuples)."""
    found = 0
    for tasks in pools:
        by_host: dict[int, list[RunningTask]] = {}
        for task in of_tenant(tasks, tenant):
            by_host.setdefault(task.host, []).append(task)
        found += len(by_host)
    return found


def per_call_s(work: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(rounds):
            work()
        best = min(best, (time.perf_counter() - started) / rounds)
    return best


def measure(count: int) -> tuple[float, float, float, float]:
    """Seconds per round recomputed and kept, and per victim search on either's pools."""
    running, inflight = populated(count)
    old_pools, old_usage = recomputed_round(running, inflight)
    new_pools, new_usage = kept_round(running, inflight)
    assert np.array_equal(old_usage, new_usage)
    assert [list(p) for p in old_pools] == [list(p) for p in new_pools]
    rounds = max(3, 200_000 // count)
    return (
        per_call_s(lambda: recomputed_round(running, inflight), rounds),
        per_call_s(lambda: kept_round(running, inflight), rounds),
        per_call_s(lambda: victim_search(old_pools, 1), 3),
        per_call_s(lambda: victim_search(new_pools, 1), 3),
    )


def main() -> None:
    print(
        f"fairness inputs per round ({POOLS} pools, {TENANTS} tenants, {IN_FLIGHT} launches "
        f"and {PREEMPTIONS} preemptions in flight; best of {REPEATS}; shared machine)"
    )
    for count in (1_000, 10_000, 100_000):
        old, new, search_old, search_new = measure(count)
        print(
            f"  {count:>7,} running: recomputed {old * 1e6:10,.1f} us   kept {new * 1e6:6,.1f} us"
            f"   ({old / new:7,.0f}x less)   a victim search: {search_old * 1e3:7.2f} ms on "
            f"tuples, {search_new * 1e3:7.2f} ms on views ({search_new / search_old:4.2f}x)"
        )


if __name__ == "__main__":
    main()
