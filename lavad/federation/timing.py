"""The event-time cost model: what each step of the federation takes, in seconds.

A model, not a measurement: the replay must be deterministic, so no clock is read.
``network_delay_s`` is Megha's (and Sparrow's simulator's) 0.5 ms a message. The
processing costs stand for a scheduler's match (a base plus a cost per host scanned,
Algorithm 1's bit-vector pass), applying a summary (per host it carries) and an owner's
validation; each server (scheduler, owner) does one thing at a time, so these costs
also make the queues of section III.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class TimingModel:
    network_delay_s: float = 0.0005
    decide_s: float = 50e-6
    scan_per_host_s: float = 20e-9
    apply_per_host_s: float = 10e-9
    validate_s: float = 50e-6
    heartbeat_s: float = 10.0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not math.isfinite(value) or value < 0.0:
                raise ValueError(f"timing.{field.name}: want a finite number >= 0, got {value}")
        if self.heartbeat_s <= 0.0:
            raise ValueError(f"timing.heartbeat_s: want > 0, got {self.heartbeat_s}")
