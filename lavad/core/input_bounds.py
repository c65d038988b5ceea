"""Bounds on what the input may ask of the engine: event times and pool names.

The core's types, and the ``[input]`` and ``[pools]`` tables of the
configuration: the settings validate them by the constraints below (one
definition for the core and the shells). ``InputBounds.time_refusal`` is the
one rule on event times: the engine applies it to each pool's clock, and the
shells move the clock their timers run to only by times it does not refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final

import orjson
from pydantic import BeforeValidator, ConfigDict, Field

# The clock of a pool (or a shell) that has seen no event yet.
NEVER: Final = float("-inf")


@dataclass(frozen=True, slots=True)
class InputBounds:
    """The ``[input]`` table: plausible event times; an event outside them is dead-lettered."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_time: Annotated[
        float,
        Field(
            gt=0,
            description="event times beyond this are implausible (default 2100-01-01 in Unix"
            " seconds: catches milliseconds sent as seconds)",
        ),
    ] = 4_102_444_800.0
    max_ahead_s: Annotated[
        float,
        Field(
            ge=0,
            description="how far an event may be ahead of its pool's clock (0: no bound)",
        ),
    ] = 2_592_000.0
    max_behind_s: Annotated[
        float,
        Field(
            ge=0,
            description="how far behind its pool's clock an event is still handled (at the"
            " pool's clock); further behind is dead-lettered",
        ),
    ] = 3_600.0

    def time_refusal(self, now: float, clock: float, pool: str) -> str | None:
        """Why an event at ``now`` is implausible against ``clock``, or None.

        ``clock`` is the latest time the pool (or the shell's timer clock)
        took, ``NEVER`` before its first: a first event is bounded only by
        ``max_time``. Refused before anything moves, so one absurd record
        cannot drag a clock (and every timer driven by it) forward.
        """
        if not now <= self.max_time:  # also refuses NaN
            return (
                f"event time {now!r} is past input.max_time ({self.max_time!r}): "
                "an absurd time (milliseconds sent as seconds?)"
            )
        if now >= clock:
            if self.max_ahead_s and clock != NEVER and now - clock > self.max_ahead_s:
                return (
                    f"event time {now!r} is {now - clock:.0f} s ahead of pool {pool!r}'s "
                    f"clock {clock!r} (input.max_ahead_s = {self.max_ahead_s:g})"
                )
        elif clock - now > self.max_behind_s:
            return (
                f"event time {now!r} is {clock - now:.0f} s behind pool {pool!r}'s "
                f"clock {clock!r} (input.max_behind_s = {self.max_behind_s:g})"
            )
        return None


# The shortest interval of a periodic look in event time (the defragmenter's,
# the relief's, rolling maintenance's, a drain's retry, a lifetime model's
# refit). The engine fires every missed look after a jump in event time, so
# this bounds that work: a jump of max_ahead_s (30 days) costs at most 43,200
# looks, not one per nanosecond of a configured 1e-9. And an interval below
# the spacing of floats at the event times (5e-7 s near max_time) would
# schedule the next look at the same time forever: the engine hung on the
# first refit, retry or maintenance look.
MIN_CHECK_INTERVAL_S = 60.0


# A pool-name pattern: as long as a pool name may be (the schema's id bound).
PoolPattern = Annotated[str, Field(min_length=1, max_length=256)]


def _list_from_environment(value: Any) -> Any:
    """``LAVAD_POOLS__ALLOW='["prod-*"]'`` arrives as text: read it as the JSON list it is."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value  # refused by the tuple type, with the value shown
    return value


@dataclass(frozen=True, slots=True)
class PoolNames:
    """The ``[pools]`` table: each pool keeps its state for ever, so it is bounded."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    allow: Annotated[
        tuple[PoolPattern, ...],
        BeforeValidator(_list_from_environment),
        Field(
            min_length=1,
            max_length=1_000,
            description="fnmatch patterns of pool names; events of other pools are dead-lettered",
        ),
    ] = ("*",)
    max_pools: Annotated[
        int,
        Field(
            ge=1,
            description="pools one engine holds at most; events opening more are dead-lettered",
        ),
    ] = 10_000
    # A VM refused for good never runs, so its exit may never come: without a
    # bound a pool refusing for months keeps every such id (in memory and in
    # each snapshot). A million is above the count of every request of the
    # Azure V1 dev split (259,159): no replay of it forgets one.
    max_refused: Annotated[
        int,
        Field(
            ge=1,
            description="refused or evicted VMs a pool remembers (to absorb their exits and "
            "number their retries); past it the least recently refused half is forgotten",
        ),
    ] = 1_000_000
