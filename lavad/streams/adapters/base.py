"""What every trace adapter shares: the ``Trace`` interface, errors and merge helpers.

An adapter turns one recorded trace into canonical v1 events in non-decreasing
``time`` order. Rows it cannot turn into events come out of the same stream as
``BadRecord`` items (file, line, original bytes, reason) so that a replay can
dead-letter and count them exactly like the live shell does; nothing is
dropped silently and nothing in a trace crashes the stream.
"""

from __future__ import annotations

import csv
import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar

from lavad.streams.codec import BadRecord
from lavad.streams.schema import Event

T = TypeVar("T")

TraceItem = Event | BadRecord
"""What ``Trace.events()`` yields: an event, or a row that could not become one."""

# Bytes kept of a malformed record: enough to see what went wrong, bounded so
# a corrupted multi-megabyte line cannot blow up a dead-letter queue.
MAX_RAW_BYTES: Final = 64 * 1024


class TraceFormatError(ValueError):
    """A path that is not a trace lavad can read, or a trace missing a required file.

    Raised when the trace is opened, never mid-stream: problems inside rows
    become ``BadRecord`` items instead.
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason))


class TraceOptionError(TraceFormatError):
    """An option the trace format does not know, or a value it cannot use."""


class Trace(ABC):
    """One opened trace: static facts plus a re-iterable, time-ordered event stream.

    ``events()`` opens the files afresh on every call, so calling it twice
    yields the same sequence (all randomness is derived from ``seed``).
    """

    name: ClassVar[str]
    """Format name, as detected and as accepted by ``open_trace(format=...)``."""

    options: ClassVar[frozenset[str]] = frozenset()
    """Keyword options ``open_trace`` may pass to this format."""

    vm_features: ClassVar[tuple[str, ...]] = ()
    """The features its VM requests carry (known at the request: what a model may read)."""

    def __init__(self, path: Path, *, seed: int, pool: str) -> None:
        self.path = path
        self.seed = seed
        self.pool = pool
        self.end_time: float | None = None

    @property
    def has_hosts(self) -> bool:
        """Whether the stream brings its own hosts (``HostUp`` events).

        A replay of a trace without hosts must build the pool from its
        configuration instead.
        """
        return False

    @abstractmethod
    def events(self) -> Iterator[TraceItem]:
        """Yield the trace's events in non-decreasing time, with BadRecords in line."""

    def facts(self) -> dict[str, Any]:
        """Format-specific static facts for ``describe()``; override to add some."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Static facts (known without streaming the trace): format, files, rules, source."""
        info: dict[str, Any] = {
            "format": self.name,
            "path": str(self.path),
            "pool": self.pool,
            "seed": self.seed,
            "end_time": self.end_time,
            "has_hosts": self.has_hosts,
        }
        info.update(self.facts())
        return info

    def __iter__(self) -> Iterator[TraceItem]:
        return self.events()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(path={str(self.path)!r}, seed={self.seed}, pool={self.pool!r})"
        )


def pick_listed(
    path: Path,
    listed: Mapping[str, Path],
    name: str | None,
    *,
    what: str,
    default: str | None = None,
) -> tuple[str, Path] | None:
    """The file a trace folder lists under ``name``, or, without a name, under ``default``
    or alone; None when the folder lists several and none is chosen (the caller says how
    to choose one).

    Raises ``TraceOptionError`` for a ``name`` the folder does not list.
    """
    if name is not None:
        if name not in listed:
            raise TraceOptionError(
                path, f"no {what} {name!r} here; found {sorted(listed) or 'none'}"
            )
        return name, listed[name]
    if default is not None and default in listed:
        return default, listed[default]
    if len(listed) == 1:
        ((only, file),) = listed.items()
        return only, file
    return None


