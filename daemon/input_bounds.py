"""Bounds on what the input may ask of the engine: event times and pool names.

Defined apart from the settings so that the core (``daemon/engine.py``)
imports them without importing pydantic settings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InputBounds:
    """How far event time may stray: absolutely, ahead of and behind its pool's clock."""

    max_time: float = 4_102_444_800.0  # 2100-01-01 in Unix seconds
    max_ahead_s: float = 2_592_000.0  # 30 days; 0 = unbounded
    max_behind_s: float = 3_600.0


@dataclass(frozen=True, slots=True)
class PoolNames:
    """Which pool names an engine opens (fnmatch patterns), and how many at most."""

    allow: tuple[str, ...] = ("*",)
    max_pools: int = 10_000
