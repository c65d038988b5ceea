"""Argument types the benchmarks' command lines share: a bad value stops the
command at once, naming the argument and the reason, before any broker starts
or trace is read, not as a traceback (or a run that never paces) later."""

from __future__ import annotations

import argparse
import math


def at_least_one(raw: str) -> int:
    """An argument that counts something: a whole number of at least 1."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a whole number, got {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"want at least 1, got {value}")
    return value


def above_zero(raw: str) -> float:
    """A rate or a length of time: a finite number above 0 (a rate of 0 or NaN would
    divide by it, and infinity would publish unpaced)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a number, got {raw!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"want a finite number above 0, got {raw!r}")
    return value
