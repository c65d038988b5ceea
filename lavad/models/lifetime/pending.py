"""VMs that left since the last refit, kept for the refit's prequential count.

The mixture (``mixture.py``) scores its members, and the frailty
(``frailty.py``) counts an owner's deaths, on what resolved between two
refits: the VMs still running, and those that left in between, each kept as
(its group rows, its start, how long it was seen, whether it exited).
"""

from __future__ import annotations

from lavad.models.lifetime.protocol import GroupRows

Pending = tuple[GroupRows, float, float, bool]
