"""Canonical events as JSON lines (what ``trace_tools.convert`` writes), read back.

Every line goes through ``lavad.streams.codec.decode_event``, the same door
untrusted bytes take in the live shell, so a converted trace is validated
exactly like a Kafka record. A line that fails becomes a BadRecord carrying
``SchemaError``'s text. Blank lines are skipped: they hold no record.

The events come out in time order, each pool's in the order of its lines,
as the live shell applies a pool's records in the order of its partition:

* Each pool's lines are kept in time order by refusing as few as possible
  (``order_refusals``): an event earlier than its pool's last one let
  through is a BadRecord ("out of order"), a late arrival; so is an event
  later than two or more of the next events of its pool. Without the
  second rule one record stamped far ahead (milliseconds written as
  seconds, a skewed clock) would make every later event of its pool
  "earlier than its predecessor", and the rest of the pool would be
  dead-lettered for one bad line. Live, such a record is refused by
  itself too (``daemon.live.intake.record_time_refusal``).
* The pools are merged by time (equal times in line order), so a file whose
  pools are interleaved in any order (``lavad tail`` of an input topic
  prints its partitions as they are fetched) replays as the live shell
  decided it, not with most of its lines refused as out of order.

That takes two passes over the file: the first decodes every line and keeps
where it is, its time and its pool (36 bytes a line), the second reads
the lines again in the merged order. A line that is not an event (it does
not decode, or is refused) comes out after the event on the line before it.

JSON lines carry no trace metadata, so ``end_time`` is None unless given as
the ``end_time`` option (e.g. the censoring time of the trace it came from).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final

import numpy as np

from lavad.streams.adapters.base import Trace, TraceItem, TraceOptionError, bad_record
from lavad.streams.codec import SchemaError, decode_event

SUFFIXES: Final = frozenset({".jsonl", ".ndjson"})

# How many of the next events of its pool ``order_refusals`` weighs an event
# against. A run of up to LOOKAHEAD_EVENTS - 2 records stamped ahead of their
# pool is refused by itself; a longer run is taken as the pool's time, and
# the events behind it are refused.
LOOKAHEAD_EVENTS: Final = 8
# An event is refused as ahead of its pool when letting it through would
# refuse at least this many of the events after it (refusing it costs one).
_BEHIND_TO_REFUSE: Final = 2
# The pool index of a line that did not decode.
_BAD: Final = -1


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
                "by time, each pool's lines in their order; an event earlier than its pool's"
                f" last one let through, or later than {_BEHIND_TO_REFUSE} or more of its"
                f" pool's next {LOOKAHEAD_EVENTS} events, is a BadRecord"
            ),
            "pool": "as recorded in each event (the pool option is not applied)",
        }

    def events(self) -> Iterator[TraceItem]:
        with self.path.open("rb") as handle:
            index = LineIndex.read(handle)
            yield from index.merged(handle, self.path)


def order_refusals(times: Sequence[float], lookahead: int = LOOKAHEAD_EVENTS) -> list[str | None]:
    """Why each of one pool's events (times in line order) is refused, or None: as few as
    it can, so that those let through are in time order.

    An event earlier than the last one let through is refused, as a late
    arrival. So is an event that at least two of the ``lookahead`` events
    after it are earlier than (and not earlier than the last let through):
    letting it through would refuse those, refusing it costs one. Work is
    ``len(times) * lookahead``, whatever the times.
    """
    if lookahead < 1:
        raise ValueError("lookahead must be >= 1")
    refusals: list[str | None] = [None] * len(times)
    last = -math.inf
    for i, time in enumerate(times):
        if time < last:
            refusals[i] = f"out of order: time {time} after {last}"
            continue
        after = times[i + 1 : i + 1 + lookahead]
        behind = sum(1 for t in after if last <= t < time)
        if behind >= _BEHIND_TO_REFUSE:
            refusals[i] = (
                f"out of order: time {time} is later than {behind} of the next {len(after)}"
                f" events of its pool (the last let through is at {last}), so it is refused"
                " rather than they"
            )
            continue
        last = time
    return refusals


class LineIndex:
    """Where each line of a file of JSON lines is, its time and its pool (or that it is bad)."""

    def __init__(self) -> None:
        self.offsets = array("q")
        self.lengths = array("q")
        self.linenos = array("q")
        self.times = array("d")
        self.pools = array("i")  # into pool_names; _BAD for a line that did not decode
        self.pool_names: dict[str, int] = {}

    @classmethod
    def read(cls, handle: BinaryIO) -> LineIndex:
        """The first pass: every line decoded once, kept as where it is, not what it holds."""
        index = cls()
        offset = 0
        for lineno, raw in enumerate(handle, start=1):
            if raw.strip():
                try:
                    event = decode_event(raw)
                except SchemaError:
                    pool, time = _BAD, math.nan
                else:
                    names = index.pool_names
                    pool = names.setdefault(event.pool, len(names))
                    time = event.time
                index.offsets.append(offset)
                index.lengths.append(len(raw))
                index.linenos.append(lineno)
                index.times.append(time)
                index.pools.append(pool)
            offset += len(raw)
        return index

    def merged(self, handle: BinaryIO, source: Path | str) -> Iterator[TraceItem]:
        """The second pass: the events in time order (each pool's refusals applied), each
        line that is not one (bad, or refused) after the event on the line before it."""
        pools = np.frombuffer(self.pools, dtype=np.int32) if self.pools else np.zeros(0, np.int32)
        times = np.frombuffer(self.times) if self.times else np.zeros(0)
        refusals: dict[int, str] = {}
        # Each pool's lines, in line order: one stable sort, however many pools.
        by_pool = np.argsort(pools, kind="stable")
        starts = np.flatnonzero(np.diff(pools[by_pool], prepend=_BAD - 1))
        for members in np.split(by_pool, starts[1:]):
            if not len(members) or pools[members[0]] == _BAD:
                continue  # an empty file; the lines that did not decode
            for position, reason in zip(
                members.tolist(), order_refusals(times[members].tolist()), strict=True
            ):
                if reason is not None:
                    refusals[position] = reason
        taken = pools != _BAD
        taken[list(refusals)] = False
        events_in_line_order = np.flatnonzero(taken)
        # Line order breaks ties: a pool's own events keep their order at equal times.
        accepted = events_in_line_order[np.argsort(times[events_in_line_order], kind="stable")]
        # A line that is not an event follows the event on the line before it
        # (before every event when none is): in a file already in time order,
        # everything comes out in line order.
        others = np.flatnonzero(~taken)
        anchors = np.searchsorted(events_in_line_order, others) - 1
        following: dict[int, list[int]] = {}
        for other, anchor in zip(others.tolist(), anchors.tolist(), strict=True):
            key = int(events_in_line_order[anchor]) if anchor >= 0 else -1
            following.setdefault(key, []).append(other)
        for other in following.get(-1, ()):
            yield self._refused(handle, source, other, refusals)
        for position in accepted.tolist():
            lineno, raw = self._line(handle, position)
            try:
                yield decode_event(raw)
            except SchemaError as exc:  # the file changed between the passes
                yield bad_record(source, lineno, raw, str(exc))
            for other in following.get(position, ()):
                yield self._refused(handle, source, other, refusals)

    def _line(self, handle: BinaryIO, position: int) -> tuple[int, bytes]:
        handle.seek(self.offsets[position])
        return self.linenos[position], handle.read(self.lengths[position])

    def _refused(
        self, handle: BinaryIO, source: Path | str, position: int, refusals: dict[int, str]
    ) -> TraceItem:
        lineno, raw = self._line(handle, position)
        reason = refusals.get(position)
        if reason is None:
            try:
                decode_event(raw)
            except SchemaError as exc:
                reason = str(exc)
            else:
                reason = "the line decodes now but did not on the first pass (the file changed)"
        return bad_record(source, lineno, raw, reason)