def bad_record(source: Path | str, lineno: int, raw: bytes | str, reason: str) -> BadRecord:
    """A BadRecord for line ``lineno`` of ``source``: the line's bytes without its end."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    data = data.rstrip(b"\r\n")
    return BadRecord(
        source=str(source),
        position=f"line {lineno}",
        raw=data[:MAX_RAW_BYTES],
        reason=reason,
    )


def with_later(pairs: Iterable[tuple[TraceItem, Event | None]]) -> Iterator[TraceItem]:
    """Interleave events known early but due later (exits, scale-ins) in time order.

    ``pairs`` yields ``(item, later)``: ``item`` is due now (items come in
    non-decreasing time; BadRecords pass through), ``later`` is an event the
    same row implies for a later time (a ``VmExit`` at deletion) or None
    (censored: no exit). Pending events wait in a heap, so memory is bounded by
    what is alive at once, not by the trace. A pending event due at the same
    instant as a new item comes first: capacity is freed before it is asked for
    again. Equal times keep the order in which they were pushed.
    """
    heap: list[tuple[float, int, Event]] = []
    seq = 0
    pop = heapq.heappop
    push = heapq.heappush
    for item, later in pairs:
        if not isinstance(item, BadRecord):
            now = item.time
            while heap and heap[0][0] <= now:
                yield pop(heap)[2]
        yield item
        if later is not None:
            push(heap, (later.time, seq, later))
            seq += 1
    while heap:
        yield pop(heap)[2]


def check_options(fmt: type[Trace], path: Path, options: Mapping[str, object]) -> None:
    """Reject options the format does not know, naming the ones it does."""
    unknown = sorted(set(options) - fmt.options)
    if unknown:
        known = ", ".join(sorted(fmt.options)) or "none"
        raise TraceOptionError(
            path, f"unknown option(s) {unknown} for format {fmt.name!r} (it accepts: {known})"
        )


class RowError(ValueError):
    """Why one row cannot become an event; adapters turn it into a BadRecord."""


def number(
    text: str,
    column: str,
    *,
    minimum: float | None = 0.0,
    positive: bool = False,
    maximum: float | None = None,
) -> float:
    """Parse a finite float from a trace cell, or raise ``RowError`` naming the column."""
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{column}: not a number: {text!r}") from None
    if not math.isfinite(value):
        raise RowError(f"{column}: not a finite number: {text!r}")
    if positive and value <= 0:
        raise RowError(f"{column}: must be > 0, got {text!r}")
    if minimum is not None and value < minimum:
        raise RowError(f"{column}: must be >= {minimum:g}, got {text!r}")
    if maximum is not None and value > maximum:
        raise RowError(f"{column}: must be <= {maximum:g}, got {text!r}")
    return value


def optional_time(text: str, column: str) -> float | None:
    """A time cell that may be empty or NaN (outside the trace window): None then."""
    stripped = text.strip()
    if not stripped or stripped.lower() == "nan":
        return None
    return number(stripped, column)


class CsvFile:
    """A comma-separated trace file with a header, read row by row with line numbers.

    The header is checked when the file is opened (a missing column is a
    format error); rows are checked as they are read (a row of the wrong
    width or undecodable bytes is a bad row, reported, and skipped).
    """

    def __init__(self, path: Path, required: Iterable[str]) -> None:
        self.path = path
        try:
            with path.open("rb") as handle:
                first = handle.readline()
        except OSError as exc:
            raise TraceFormatError(path, f"cannot read: {exc}") from None
        try:
            header = next(csv.reader([first.decode("utf-8-sig")]), [])
        except (UnicodeDecodeError, csv.Error) as exc:
            raise TraceFormatError(path, f"unreadable header: {exc}") from None
        self.header = [name.strip() for name in header]
        self.column = {name: i for i, name in enumerate(self.header)}
        missing = [name for name in required if name not in self.column]
        if missing:
            raise TraceFormatError(path, f"header lacks column(s) {missing}; got {self.header}")

    def rows(self) -> Iterator[tuple[int, bytes, list[str] | BadRecord]]:
        """``(line number, raw bytes, cells or BadRecord)`` for every non-blank data line."""
        width = len(self.header)
        with self.path.open("rb") as handle:
            handle.readline()
            for lineno, raw in enumerate(handle, start=2):
                if not raw.strip():
                    continue
                try:
                    cells = next(csv.reader([raw.decode("utf-8").rstrip("\r\n")]))
                except (UnicodeDecodeError, csv.Error) as exc:
                    yield lineno, raw, bad_record(self.path, lineno, raw, f"unreadable row: {exc}")
                    continue
                if len(cells) != width:
                    reason = f"{len(cells)} cells, header has {width}"
                    yield lineno, raw, bad_record(self.path, lineno, raw, reason)
                    continue
                yield lineno, raw, cells


def unique_id(cells: list[str], index: int, field: str, what: str, seen: set[str]) -> str:
    """The id in ``cells[index]``, stripped; a ``RowError`` if it is empty or in ``seen``
    (the caller adds it once the rest of its row is valid)."""
    value = cells[index].strip()
    if not value:
        raise RowError(f"{field}: empty {what}")
    if value in seen:
        raise RowError(f"{field}: duplicate {what} {value!r}")
    return value


def rows_by_time(
    rows: CsvFile, parse: Callable[[list[str]], tuple[float, T]]
) -> list[tuple[float, int, T | BadRecord]]:
    """A small file's rows read whole, parsed, in (time, line) order.

    ``parse`` gives a row's time and what it becomes, or raises ``RowError``.
    A bad row sorts after the row before it (time 0 before any), so it stays
    where it stood among its neighbours.
    """
    parsed: list[tuple[float, int, T | BadRecord]] = []
    last_time = 0.0
    for lineno, raw, cells in rows.rows():
        if isinstance(cells, BadRecord):
            parsed.append((last_time, lineno, cells))
            continue
        try:
            time, item = parse(cells)
        except RowError as exc:
            parsed.append((last_time, lineno, bad_record(rows.path, lineno, raw, str(exc))))
            continue
        last_time = time
        parsed.append((time, lineno, item))
    parsed.sort(key=lambda row: (row[0], row[1]))
    return parsed


def sniff_header(path: Path, prefix: str) -> bool:
    """Whether ``path`` is a file whose first line starts with ``prefix``."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return False
    return first.decode("utf-8-sig", "replace").startswith(prefix)
