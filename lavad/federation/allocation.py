"""Allocation time (section III): from a task's arrival in its queue to its start on a
host, split into framework queueing (waiting in a scheduler's or an owner's queue, and
for capacity), processing (matching, validating), communication (the messages on the
path that succeeded) and retries (the time lost to launches refused on stale views)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

COMPONENTS = ("queueing", "processing", "communication", "retries")


@dataclass
class AllocationLog:
    """One row per start (a preempted task that starts again adds a row)."""

    task: list[int] = field(default_factory=list)
    tenant: list[int] = field(default_factory=list)
    arrival: list[float] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    queueing: list[float] = field(default_factory=list)
    processing: list[float] = field(default_factory=list)
    communication: list[float] = field(default_factory=list)
    retries: list[float] = field(default_factory=list)

    def add(
        self,
        task: int,
        tenant: int,
        arrival: float,
        start: float,
        parts: tuple[float, float, float, float],
    ) -> None:
        self.task.append(task)
        self.tenant.append(tenant)
        self.arrival.append(arrival)
        self.start.append(start)
        self.queueing.append(parts[0])
        self.processing.append(parts[1])
        self.communication.append(parts[2])
        self.retries.append(parts[3])

    def times(self) -> npt.NDArray[np.float64]:
        times: npt.NDArray[np.float64] = np.asarray(self.start) - np.asarray(self.arrival)
        return times

    def summary(self) -> dict[str, float]:
        """p50/p99/p99.9/max of allocation time, and each component's median and mean (s)."""
        times = self.times()
        if times.size == 0:
            return {"starts": 0}
        out: dict[str, float] = {
            "starts": int(times.size),
            "p50_s": float(np.percentile(times, 50)),
            "p99_s": float(np.percentile(times, 99)),
            "p99_9_s": float(np.percentile(times, 99.9)),
            "max_s": float(times.max()),
            "mean_s": float(times.mean()),
        }
        for name in COMPONENTS:
            values = np.asarray(getattr(self, name))
            out[f"{name}_median_s"] = float(np.median(values))
            out[f"{name}_mean_s"] = float(values.mean())
        return out
