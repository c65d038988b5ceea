"""VMs that left since the last refit, kept for the refit's prequential count.

The mixture (``mixture.py``) scores its members, and the frailty
(``frailty.py``) counts an owner's deaths, on what resolved between two
refits: the VMs still running, and those that left in between, each kept as
(its group rows, its start, how long it was seen, whether it exited). Both
checkpoint that list; this is its one writing and reading back.
"""

from __future__ import annotations

from typing import Any

from lavad.models.lifetime.features import LEVELS
from lavad.models.lifetime.grouped import GroupRows

Pending = tuple[GroupRows, float, float, bool]


def pending_as_data(pending: list[Pending]) -> list[list[object]]:
    """The pending list as a checkpoint holds it: [rows, start, seen, exited] each."""
    return [[list(rows), start, seen, exited] for rows, start, seen, exited in pending]


def restore_pending(
    state: dict[str, Any], error: type[ValueError], what: str
) -> tuple[float | None, list[Pending]]:
    """A checkpoint's ``last_scored`` and ``pending``, or ``error`` naming the bad one."""
    last = state.get("last_scored")
    if last is not None and not isinstance(last, float | int):
        raise error(f"{what} checkpoint: bad 'last_scored'")
    pending = state.get("pending")
    if not isinstance(pending, list):
        raise error(f"{what} checkpoint: bad 'pending'")
    try:
        restored = [
            (tuple(int(r) for r in rows), float(start), float(seen), bool(exited))
            for rows, start, seen, exited in pending
        ]
    except (TypeError, ValueError):
        raise error(f"{what} checkpoint: bad 'pending'") from None
    if any(len(rows) != LEVELS for rows, _, _, _ in restored):
        raise error(f"{what} checkpoint: bad 'pending'")
    return (None if last is None else float(last)), restored
