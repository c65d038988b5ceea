"""Bounds on what the input may ask of the engine: event times and pool names.

The core's types, and the ``[input]`` and ``[pools]`` tables of the
configuration: the settings validate them by the constraints below (one
definition for the core and the shells).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from pydantic import BeforeValidator, ConfigDict, Field


@dataclass(frozen=True, slots=True)
class InputBounds:
    """The ``[input]`` table: plausible event times; an event outside them is dead-lettered."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    max_time: Annotated[
        float,
        Field(
            gt=0,
            allow_inf_nan=False,
            description="event times beyond this are implausible (default 2100-01-01 in Unix"
            " seconds: catches milliseconds sent as seconds)",
        ),
    ] = 4_102_444_800.0
    max_ahead_s: Annotated[
        float,
        Field(
            ge=0,
            allow_inf_nan=False,
            description="how far an event may be ahead of its pool's clock (0: no bound)",
        ),
    ] = 2_592_000.0
    max_behind_s: Annotated[
        float,
        Field(
            ge=0,
            allow_inf_nan=False,
            description="how far behind its pool's clock an event is still handled (at the"
            " pool's clock); further behind is dead-lettered",
        ),
    ] = 3_600.0


# The shortest interval of a periodic look in event time (the defragmenter's,
# the relief's). The engine fires every missed look after a jump in event time,
# so this bounds that work: a jump of max_ahead_s (30 days) costs at most
# 43,200 looks, not one per nanosecond of a configured 1e-9.
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
    """The ``[pools]`` table: each pool keeps its state for ever, so both are bounded."""

    __pydantic_config__ = ConfigDict(extra="forbid")

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
