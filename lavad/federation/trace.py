"""The Megha/Eagle job trace: one job a line, ``arrival n mean d_1 ... d_n`` (seconds).

Read with bounds, since a trace is input: a line longer than ``max_line_chars``, a job
of more than ``max_tasks_per_job`` tasks, a count that disagrees with the durations
given, a negative or non-finite time or one over ``MAX_SECONDS``: each is refused with
the line number and the reason (``TraceError``), never skipped silently.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

MAX_LINE_CHARS = 2_000_000
MAX_TASKS_PER_JOB = 100_000
# Arrivals and durations, about 31 years: an arrival plus a duration of 1e308
# overflowed to inf, and the simulators' latency figures came out NaN.
MAX_SECONDS = 1e9


class TraceError(ValueError):
    """A line of the trace that does not parse; the message names the line and why."""


@dataclass(frozen=True, slots=True)
class Job:
    index: int
    arrival: float
    durations: tuple[float, ...]


def _number(text: str, line_no: int, what: str, most: float = MAX_SECONDS) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"line {line_no}: {what} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0.0:
        raise TraceError(f"line {line_no}: {what} {text!r} is not a finite number >= 0")
    if value > most:
        raise TraceError(f"line {line_no}: {what} {text!r} is over {most:g}")
    return value


def parse_line(line: str, line_no: int, index: int) -> Job:
    if len(line) > MAX_LINE_CHARS:
        raise TraceError(f"line {line_no}: longer than {MAX_LINE_CHARS} characters")
    fields = line.split()
    if len(fields) < 4:
        raise TraceError(
            f"line {line_no}: want 'arrival n mean d_1..d_n', got {len(fields)} fields"
        )
    arrival = _number(fields[0], line_no, "arrival")
    # A whole number, "45" or "45.0": int(float(...)) took "1.5" as 1 task and
    # let "inf" raise OverflowError instead of a TraceError.
    tasks = _number(fields[1], line_no, "task count", most=math.inf)
    if not tasks.is_integer():
        raise TraceError(f"line {line_no}: task count {fields[1]!r} is not a whole number")
    count = int(tasks)
    if not 1 <= count <= MAX_TASKS_PER_JOB:
        raise TraceError(f"line {line_no}: task count {count} outside 1..{MAX_TASKS_PER_JOB}")
    if len(fields) != 3 + count:
        raise TraceError(
            f"line {line_no}: says {count} tasks but gives {len(fields) - 3} durations"
        )
    durations = tuple(_number(f, line_no, "duration") for f in fields[3:])
    return Job(index=index, arrival=arrival, durations=durations)


def read_jobs(path: Path, *, max_jobs: int | None = None) -> list[Job]:
    """The jobs of ``path`` in arrival order (stable for equal arrivals); blank lines skipped."""
    if max_jobs is not None and max_jobs < 1:
        raise ValueError(f"max_jobs must be >= 1, got {max_jobs}")
    jobs: list[Job] = []
    with path.open(encoding="ascii", errors="strict") as handle:
        for line_no, line in enumerate(_lines(handle), start=1):
            if not line.strip():
                continue
            jobs.append(parse_line(line, line_no, len(jobs)))
            if max_jobs is not None and len(jobs) >= max_jobs:
                break
    jobs.sort(key=lambda job: (job.arrival, job.index))
    return [Job(index=i, arrival=j.arrival, durations=j.durations) for i, j in enumerate(jobs)]


def _lines(handle: TextIO) -> Iterator[str]:
    # readline with a size bound: a file without newlines cannot fill memory.
    while True:
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        yield line
