"""The largest value of a sliding window, in O(1) amortised work per value.

Autopilot's horizontal scaler (``horizontal.py``) takes, at every 5-minute
window, the maximum of its job's usage over the last 72 hours (864 windows) and
of its raw recommendations over the last 48 hours. Recomputed from the whole
window, both would take two passes of Python over about 1,400 values per
window (a minute of the DLRM evaluation's 156 apps, against 2 s kept here).
Autopilot's moving windows (``window.py``) likewise hold the maximum of the
last day of peaks (288 windows) and of the last hour of limits. Here each
value enters once and leaves once.

The window is exactly the scaler's list: the values in arrival order, less
those dropped from its front while the front's time is at or before a cutoff,
the newest always kept (or, for a window of a number of values, less those
past that number). Times need not increase (a value with an old time
behind a newer one stays until every value before it has gone, as in a list),
so a value leaves by its arrival index, never by its own time.

The values no later value is at least as large as are the leaders (kept
with their arrival index), decreasing: the first is the window's maximum, and
a value dropped from the window is dropped from them when it is first. The
window's values themselves are kept only when asked for (a percentile needs
them; the maximum does not).
"""

from __future__ import annotations

from collections import deque


class WindowMax:
    """A sliding window of ``(time, value)`` pairs that knows its maximum."""

    def __init__(self, *, keep_values: bool = False) -> None:
        self.times: deque[float] = deque()
        self.values: deque[float] | None = deque() if keep_values else None
        self._first = 0  # arrival index of the window's first value
        self._arrivals = 0  # values ever added
        # Two deques rather than one of pairs: a pair costs a tuple a value.
        self._leader_index: deque[int] = deque()
        self._leader_value: deque[float] = deque()

    def __len__(self) -> int:
        return len(self.times)

    def add(self, time: float, value: float) -> None:
        self.times.append(time)
        if self.values is not None:
            self.values.append(value)
        index, leaders = self._leader_index, self._leader_value
        while leaders and leaders[-1] <= value:
            leaders.pop()
            index.pop()
        leaders.append(value)
        index.append(self._arrivals)
        self._arrivals += 1

    def drop_through(self, cutoff: float) -> None:
        """Drop values from the front while the front's time is <= ``cutoff``, keeping one."""
        times = self.times
        dropped = 0
        while len(times) > 1 and times[0] <= cutoff:
            times.popleft()
            dropped += 1
        self._forget_front(dropped)

    def drop_beyond(self, count: int) -> None:
        """Drop values from the front until at most ``count`` (>= 1) are left."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count!r}")
        times = self.times
        dropped = max(len(times) - count, 0)
        for _ in range(dropped):
            times.popleft()
        self._forget_front(dropped)

    def _forget_front(self, dropped: int) -> None:
        """The first ``dropped`` values left the window (their times already have)."""
        values = self.values
        if values is not None:
            for _ in range(dropped):
                values.popleft()
        first = self._first = self._first + dropped
        index = self._leader_index
        while index[0] < first:
            index.popleft()
            self._leader_value.popleft()

    def kept_values(self) -> deque[float]:
        """The window's values, oldest first (a window made with ``keep_values``)."""
        if self.values is None:
            raise ValueError("this window keeps no values: make it with keep_values=True")
        return self.values

    def max(self) -> float:
        """The largest value in the window (raises IndexError when it is empty)."""
        return self._leader_value[0]
