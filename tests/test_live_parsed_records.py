"""The input consumer hands over aiokafka's parsed records, and they say what ConsumerRecords say.

``live/parsed_records.py`` reaches into aiokafka's fetcher. If an aiokafka
release moves those internals, the daemon quietly falls back to
``ConsumerRecord``s (correct, slower); these tests are what fails loudly.
"""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

import aiokafka
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.record.default_records import DefaultRecord
from live_support import produce_raw

from lavad.daemon.live.parsed_records import AIOKAFKA_VERSION, read_parsed_records
from lavad.streams.kafka.embedded import EmbeddedBroker

TOPIC = "parsed"


def test_the_pinned_aiokafka_is_the_one_the_adapter_was_written_against() -> None:
    assert aiokafka.__version__ == AIOKAFKA_VERSION


async def _read(bootstrap: str, parsed: bool, expected: int) -> tuple[bool, dict[int, list[Any]]]:
    """Every record of the topic, by partition (the order across partitions is the fetcher's)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        installed = read_parsed_records(consumer) if parsed else False
        await consumer.topics()
        partitions = sorted(consumer.partitions_for_topic(TOPIC) or ())
        consumer.assign([TopicPartition(TOPIC, p) for p in partitions])
        records: dict[int, list[Any]] = {}
        for _ in range(100):
            # Small batches, so that a fetch is drained over several calls.
            batch = await consumer.getmany(timeout_ms=200, max_records=7)
            for tp, part in batch.items():
                records.setdefault(tp.partition, []).extend(part)
            if sum(map(len, records.values())) >= expected:
                break
        return installed, records
    finally:
        await consumer.stop()


@pytest.mark.kafka
async def test_parsed_records_carry_the_same_offsets_timestamps_keys_and_values(
    broker: EmbeddedBroker,
) -> None:
    values: list[tuple[bytes | None, bytes]] = [
        (f"pool-{i % 3}".encode() if i % 5 else None, f'{{"n":{i}}}'.encode()) for i in range(40)
    ]
    await produce_raw(broker.bootstrap_servers, TOPIC, values)
    installed, parsed = await _read(broker.bootstrap_servers, parsed=True, expected=len(values))
    _, plain = await _read(broker.bootstrap_servers, parsed=False, expected=len(values))

    assert installed, "read_parsed_records refused: see its warning for which internal moved"
    assert {type(r) for part in parsed.values() for r in part} == {DefaultRecord}
    assert {type(r) for part in plain.values() for r in part} == {aiokafka.ConsumerRecord}
    for number, part in plain.items():
        fields = [(r.offset, r.timestamp, r.key, r.value) for r in part]
        assert [(r.offset, r.timestamp, r.key, r.value) for r in parsed[number]] == fields
        assert [r.offset for r in part] == list(range(len(part)))
    received = sorted(r.value for part in parsed.values() for r in part)
    assert received == sorted(value for _, value in values)


def test_a_consumer_whose_internals_moved_is_left_as_it_is() -> None:
    moved = SimpleNamespace(_fetcher=SimpleNamespace(_records={}))  # a dict, not an OrderedDict
    assert read_parsed_records(moved) is False  # type: ignore[arg-type]
    assert type(moved._fetcher._records) is dict


def test_another_aiokafka_release_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka, "__version__", "99.0.0")
    fetched_nothing = SimpleNamespace(_fetcher=SimpleNamespace(_records=OrderedDict()))
    assert read_parsed_records(fetched_nothing) is False  # type: ignore[arg-type]
    assert type(fetched_nothing._fetcher._records) is OrderedDict
