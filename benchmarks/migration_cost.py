"""What drains cost a replay: the bundled Azure slice under LAS on a fixed pool.

Three replays in one process: no drains (the baseline), rolling maintenance
with LARS acting, and the same with the four other orders counted beside it
(the evaluation's same-drains shadows). Reported: events per second, the
ratio to the baseline, migrations, and the extra wall time over the baseline
per migration (within noise when it is near 0).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from lavad.core.engine import EngineConfig, HostShape, PoolSetup
from lavad.core.migrations.config import MigrationsConfig, RollingConfig
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.replay import replay
from lavad.evaluation.migrations import COMPARED
from lavad.streams.adapters import open_trace
from lavad.streams.oracle import exit_times, with_true_lifetimes


def migration_cost(path: Path) -> None:
    trace = open_trace(path, seed=0)
    exits = exit_times(open_trace(path, seed=0).events())
    end = trace.end_time if trace.end_time is not None else float("inf")
    events = list(with_true_lifetimes(trace.events(), exits, end))
    first = events[0].time
    base = EngineConfig(
        policy="las",
        policy_args=validate_policy_args("las", {}),
        pools=PoolSetup(shape=HostShape(48.0, 192.0), initial_hosts=440),
    )
    rolling = MigrationsConfig(rolling=RollingConfig(5, 2 * 3600.0, first + 3600.0))
    runs = {
        "no drains": base,
        "rolling maintenance, LARS": dataclasses.replace(base, migrations=rolling),
        "  + 5 orders beside it": dataclasses.replace(
            base, migrations=dataclasses.replace(rolling, compare=COMPARED)
        ),
    }
    print(f"migration cost on {path.name} (LAS, 440 hosts, 5 hosts drained every 2 h)")
    baseline: float | None = None
    for label, config in runs.items():
        began = time.perf_counter()
        result = replay(events, config, end_time=trace.end_time)
        wall = time.perf_counter() - began
        if baseline is None:
            baseline = wall
        summary = result.pools["default"].get("migrations") or {}
        moved = int(summary.get("migrations", 0))
        extra = f"{1e6 * (wall - baseline) / moved:+8.0f} us extra per migration" if moved else ""
        print(
            f"  {label:<28}{result.events / wall:>10,.0f} events/s  {baseline / wall:5.2f}x"
            f"  {moved:>6,} migrations  {extra}"
        )
