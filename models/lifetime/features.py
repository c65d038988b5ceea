"""The grouping keys of a VM request, finest first; nothing from the future.

Levels (the model backs off from the first to the last until a group has
enough observations):

0. tenant and shape: the tenant's (or batch's) own history;
1. shape, hour of day in 6-hour blocks, and batch size class;
2. shape;
3. everything (one group per pool).

A feature whose name mentions the lifetime, exit or duration is refused:
such a value would come from the future (a trace's oracle lifetime).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

LEVELS = 4
_FUTURE_WORDS = ("lifetime", "exit", "duration", "end")


def lifetime_keys(
    tenant: str,
    cores: float,
    memory_gib: float,
    flavor: str,
    features: Mapping[str, object],
) -> tuple[Hashable, ...]:
    for name in features:
        if any(word in name.lower() for word in _FUTURE_WORDS):
            raise ValueError(f"feature {name!r} would leak the future into the lifetime model")
    shape = flavor or f"{cores:g}c{memory_gib:g}g"
    hour = features.get("hour_of_day")
    block = int(hour) // 6 if isinstance(hour, int | float) else None
    batch = features.get("batch_size")
    size = (
        None
        if not isinstance(batch, int | float)
        else (1 if batch <= 1 else 2 if batch <= 8 else 3)
    )
    return ((tenant, shape), (shape, block, size), (shape,), ())
