"""The daemon applies an input record only where it belongs: on its event type's topic
and on its pool's partition; elsewhere it is a dead letter at stage ``routing`` that
names where it belongs, and the partition reads on past it.

Applied from another topic, an event would be ordered against its pool's others by
how the topics' fetches interleave (an exit before its request). The records are
the bundled real slice's; the consumer is a small fake (the intake is the point).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from live_support import AZURE_SLICE, NAMES, FakeConsumer, Record, live_settings, placed_vm_ids

from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.streams.adapters import open_trace
from lavad.streams.codec import encode
from lavad.streams.schema import VmRequest


def _routing_reasons(out: list[Any]) -> list[str]:
    return [
        dict(item.headers)["lavad.reason"].decode()
        for item in out
        if item.topic == NAMES.dead_letters and dict(item.headers)["lavad.stage"] == b"routing"
    ]


async def _daemon(tmp_path: Path, partitions: list[int]) -> LiveDaemon:
    settings = live_settings("127.0.0.1:9", tmp_path / "snapshots")
    daemon = LiveDaemon(settings, live_engine_config(settings))
    daemon.partitions.consumer = FakeConsumer()
    await daemon.partitions.acquire(
        [TopicPartition(topic, number) for topic in NAMES.inputs for number in partitions]
    )
    return daemon


async def test_an_event_on_another_input_topic_is_a_dead_letter_naming_its_topic(
    tmp_path: Path,
) -> None:
    daemon = await _daemon(tmp_path, [0])
    first, second = [
        e for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest)
    ][:2]
    usage = TopicPartition(NAMES.usage, 0)
    events = TopicPartition(NAMES.vm_events, 0)
    acquired = dict(daemon.partitions.acquisitions)
    # A request on the usage topic: refused, naming both topics; the topic reads on.
    out = daemon.intake.process({usage: [Record(0, encode(first))]}, acquired)
    assert placed_vm_ids(out) == []
    assert _routing_reasons(out) == [
        f"a vm.request event belongs on topic {NAMES.vm_events!r}, in whose order its "
        f"pool's events are applied; it came on {NAMES.usage!r}"
    ]
    assert daemon.partitions.owned[0].positions[NAMES.usage] == 1
    # The same request and the next on their own topic: both placed, in order.
    out = daemon.intake.process(
        {events: [Record(0, encode(first)), Record(1, encode(second))]}, acquired
    )
    assert placed_vm_ids(out) == [first.vm_id, second.vm_id]
    assert _routing_reasons(out) == []


async def test_a_pool_on_another_partition_is_a_dead_letter_naming_its_partition(
    tmp_path: Path,
) -> None:
    daemon = await _daemon(tmp_path, [0, 1])
    first, second = [
        e for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest)
    ][:2]
    acquired = dict(daemon.partitions.acquisitions)
    out = daemon.intake.process(
        {TopicPartition(NAMES.vm_events, 0): [Record(0, encode(first))]}, acquired
    )
    assert placed_vm_ids(out) == [first.vm_id]
    # The same pool's next request on partition 1: its pool lives on partition 0.
    out = daemon.intake.process(
        {TopicPartition(NAMES.vm_events, 1): [Record(0, encode(second))]}, acquired
    )
    assert placed_vm_ids(out) == []
    assert _routing_reasons(out) == [
        f"pool {first.pool!r} lives on partition 0 of the input topics, this record came on "
        "partition 1: key every input record by its pool"
    ]
    assert daemon.partitions.owned[1].positions[NAMES.vm_events] == 1
