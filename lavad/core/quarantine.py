"""A pool the engine stopped deciding for after a defect: the bulkhead between pools.

An event the engine cannot handle for a reason it knows (an exit of an
unknown VM, a time too far ahead) is refused and changes nothing. An
exception it does not know is a defect in lavad: the pool's state may be
half-changed, and the next event of that pool would meet the same state.
Under ``on_defect = "stop"`` (replay, tests: a run whose figures miss an
event must fail) the exception leaves the engine. Under ``"quarantine"``
(the live daemon's default) the pool is quarantined instead:

* the record that failed is refused (stage ``defect``), with the error;
* every later record of that pool is refused (stage ``quarantined``)
  without touching its state, after the time check that keeps an absurd
  record from moving the other pools' clocks;
* its timers no longer run; the other pools go on deciding as before.

A pool whose opening raised has no state to protect: its records are refused
the same way while this engine runs, and not snapshotted, so an instance that
takes it (or a restart) tries to open it again.

Refused records go to the dead-letter topic and stay in the input topics, so
nothing is lost: once the defect is fixed, the pool's state is rebuilt from
the input topics (its snapshot moved away), which decides the quarantined
records again. The quarantined pool's state gives way to a husk (the pool as
newly opened, ``Engine._mark``), and the quarantine is part of it, so a restart
or a rebalance keeps it rather than deciding on a state that failed, and
nothing the defect left can fail the partition's snapshots.

Why not go on with the pool as it is: a defect met half-way leaves a host's
booking without its VM, or a model's counts without the exit, and every
later decision of the pool would build on that silently. Why not stop the
daemon (kube-scheduler re-panics; Kafka Streams fails by default): the same
record comes back at every restart, and every pool of the partition stops
with the one that failed.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, replace
from typing import Literal

# "stop": a defect's exception leaves the engine; "quarantine": the pool is.
DefectPolicy = Literal["stop", "quarantine"]

# An exception's text can hold a whole array or a record: the reason that
# travels in a dead letter's header keeps its start, the trace its end
# (where the failing line is).
MAX_ERROR_CHARS = 500
MAX_TRACE_CHARS = 8_000


def error_text(exc: BaseException) -> str:
    """``exc``'s type and message, at most MAX_ERROR_CHARS: for a reason or a header."""
    error = f"{type(exc).__name__}: {exc}"
    if len(error) > MAX_ERROR_CHARS:
        error = error[: MAX_ERROR_CHARS - 3] + "..."
    return error


def trace_text(exc: BaseException) -> str:
    """``exc``'s formatted traceback, its last MAX_TRACE_CHARS: for the operator's log."""
    return "".join(traceback.format_exception(exc))[-MAX_TRACE_CHARS:]


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Why and when a pool was quarantined."""

    # The event time it failed at: its event's, or the time its timers ran to.
    time: float
    # What the pool was doing: "vm.request event", "timers", ...
    during: str
    # The exception's type and message, at most MAX_ERROR_CHARS.
    error: str
    # The formatted traceback's last MAX_TRACE_CHARS, for the operator's log.
    trace: str

    @classmethod
    def of(cls, exc: Exception, time: float, during: str) -> Quarantine:
        return cls(time, during, error_text(exc), trace_text(exc))

    def without_husk(self, exc: Exception) -> Quarantine:
        """This quarantine, its trace saying the pool's failed state was kept because
        opening its husk raised ``exc`` (its snapshots may then fail)."""
        error = error_text(exc)
        trace = f"{self.trace}\nThe pool's failed state is kept: opening its husk raised {error}"
        return replace(self, trace=trace[-MAX_TRACE_CHARS:])

    def defect(self, pool: str) -> str:
        """The reason the failing record is refused with."""
        return (
            f"defect in lavad ({self.during} of pool {pool!r}): {self.error};"
            f" the pool is quarantined"
        )

    def refusal(self, pool: str) -> str:
        """The reason each later record of the pool is refused with."""
        return (
            f"pool {pool!r} is quarantined since a defect at event time {self.time:.3f}"
            f" ({self.during}: {self.error}); rebuild its state from the input topics"
            f" once the defect is fixed"
        )
