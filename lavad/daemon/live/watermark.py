"""The event-time watermark that drives the engine's timers in the live shell.

Rule: the watermark is the smallest "latest event time" over the assigned
input partitions that are *active*. A partition is active while it has
delivered a record within the last ``idle_after_s`` seconds of wall time (a
just-assigned partition counts as active for that long, so a restart does not
run timers ahead of a partition that is about to catch up). When every
partition is idle, the watermark is the largest event time seen, so a quiet
fleet still gets its timers. The watermark never moves backwards.

Why: timers (LAVA deadlines, reprediction sweeps) must not fire ahead of
events still queued on a slow partition, yet one silent partition (a pool
with no traffic) must not stall every other pool's timers forever. Wall time
is used only to decide idleness, never as event time.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class _PartitionClock:
    event_time: float
    last_wall: float


class Watermark:
    def __init__(self, idle_after_s: float) -> None:
        if idle_after_s <= 0:
            raise ValueError(f"idle_after_s must be positive, got {idle_after_s}")
        self.idle_after_s = idle_after_s
        self._clocks: dict[Hashable, _PartitionClock] = {}
        self._value = float("-inf")

    def assign(self, partitions: Iterable[Hashable], wall: float) -> None:
        for partition in partitions:
            self._clocks.setdefault(partition, _PartitionClock(float("-inf"), wall))

    def revoke(self, partitions: Iterable[Hashable]) -> None:
        for partition in partitions:
            self._clocks.pop(partition, None)

    def observe(self, partition: Hashable, event_time: float, wall: float) -> None:
        clock = self._clocks.get(partition)
        if clock is None:
            clock = self._clocks[partition] = _PartitionClock(event_time, wall)
        clock.event_time = max(clock.event_time, event_time)
        clock.last_wall = wall

    def current(self, wall: float) -> float:
        """The watermark at wall-clock ``wall`` (monotonic)."""
        active = [
            clock.event_time
            for clock in self._clocks.values()
            if wall - clock.last_wall < self.idle_after_s
        ]
        if active:
            candidate = min(active)
        else:
            candidate = max((c.event_time for c in self._clocks.values()), default=float("-inf"))
        self._value = max(self._value, candidate)
        return self._value
