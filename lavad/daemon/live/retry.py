"""The live shell's one retry policy: exponential backoff that a stop request cuts short.

Every wait between two attempts (connecting at start-up, fetching, publishing,
a transaction of decisions and offsets) goes through ``Backoff``: it starts at
``live.retry_initial_s``, doubles per failed attempt up to
``live.retry_max_s``, and starts over after a success. Waiting returns as soon
as the daemon is asked to stop, so no retry holds a shutdown up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Backoff:
    __slots__ = ("delay", "initial_s", "max_s")

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        # The wait before the next attempt (logged as retry_in_s before waiting).
        self.delay = initial_s

    def reset(self) -> None:
        """An attempt succeeded: the next failure waits the initial delay again."""
        self.delay = self.initial_s

    async def wait(self, stop: asyncio.Event) -> None:
        """Wait ``delay`` (or until ``stop`` is set), then double it, up to the maximum."""
        await sleep_or_stop(stop, self.delay)
        self.delay = min(self.delay * 2, self.max_s)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def unless_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or None as soon as ``stop`` is set first (``work`` is then
    cancelled).

    For waits with no timeout of their own: aiokafka's ``getmany`` waits for
    a rebalance in progress to end without one (``Fetcher.fetched_records``),
    so a daemon whose group never settles could not otherwise be stopped
    short of a kill.
    """
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        stopping.cancel()
    if not task.done():
        # Not awaited: a cancelled wait has nothing left to say.
        task.cancel()
        return None
    return task.result()
