"""Live, an event stamped ahead of its Kafka record's timestamp is refused by itself.

``[input] max_ahead_s`` (30 days) lets a pool wake after weeks of quiet, so by
the pool's clock alone a record stamped a day ahead by a producer's fast
clock is plausible: handled, it moves its pool's clock a day on, and every
rightly stamped event after it is more than ``max_behind_s`` (1 h) behind and
refused, for a day. The record's own timestamp says when it was published;
an event time far past that is the record's fault, and only it is refused.
The events are the bundled real slice's requests, restamped to when a
producer would publish them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from live_support import (
    AZURE_SLICE,
    NAMES,
    FakeConsumer,
    Record,
    create_topics,
    live_settings,
    placed_vm_ids,
    produce_raw,
    read_topic,
    wait_for,
)

from lavad.daemon.live.intake import record_time_refusal
from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.settings import Settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import encode
from lavad.streams.kafka.deadletter import header_map
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.schema import VmRequest

DAY = 86_400.0


@pytest.mark.parametrize(
    ("now", "record_ms", "bound", "refused"),
    [
        # Published at 1,000 s (1,000,000 ms), the bound 1,800 s:
        (2_800.0, 1_000_000, 1_800.0, False),  # 1,800 s ahead: at the bound, taken
        (2_800.5, 1_000_000, 1_800.0, True),  # 1,800.5 s ahead: past it
        (1_000.0 - DAY, 1_000_000, 1_800.0, False),  # behind: the engine's max_behind_s rule
        (1_000.0 + DAY, 1_000_000, 0.0, False),  # 0: no bound
        (1_000.0 + DAY, -1, 1_800.0, False),  # Kafka's "no timestamp"
        (1_000.0 + DAY, None, 1_800.0, False),
        (math.nan, 1_000_000, 1_800.0, False),  # NaN: the engine's max_time rule refuses it
        (1_000.0 * 1_000.0, 1_000_000, 1_800.0, True),  # milliseconds sent as seconds
        # Absurd values a producer can send: int64's extremes as the timestamp, the
        # largest float as the time (constant work, no overflow).
        (1e308, 2**63 - 1, 1_800.0, True),
        (1e308, -(2**63), 1_800.0, False),
        (0.0, 2**63 - 1, 1_800.0, False),
    ],
)
def test_record_time_refusal(
    now: float, record_ms: int | None, bound: float, refused: bool
) -> None:
    reason = record_time_refusal(now, record_ms, bound)
    assert (reason is not None) == refused
    if reason is not None:
        assert "live.max_ahead_of_record_s = 1800" in reason
        assert f"{now - record_ms / 1000.0:.0f} s ahead" in reason  # type: ignore[operator]


def _requests(count: int) -> list[VmRequest]:
    events = open_trace(AZURE_SLICE, seed=0).events()
    return [e for e in events if isinstance(e, VmRequest)][:count]


def _restamped(requests: list[VmRequest], start: float) -> list[VmRequest]:
    """The requests at ``start``, ``start + 1 day`` (the fast clock), ``start + 10 s``."""
    first, ahead, after = requests
    return [
        dataclasses.replace(first, time=start),
        dataclasses.replace(ahead, time=start + DAY),
        dataclasses.replace(after, time=start + 10.0),
    ]


def _dead(out: list[Any]) -> list[tuple[str, str]]:
    return [
        (dict(item.headers)["lavad.stage"].decode(), dict(item.headers)["lavad.reason"].decode())
        for item in out
        if item.topic == NAMES.dead_letters
    ]


async def _intake_daemon(settings: Settings) -> LiveDaemon:
    daemon = LiveDaemon(settings, live_engine_config(settings))
    daemon.partitions.consumer = FakeConsumer()
    await daemon.partitions.acquire([TopicPartition(t, 0) for t in NAMES.inputs])
    return daemon


@pytest.mark.parametrize("bound", [1_800.0, 0.0], ids=["the-default", "no-bound"])
async def test_a_record_stamped_a_day_ahead_costs_itself_not_the_day_after_it(
    tmp_path: Path, bound: float
) -> None:
    settings = live_settings("127.0.0.1:9", tmp_path / "snapshots", max_ahead_of_record_s=bound)
    daemon = await _intake_daemon(settings)
    published = 1_767_225_600.0  # each record published 5 s after its (right) event time
    first, ahead, after = _restamped(_requests(3), published - 5.0)
    records = [
        Record(0, encode(first), timestamp=int(published * 1000)),
        Record(1, encode(ahead), timestamp=int(published * 1000)),
        Record(2, encode(after), timestamp=int((published + 10.0) * 1000)),
    ]
    events = TopicPartition(NAMES.vm_events, 0)
    out = daemon.intake.process({events: records}, dict(daemon.partitions.acquisitions))
    if bound:
        assert placed_vm_ids(out) == [first.vm_id, after.vm_id]
        ((stage, reason),) = _dead(out)
        assert stage == "time"
        assert "86395 s ahead of its record's timestamp" in reason
    else:
        # Without the bound, the day-ahead request is placed and moves its pool's
        # clock a day on: the rightly stamped request after it is refused as late.
        assert placed_vm_ids(out) == [first.vm_id, ahead.vm_id]
        ((stage, reason),) = _dead(out)
        assert stage == "time"
        assert "behind pool" in reason and "input.max_behind_s" in reason


async def test_over_kafka_the_record_ahead_is_a_dead_letter_and_the_rest_is_placed(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = live_settings(broker.bootstrap_servers, tmp_path)
    await create_topics(broker.bootstrap_servers)
    # Times by this machine's clock, as a producer in production stamps them;
    # the broker stamps each record when it is produced.
    first, ahead, after = _restamped(_requests(3), time.time() - 30.0)
    await produce_raw(
        broker.bootstrap_servers,
        NAMES.vm_events,
        [(e.pool.encode(), encode(e)) for e in (first, ahead, after)],
    )
    daemon = LiveDaemon(settings, live_engine_config(settings))
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        await wait_for(lambda: daemon.records_processed >= 3, 60, "the three records")
    finally:
        stop.set()
        await task
    placements = await read_topic(broker.bootstrap_servers, NAMES.placements, at_least=2)
    assert [orjson.loads(r.value)["vm_id"] for r in placements] == [first.vm_id, after.vm_id]
    (dead,) = await read_topic(broker.bootstrap_servers, NAMES.dead_letters, at_least=1)
    headers = header_map(dead.headers)
    assert headers["lavad.stage"] == "time"
    assert "live.max_ahead_of_record_s" in headers["lavad.reason"]
    assert dead.value == encode(ahead)
