"""Canonical events as JSON lines (what ``trace_tools.convert`` writes), read back.

Every line goes through ``lavad.streams.codec.decode_event``, the same door
untrusted bytes take in the live shell, so a converted trace is validated
exactly like a Kafka record. A line that fails becomes a BadRecord carrying
``SchemaError``'s text. Blank lines are skipped: they hold no record.

The stream's promise (non-decreasing time) is kept too, by refusing as few
events as it can (``in_order``): an event earlier than the last one let
through is a BadRecord ("out of order"), and so is an event later than
several of the events right after it. Without that second rule one record
stamped far ahead (milliseconds written as seconds, a skewed clock) would
make every event after it "earlier than its predecessor", and the rest of
the file would be dead-lettered for one bad line. Live, where records reach
the engine without this reader, such a record is refused by itself too
(``daemon.live.intake.record_time_refusal``).

JSON lines carry no trace metadata, so ``end_time`` is None unless given as
the ``end_time`` option (e.g. the censoring time of the trace it came from).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from lavad.streams.adapters.base import Trace, TraceItem, TraceOptionError, bad_record
from lavad.streams.codec import BadRecord, SchemaError, decode_event
from lavad.streams.schema import Event

SUFFIXES: Final = frozenset({".jsonl", ".ndjson"})

# How many of the events after an event ``in_order`` reads before it lets the
# event through or refuses it. A run of up to LOOKAHEAD_EVENTS - 2 records
# stamped ahead of the file is refused by itself; a longer run is taken as
# the file's time, and the events behind it are refused.
LOOKAHEAD_EVENTS: Final = 8
# Lines held at most while looking ahead (bad lines count too), so a file of
# mostly bad lines keeps the reader's memory bounded; with fewer events than
# LOOKAHEAD_EVENTS in that many lines, the decision is made on those.
MAX_HELD_LINES: Final = 1024
# An event is refused as ahead of the file when letting it through would
# refuse at least this many of the events after it (refusing it costs one).
_BEHIND_TO_REFUSE: Final = 2

# A decoded line: its number, its bytes, and its event or why it has none.
Line = tuple[int, bytes, Event | BadRecord]


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
            "order": (
                "an event earlier than the last one let through, or later than"
                f" {_BEHIND_TO_REFUSE} or more of the {LOOKAHEAD_EVENTS} events after it,"
                " is a BadRecord"
            ),
            "pool": "as recorded in each event (the pool option is not applied)",
        }

    def events(self) -> Iterator[TraceItem]:
        with self.path.open("rb") as handle:
            yield from in_order(self._decoded(handle), self.path)

    def _decoded(self, handle: Iterable[bytes]) -> Iterator[Line]:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                yield lineno, raw, decode_event(raw)
            except SchemaError as exc:
                yield lineno, raw, bad_record(self.path, lineno, raw, str(exc))


def in_order(
    lines: Iterable[Line],
    source: Path | str,
    lookahead: int = LOOKAHEAD_EVENTS,
    max_held: int = MAX_HELD_LINES,
) -> Iterator[TraceItem]:
    """The lines' events in non-decreasing time, refusing as few as it can; in line order.

    An event earlier than the last event let through is refused. So is an
    event that at least two of the ``lookahead`` events after it are earlier
    than (and not earlier than the last let through): letting it through
    would refuse those, refusing it costs one. One event behind its
    predecessor is refused itself, as a late arrival. Work per line is
    bounded by ``max_held``, whatever the times.
    """
    if lookahead < 1 or max_held < 2:
        raise ValueError("lookahead must be >= 1 and max_held >= 2")
    pending = iter(lines)
    held: deque[Line] = deque()
    events_held = 0
    read_all = False
    last = -math.inf
    while True:
        # Enough lines read to judge the first: it and ``lookahead`` events after it.
        while not read_all and events_held <= lookahead and len(held) < max_held:
            line = next(pending, None)
            if line is None:
                read_all = True
                break
            held.append(line)
            if not isinstance(line[2], BadRecord):
                events_held += 1
        if not held:
            return
        lineno, raw, item = held.popleft()
        if isinstance(item, BadRecord):
            yield item
            continue
        events_held -= 1
        time = item.time
        if time < last:
            yield bad_record(source, lineno, raw, f"out of order: time {time} after {last}")
            continue
        after = [line[2].time for line in held if not isinstance(line[2], BadRecord)]
        behind = sum(1 for t in after if last <= t < time)
        if behind >= _BEHIND_TO_REFUSE:
            reason = (
                f"out of order: time {time} is later than {behind} of the {len(after)} events"
                f" after it (the last event let through is at {last}), so it is refused"
                " rather than they"
            )
            yield bad_record(source, lineno, raw, reason)
            continue
        last = time
        yield item
