"""Canonical events as JSON lines (what ``trace_tools.convert`` writes), read back.

Every line goes through ``lavad.streams.codec.decode_event``, the same door
untrusted bytes take in the live shell, so a converted trace is validated
exactly like a Kafka record. A line that fails becomes a BadRecord carrying
``SchemaError``'s text. The stream's promise (non-decreasing time) is checked
too: an event earlier than the one before it is a BadRecord ("out of order"),
not an event, since a replay would otherwise travel back in time. Blank lines
are skipped: they hold no record.

JSON lines carry no trace metadata, so ``end_time`` is None unless given as
the ``end_time`` option (e.g. the censoring time of the trace it came from).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from lavad.streams.adapters.base import Trace, TraceItem, TraceOptionError, bad_record
from lavad.streams.codec import SchemaError, decode_event

SUFFIXES: Final = frozenset({".jsonl", ".ndjson"})


def sniff(path: Path) -> bool:
    return path.is_file() and path.suffix in SUFFIXES


class JsonLines(Trace):
    """A file of canonical v1 events, one JSON object per line, validated on read."""

    name = "jsonl"
    options = frozenset({"end_time"})

    def __init__(self, path: Path, *, seed: int, pool: str, end_time: float | None = None) -> None:
        super().__init__(path, seed=seed, pool=pool)
        self._has_hosts: bool | None = None
        if end_time is not None:
            if isinstance(end_time, bool) or not isinstance(end_time, int | float):
                raise TraceOptionError(path, f"end_time must be a number, got {end_time!r}")
            if not math.isfinite(end_time) or end_time < 0:
                raise TraceOptionError(path, f"end_time must be finite and >= 0, got {end_time}")
            self.end_time = float(end_time)

    @property
    def has_hosts(self) -> bool:
        """Whether any line is a ``host.up`` event (a byte scan, cached; no parsing)."""
        if self._has_hosts is None:
            needle = b'"host.up"'
            tail = b""
            found = False
            with self.path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    if needle in tail + chunk[: len(needle)] or needle in chunk:
                        found = True
                        break
                    tail = chunk[-len(needle) :]
            self._has_hosts = found
        return self._has_hosts

    def facts(self) -> dict[str, Any]:
        return {
            "validation": "lavad.streams.codec.decode_event per line",
            "order": "an event earlier than its predecessor is a BadRecord",
            "pool": "as recorded in each event (the pool option is not applied)",
        }

    def events(self) -> Iterator[TraceItem]:
        last = -math.inf
        with self.path.open("rb") as handle:
            for lineno, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    event = decode_event(raw)
                except SchemaError as exc:
                    yield bad_record(self.path, lineno, raw, str(exc))
                    continue
                if event.time < last:
                    reason = f"out of order: time {event.time} after {last}"
                    yield bad_record(self.path, lineno, raw, reason)
                    continue
                last = event.time
                yield event
