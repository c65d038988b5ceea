"""The grouping keys of a VM request, finest first; nothing from the future.

Levels (the model backs off from the first to the last until a group has
enough observations):

0. owner and shape: the tenant's (or batch's, or deployment's) own history;
1. shape, categorical features, hour of day in 6-hour blocks, batch size class;
2. shape and categorical features;
3. categorical features alone (with none, a copy of the pool-wide group);
4. everything (one group per pool).

The categorical features are the ones a trace's adapter declares that carry
a class, not a quantity (OpenB ``qos`` and ``gpu_spec``, DLRM ``role`` and
``preexisting``): ``DECLARED_CATEGORICAL``, or a policy's own list. Only the
features named there, ``hour_of_day`` and ``batch_size`` are read: anything
else a producer sends, a trace's oracle lifetime included, cannot leak into
the model. With no categorical features the groups are the ones lavad used
before they existed, the owner is the tenant alone, and level 3 repeats level 4
(so decisions are the same as with those four levels).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping

# Where a replay puts a VM's true lifetime for the oracle policies (re-exported:
# the lifetime code names it from here). The model never reads it; only a
# tracker built with ``oracle`` does.
from lavad.streams.oracle import ORACLE_FEATURE as ORACLE_FEATURE  # noqa: PLC0414
from lavad.streams.schema import VmPlaced, VmRequest

LEVELS = 5
USED_FEATURES = ("hour_of_day", "batch_size")
# Fields only a replay knows (the future); never a grouping feature.
ORACLE_FIELDS = frozenset({ORACLE_FEATURE})
# The class-valued features the adapters declare (streams/adapters/): a test
# holds every declared feature either here or in USED_FEATURES.
DECLARED_CATEGORICAL = ("gpu_spec", "preexisting", "qos", "role")
# A VM whose feature of this name is True existed before the recording began
# (DLRM instances without a creation time, requested at 0): its age is
# unknown, so what it lives from its request on is not a lifetime from
# creation. Left-truncated with an unknown entry age, it cannot be counted at
# all: counted as new, it filled the groups of DLRM's apps with lifetimes
# "from 0" that started weeks before, and P(T > 1 h) came out 0.95 against
# 0.74 observed (``lavad evaluate lifetime``). The models learn nothing from
# such VMs; they are still predicted and placed like any other.
LEFT_TRUNCATED = "preexisting"


def left_truncated(features: Mapping[str, object]) -> bool:
    """Whether the request says its VM existed before the recording (age unknown)."""
    return features.get(LEFT_TRUNCATED) is True


def categorical_values(
    features: Mapping[str, object], names: tuple[str, ...]
) -> tuple[Hashable, ...]:
    """The values of ``names`` (a string, bool or integer each; None for anything else)."""
    # Most traces carry none of them (Azure's requests): one set test in C
    # instead of a lookup per name, on every placement's path.
    if features.keys().isdisjoint(names):
        return (None,) * len(names)
    values: list[Hashable] = []
    for name in names:
        value = features.get(name)
        # Most traces declare none of them: skip the (slow, union) type test on None.
        if value is not None and not isinstance(value, str | bool | int):
            value = None
        values.append(value)
    return tuple(values)


@functools.lru_cache(maxsize=4096)
def _shape_name(cores: float, memory_gib: float) -> str:
    """A flavourless request's shape as a group key, e.g. ``4c16g``.

    Cached: a pool sees a few hundred shapes, and formatting two floats was
    a quarter of the time a request's keys took. Bounded, so a stream of new
    shapes costs the cache's size and no more; a pure function of its
    arguments, so what it holds never changes a key.
    """
    return f"{cores:g}c{memory_gib:g}g"


def lifetime_keys(
    tenant: str,
    cores: float,
    memory_gib: float,
    flavor: str,
    features: Mapping[str, object],
    *,
    deployment: str = "",
    categorical: tuple[str, ...] = (),
) -> tuple[Hashable, ...]:
    shape = flavor or _shape_name(cores, memory_gib)
    hour = features.get("hour_of_day")
    # Tuples, not ``int | float``: the same test, and cheaper once per request.
    block = int(hour) // 6 if isinstance(hour, (int, float)) else None
    batch = features.get("batch_size")
    size = (
        None
        if not isinstance(batch, (int, float))
        else (1 if batch <= 1 else 2 if batch <= 8 else 3)
    )
    if not categorical:
        return ((tenant, shape), (shape, block, size), (shape,), ("all",), ())
    # A deployment's replicas share an owner as a tenant's VMs do (DLRM apps).
    owner = tenant or deployment
    cats = categorical_values(features, categorical)
    return ((owner, shape), (shape, cats, block, size), (shape, cats), (cats,), ())


def request_keys(
    request: VmRequest | VmPlaced, categorical: tuple[str, ...] = ()
) -> tuple[Hashable, ...]:
    """``lifetime_keys`` of a request, or of a VM an external scheduler placed (shadow
    mode): the tracker and the lifetime evaluation group a VM the same way."""
    return lifetime_keys(
        request.tenant,
        request.cores,
        request.memory_gib,
        request.flavor,
        request.features,
        deployment=request.deployment,
        categorical=categorical,
    )
