"""The 5-minute windows still open, by end and by name (a job, a deployment).

Every usage sample asks whether windows have ended, so that cost must follow
what closes, not what stays open: a fleet's jobs all hold a window open at
once, and a pass over them at each sample would make a sample cost O(jobs)
and an interval O(jobs^2). The distinct ends sit in a heap (with 5-minute
windows, one or two of them at a time), each with its windows by name, so a
sample costs a look at the heap's first end, and a close what it closes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Generic, TypeVar

W = TypeVar("W")


class OpenWindows(Generic[W]):
    """Windows by (end, name); ``close`` gives those ended by a time in (end, name) order."""

    def __init__(self) -> None:
        self._by_end: dict[float, dict[str, W]] = {}
        # The keys of ``_by_end``, as a heap: the earliest end first.
        self._ends: list[float] = []

    def check_restored(self) -> None:
        """Raise ValueError if a restored heap does not name exactly the ends held (a
        snapshot is checksummed, not signed): an end missing from it would never close."""
        ends = self._ends
        if not all(math.isfinite(end) for end in ends):
            raise ValueError("a window end is not finite")
        if sorted(ends) != sorted(self._by_end) or len(set(ends)) != len(ends):
            raise ValueError("the heap of window ends does not match the windows held")
        if any(ends[(i - 1) // 2] > ends[i] for i in range(1, len(ends))):
            raise ValueError("the window ends are not a heap")

    def __len__(self) -> int:
        return sum(len(windows) for windows in self._by_end.values())

    def get(self, end: float, name: str, new: Callable[[], W]) -> W:
        """The window of ``name`` ending at ``end``, opened with ``new()`` if there is none."""
        windows = self._by_end.get(end)
        if windows is None:
            windows = self._by_end[end] = {}
            heapq.heappush(self._ends, end)
        window = windows.get(name)
        if window is None:
            window = windows[name] = new()
        return window

    def close(self, now: float) -> list[tuple[float, str, W]]:
        """(end, name, window) of every window that ended at or before ``now``, removed."""
        ends = self._ends
        closed: list[tuple[float, str, W]] = []
        while ends and ends[0] <= now:
            end = heapq.heappop(ends)
            windows = self._by_end.pop(end)
            closed.extend((end, name, windows[name]) for name in sorted(windows))
        return closed
