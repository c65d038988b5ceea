"""The range of a seed, for every setting and option that takes one.

A seed is written back out: into the metrics JSON and reports (orjson holds
integers of 64 bits) and into TOML (signed 64-bit integers). A larger one
was taken by the command line, drove a whole replay, and then failed to be
written with a traceback; so it is refused where it enters, with the range.
"""

from __future__ import annotations

from typing import Final

MIN_SEED: Final = 0
MAX_SEED: Final = 2**63 - 1
SEED_RANGE: Final = "an integer from 0 to 2**63 - 1"


def seed_refusal(seed: object) -> str | None:
    """Why ``seed`` is not a seed lavad takes, or None."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not MIN_SEED <= seed <= MAX_SEED:
        return f"seed must be {SEED_RANGE}, got {seed!r}"
    return None
