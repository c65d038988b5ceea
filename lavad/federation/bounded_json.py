"""The first step of every federation decoder: one bounded JSON document off a topic."""

from __future__ import annotations

from typing import Any

import orjson


def load_bounded(data: bytes, most: int, error: type[ValueError], prefix: str = "") -> Any:
    """The JSON ``data`` holds, or ``error`` saying why not (after ``prefix``).

    The size is checked before parsing, so an absurd record costs a length
    check, not a parse.
    """
    if len(data) > most:
        raise error(f"{prefix}{len(data)} bytes, more than {most}")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise error(f"{prefix}not JSON ({exc})") from None
