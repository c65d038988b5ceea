"""``live_clients.fetches``: the federation processes' fetch loop ends at a stop, even
one that comes while a fetch waits on a rebalance that never ends.

A fake consumer stands in for aiokafka's (no broker: the live tests run the real one).
"""

from __future__ import annotations

import asyncio
from typing import Any

from lavad.federation.live_clients import fetches


class _Consumer:
    """Hands out ``batches`` in turn, then waits forever as a stuck rebalance does."""

    def __init__(self, batches: list[dict[str, list[int]]]) -> None:
        self.batches = batches
        self.asked: list[tuple[int, int]] = []
        self.cancelled = False

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[str, list[int]]:
        self.asked.append((timeout_ms, max_records))
        if self.batches:
            return self.batches.pop(0)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return {}


async def _collect(consumer: Any, stop: asyncio.Event) -> list[dict[str, list[int]]]:
    return [batch async for batch in fetches(consumer, stop, timeout_ms=50)]


async def test_batches_come_through_until_a_stop_ends_the_stuck_fetch() -> None:
    consumer = _Consumer([{"p0": [1, 2]}, {"p1": [3]}])
    stop = asyncio.Event()
    reading = asyncio.ensure_future(_collect(consumer, stop))
    await asyncio.sleep(0.01)
    assert not reading.done()  # the third fetch waits
    stop.set()
    assert await asyncio.wait_for(reading, 1.0) == [{"p0": [1, 2]}, {"p1": [3]}]
    await asyncio.sleep(0)  # the cancelled fetch runs its handler
    assert consumer.cancelled
    assert consumer.asked == [(50, 500)] * 3


async def test_nothing_is_fetched_once_stopped() -> None:
    consumer = _Consumer([{"p0": [1]}])
    stop = asyncio.Event()
    stop.set()
    assert await _collect(consumer, stop) == []
    assert consumer.asked == []
