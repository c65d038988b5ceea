"""Bounded least-recently-seen bookkeeping, kept as a plain ``dict[key, None]``.

A dict keeps insertion order, so re-inserting a key on each sighting leaves the
oldest first; the dict itself is what snapshots hold, which is why this is a
function over it rather than a class of its own.
"""

from __future__ import annotations

from typing import TypeVar

_Key = TypeVar("_Key")


def touch(order: dict[_Key, None], key: _Key, most: int) -> list[_Key]:
    """Record a sighting of ``key``; drop and return the oldest keys past ``most``."""
    order.pop(key, None)
    order[key] = None
    dropped: list[_Key] = []
    while len(order) > most:
        oldest = next(iter(order))
        del order[oldest]
        dropped.append(oldest)
    return dropped
