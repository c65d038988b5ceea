"""Autopilot's horizontal scaling (section 3.3) on recorded instance counts (DLRM apps).

The DLRM trace records, per app (a deployment), when each instance was
created and deleted, but no usage. What an app's operators ran is taken as
its demand: with every instance at the target utilisation r*, the app's
total usage in task units is ``r* n(t)``, so the scaler's raw
recommendation is the horizon's maximum of n, and what is measured is what
Autopilot's stabilisation (deferred downscaling, limited growth, slow
decay, deferred small changes) costs and saves against the recorded counts
on a 5-minute grid:

- over-provisioning: recommended instance-hours above the recorded, over
  the recorded instance-hours;
- shortfall: recorded instance-hours above the recommendation (growth
  limited by initialising instances), over the recorded instance-hours;
- changes per app-day of the recommendation and of the recorded count.

Apps are scored from their first instance to the trace's last event.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lavad.models.limits.histogram import INTERVAL_S
from lavad.models.limits.horizontal import HorizontalConfig, HorizontalScaler
from lavad.streams.adapters import open_trace
from lavad.streams.schema import VmExit, VmRequest

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class HorizontalScore:
    """Recommended against recorded instance counts, over every app."""

    apps: int
    app_days: float
    recorded_instance_hours: float
    over_provisioning: float
    shortfall: float
    recommended_changes_per_app_day: float
    recorded_changes_per_app_day: float


App = tuple[str, str]  # (pool, deployment): a JSON-lines trace may hold several pools


def instance_counts(path: Path) -> tuple[dict[App, list[tuple[float, int]]], float]:
    """Per app (deployment), the running instance count after each change; the trace's end."""
    deployment: dict[tuple[str, str], App] = {}  # (pool, VM) -> its app
    changes: dict[App, list[tuple[float, int]]] = defaultdict(list)
    end = 0.0
    for event in open_trace(path).events():
        if isinstance(event, VmRequest) and event.deployment:
            app = (event.pool, event.deployment)
            deployment[(event.pool, event.vm_id)] = app
            changes[app].append((event.time, 1))
            end = max(end, event.time)
        elif isinstance(event, VmExit) and (event.pool, event.vm_id) in deployment:
            changes[deployment.pop((event.pool, event.vm_id))].append((event.time, -1))
            end = max(end, event.time)
    counts: dict[App, list[tuple[float, int]]] = {}
    for app, steps in changes.items():
        running = 0
        series = []
        for time, step in sorted(steps):
            running += step
            series.append((time, running))
        counts[app] = series
    return counts, end


def replay_app(
    series: list[tuple[float, int]], end: float, config: HorizontalConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Recorded and recommended counts on the 5-minute grid from the app's first instance."""
    start = math.ceil(series[0][0] / INTERVAL_S) * INTERVAL_S
    grid = np.arange(start, max(end, start) + INTERVAL_S, INTERVAL_S)
    times = np.array([t for t, _ in series])
    values = np.array([n for _, n in series])
    recorded = values[np.searchsorted(times, grid, side="right") - 1]
    scaler = HorizontalScaler(config, replicas=max(config.min_replicas, int(recorded[0])))
    recommended = np.empty(len(grid), dtype=np.int64)
    for index, (time, count) in enumerate(zip(grid.tolist(), recorded.tolist(), strict=True)):
        recommended[index] = scaler.replicas  # what ran during this window
        scaler.observe(time, config.target_utilization * max(count, 0))
    return recorded, recommended


def evaluate_horizontal(path: Path, config: HorizontalConfig | None = None) -> HorizontalScore:
    """The scaler on every app of a trace with deployments."""
    cfg = config or HorizontalConfig()
    counts, end = instance_counts(path)
    if not counts:
        # The caller names the trace (the command line prefixes its path).
        raise ValueError("no VM request names a deployment")
    recorded_total = over = short = 0.0
    days = 0.0
    recommended_changes = recorded_changes = 0
    for series in counts.values():
        recorded, recommended = replay_app(series, end, cfg)
        hours = INTERVAL_S / 3600.0
        recorded_total += float(recorded.sum()) * hours
        over += float(np.maximum(recommended - recorded, 0).sum()) * hours
        short += float(np.maximum(recorded - recommended, 0).sum()) * hours
        days += len(recorded) * INTERVAL_S / DAY_S
        recommended_changes += int(np.count_nonzero(np.diff(recommended)))
        recorded_changes += int(np.count_nonzero(np.diff(recorded)))
    return HorizontalScore(
        apps=len(counts),
        app_days=days,
        recorded_instance_hours=recorded_total,
        over_provisioning=over / recorded_total if recorded_total else math.nan,
        shortfall=short / recorded_total if recorded_total else math.nan,
        recommended_changes_per_app_day=recommended_changes / days if days else math.nan,
        recorded_changes_per_app_day=recorded_changes / days if days else math.nan,
    )
