"""Falling behind: the consumer lag grows sample after sample while the daemon is ready.

``/readyz`` says the daemon holds its partitions and reaches the broker, not
that it keeps up. ``FallingBehind`` reads the total consumer lag each time
the gauges refresh (``live.cluster_gauges_s``) and turns on when the lag
grew at each of ``live.falling_behind_samples`` consecutive samples and by
at least ``live.falling_behind_records`` in all; it turns off after as many
consecutive samples without growth. Its state is five numbers and the
assignment it watches, whatever the run's length.

A sample taken while not ready, or under another assignment than the one
before (a rebalance moves lag between instances), starts the watch afresh:
only growth within one steady assignment counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import structlog

log = structlog.get_logger("lavad.live")


class Change(Enum):
    """How one sample changed the watch's verdict."""

    FALLING_BEHIND = "falling_behind"  # turned on
    STOPPED_GROWING = "stopped_growing"  # turned off: the lag stayed or shrank
    RESET = "reset"  # turned off: not ready, or the assignment changed


@dataclass(frozen=True, slots=True)
class LagReading:
    """The lag of each assigned input partition at one refresh."""

    by_partition: Mapping[tuple[str, int], int]

    @property
    def total(self) -> int:
        return sum(self.by_partition.values())

    @property
    def assignment(self) -> frozenset[tuple[str, int]]:
        return frozenset(self.by_partition)


class FallingBehind:
    """The detector: feed it each reading; it says when its verdict changes.

    ``samples`` 0 turns it off (it never turns on).
    """

    def __init__(self, samples: int, min_growth: int) -> None:
        if samples < 0 or min_growth < 1:
            raise ValueError("samples must be >= 0 and min_growth >= 1")
        self.samples = samples
        self.min_growth = min_growth
        self.on = False
        self._previous: int | None = None
        self._assignment: frozenset[tuple[str, int]] = frozenset()
        # The lag when the current run of growth started, its length, and
        # the samples in a row without growth.
        self._start = 0
        self._grown = 0
        self._flat = 0

    def observe(self, reading: LagReading, *, ready: bool) -> Change | None:
        lag = reading.total
        if not ready or reading.assignment != self._assignment or self._previous is None:
            was_on = self.on
            self._restart(lag if ready else None, reading.assignment)
            return Change.RESET if was_on else None
        if lag > self._previous:
            self._grown += 1
            self._flat = 0
        else:
            self._grown = 0
            self._start = lag
            self._flat += 1
        self._previous = lag
        if self.samples == 0:
            return None
        if not self.on and self._grown >= self.samples and lag - self._start >= self.min_growth:
            self.on = True
            return Change.FALLING_BEHIND
        if self.on and self._flat >= self.samples:
            self.on = False
            return Change.STOPPED_GROWING
        return None

    @property
    def growth(self) -> int:
        """Records the lag grew by over the current run of growth (0 when none)."""
        return 0 if self._previous is None else self._previous - self._start

    def _restart(self, lag: int | None, assignment: frozenset[tuple[str, int]]) -> None:
        self.on = False
        self._previous = lag
        self._assignment = assignment
        self._start = lag or 0
        self._grown = 0
        self._flat = 0


class _Gauge(Protocol):
    def set(self, value: float) -> None: ...


class LagWatch:
    """The detector wired to its gauge and its log lines (one per change of verdict)."""

    def __init__(self, detector: FallingBehind, gauge: _Gauge, interval_s: float) -> None:
        self.detector = detector
        self.gauge = gauge
        self.interval_s = interval_s

    def observe(self, reading: LagReading | None, *, ready: bool) -> Change | None:
        if reading is None:
            return None
        change = self.detector.observe(reading, ready=ready)
        self.gauge.set(1.0 if self.detector.on else 0.0)
        if change is Change.FALLING_BEHIND:
            fields: dict[str, Any] = {
                "lag_records": reading.total,
                "grew_by_records": self.detector.growth,
                "samples": self.detector.samples,
                "over_s": self.detector.samples * self.interval_s,
                "partitions": len(reading.by_partition),
            }
            log.warning("falling behind", **fields)
        elif change is not None:
            log.info("no longer falling behind", reason=change.value, lag_records=reading.total)
        return change
