"""The grouping keys of a VM request, finest first; nothing from the future.

Levels (the model backs off from the first to the last until a group has
enough observations):

0. tenant and shape: the tenant's (or batch's) own history;
1. shape, hour of day in 6-hour blocks, and batch size class;
2. shape;
3. everything (one group per pool).

Only the features named here are read (``hour_of_day``, ``batch_size``):
anything else a producer sends, a trace's oracle lifetime included, cannot
leak into the model.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

LEVELS = 4
USED_FEATURES = ("hour_of_day", "batch_size")
# Where a replay puts a VM's true lifetime for the oracle policies. The model
# never reads it; only a tracker built with ``oracle`` does.
ORACLE_FEATURE = "oracle_lifetime_s"


def lifetime_keys(
    tenant: str,
    cores: float,
    memory_gib: float,
    flavor: str,
    features: Mapping[str, object],
) -> tuple[Hashable, ...]:
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
