"""``retry.unless_stopped``: a wait with no timeout of its own still ends at a stop.

aiokafka's ``getmany`` waits for a rebalance in progress to end without a
timeout; these fakes stand in for it (no broker: the live tests run the
real one).
"""

from __future__ import annotations

import asyncio

import pytest

from lavad.daemon.live.retry import unless_stopped


async def _forever(cancelled: list[bool]) -> dict[str, int]:
    """A fetch stuck in a rebalance that never ends; records whether it was cancelled."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.append(True)
        raise
    return {}


async def _batch() -> dict[str, int]:
    await asyncio.sleep(0)
    return {"records": 3}


async def _refused() -> dict[str, int]:
    raise ConnectionError("broker gone")


async def test_a_stop_ends_a_wait_that_would_never_end_and_cancels_it() -> None:
    stop = asyncio.Event()
    cancelled: list[bool] = []
    waiting = asyncio.ensure_future(unless_stopped(_forever(cancelled), stop))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # no stop yet: still waiting
    stop.set()
    assert await asyncio.wait_for(waiting, 1.0) is None
    await asyncio.sleep(0)  # the cancelled fetch runs its handler
    assert cancelled == [True]


async def test_without_a_stop_the_result_comes_through() -> None:
    assert await unless_stopped(_batch(), asyncio.Event()) == {"records": 3}


async def test_a_failure_comes_through_for_the_caller_to_retry() -> None:
    with pytest.raises(ConnectionError, match="broker gone"):
        await unless_stopped(_refused(), asyncio.Event())


async def test_a_caller_cancelled_while_waiting_cancels_the_wait_too() -> None:
    cancelled: list[bool] = []
    waiting = asyncio.ensure_future(unless_stopped(_forever(cancelled), asyncio.Event()))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0)
    assert cancelled == [True]
