"""Requests/s through a Megha federation for 1, 2 and 4 global schedulers, as ratios to 1.

In the event-time simulator (``lavad.federation.simulator``), not live: 20,000 tasks
of the Megha GOOG trace (their real durations) arrive at once at a federation of 4
pools with room for all of them, 4 tenant queues spread over the schedulers. The
figure is the simulated rate (tasks / time to the last start), which the timing model
sets (a scheduler's match and an owner's validation take their modelled costs; each
is one server); next to it, the simulator's own wall-clock rate on this machine.

``python -m benchmarks.federation`` (or ``python -m benchmarks --federation``, which also
runs ``benchmarks.federation_live``: the same counts as processes over Kafka).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from lavad.federation.messages import Task
from lavad.federation.simulator import FederationSetup, FederationSimulator, tasks_of
from lavad.federation.timing import TimingModel
from lavad.federation.topology import uniform_topology
from lavad.federation.trace import read_jobs

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "megha-traces" / "GOOG_subtrace.tr"
SLICE = ROOT / "data" / "megha-goog-slice" / "GOOG_subtrace_head200.tr"


def burst(count: int) -> list[Task]:
    path = SHARED if SHARED.is_file() else SLICE
    tasks = tasks_of(read_jobs(path, max_jobs=2_000), 4, (1,), by="task")[:count]
    return [replace(task, arrival=0.0) for task in tasks]


def federation_throughput(
    schedulers: tuple[int, ...] = (1, 2, 4), count: int = 20_000, pools: int = 4
) -> list[tuple[int, float, float]]:
    """Per scheduler count: (schedulers, simulated requests/s, simulator wall requests/s)."""
    tasks = burst(count)
    rows = []
    for gms in schedulers:
        topology = uniform_topology(pools, (2 * count) // pools, gms)
        setup = FederationSetup(topology, tuple(t % gms for t in range(4)))
        started = time.perf_counter()
        result = FederationSimulator(setup, TimingModel()).run(tasks)
        wall = time.perf_counter() - started
        last_start = max(result.allocation.start)
        rows.append((gms, len(tasks) / last_start, len(tasks) / wall))
    return rows


def main() -> None:
    rows = federation_throughput()
    base = rows[0][1]
    print("federation (event-time simulator, Megha timing model): 20,000 tasks at once")
    for gms, simulated, wall in rows:
        print(
            f"  {gms} global scheduler(s): {simulated:10,.0f} requests/s simulated "
            f"({simulated / base:4.2f}x of 1)   simulator itself {wall:8,.0f} requests/s wall"
        )


if __name__ == "__main__":
    main()
