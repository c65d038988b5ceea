"""The live shell's work per record without a broker, against the replay of the same events.

What the daemon does to a record besides the engine's work, with the
network left out: aiokafka parses the fetched record batches (CRC checks
included) and hands over the parsed records (``live/parsed_records.py``);
``Intake.process`` decodes, routes and decides them; ``Publisher`` groups the
decisions into producer batches, which a stand-in producer accepts at once;
the published records are counted. The record batches are built once, as a
fetch would return them (one pool per partition, 500 records per producer
batch, 2,000 records per ``getmany``). CPU time, the minimum of a few runs of
each, alternated, so that the neighbours' load moves both alike.
"""

from __future__ import annotations

import asyncio
import gc
import io
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.consumer.fetcher import READ_UNCOMMITTED, PartitionRecords
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from lavad.daemon import heap
from lavad.daemon.live.parsed_records import FetchedRecord, _as_parsed
from lavad.daemon.live.partitions import OwnedPartition
from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.replay import replay
from lavad.daemon.settings import Settings
from lavad.streams.codec import encode
from lavad.streams.kafka.topics import TopicNames
from lavad.streams.schema import Event

RECORDS_PER_PRODUCER_BATCH = 500
RECORDS_PER_FETCH = 2_000


class _AcceptingProducer:
    """Takes every batch at once: the producer's side as far as the daemon's CPU goes."""

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(256 * 1024, 0)

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> Any:
        batch.close()
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def _record_batches(events: list[Event], names: TopicNames, partitions: int) -> dict[Any, bytes]:
    """Each input topic-partition's records as the bytes of a fetch response."""
    numbers = list(range(partitions))
    partitioner = DefaultPartitioner()
    values: dict[Any, list[tuple[bytes, bytes]]] = {}
    for event in events:
        key = event.pool.encode()
        tp = TopicPartition(names.for_event_type(event.type), partitioner(key, numbers, numbers))
        values.setdefault(tp, []).append((key, encode(event)))
    fetched: dict[Any, bytes] = {}
    for tp, records in values.items():
        buffer = bytearray()
        for start in range(0, len(records), RECORDS_PER_PRODUCER_BATCH):
            builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 24)
            for delta, (key, value) in enumerate(
                records[start : start + RECORDS_PER_PRODUCER_BATCH]
            ):
                builder.append(delta, 1_700_000_000_000 + start + delta, key, value, [])
            built = builder.build()
            struct.pack_into(">q", built, 0, start)  # the batch's base offset
            buffer += built
        fetched[tp] = bytes(buffer)
    return fetched


def _fetches(fetched: dict[Any, bytes]) -> Iterator[dict[Any, list[FetchedRecord]]]:
    """``getmany`` results: up to RECORDS_PER_FETCH parsed records, partition after partition."""
    pending: dict[Any, Any] = {}
    for tp, data in fetched.items():
        check_crcs = True  # as the daemon's consumer does
        records = PartitionRecords(
            tp, MemoryRecords(data), [], 0, None, None, check_crcs, READ_UNCOMMITTED
        )
        records._consumer_record = _as_parsed
        pending[tp] = records
    while pending:
        batch: dict[Any, list[FetchedRecord]] = {}
        budget = RECORDS_PER_FETCH
        for tp in list(pending):
            taken: list[FetchedRecord] = []
            for record in pending[tp]:
                taken.append(record)
                if len(taken) >= budget:
                    break
            else:
                del pending[tp]
            if taken:
                batch[tp] = taken
                budget -= len(taken)
            if budget == 0:
                break
        yield batch


async def _live_path(daemon: LiveDaemon, fetched: dict[Any, bytes]) -> None:
    intake, publisher = daemon.intake, daemon.publisher
    for batch in _fetches(fetched):
        # No rebalance runs here: the acquisitions are those of the batch's fetch.
        out = intake.process(batch, dict(daemon.partitions.acquisitions))
        out.extend(intake.advance_timers())
        await publisher._send_batches(out)
        publisher._count_published(out, time.time())


def _live_cpu(settings: Settings, fetched: dict[Any, bytes], partitions: int) -> float:
    with tempfile.TemporaryDirectory() as snapshots:
        live = settings.model_copy(
            update={"live": settings.live.model_copy(update={"snapshot_dir": Path(snapshots)})}
        )
        daemon = LiveDaemon(live, live_engine_config(live))
        for number in range(partitions):
            daemon.partitions.owned[number] = OwnedPartition(number)
        daemon.publisher.producer = _AcceptingProducer()
        gc.collect()
        heap.settle()
        cpu0 = time.process_time()
        asyncio.run(_live_path(daemon, fetched))
        return time.process_time() - cpu0


def _replay_cpu(settings: Settings, events: list[Event]) -> float:
    gc.collect()
    heap.settle()
    cpu0 = time.process_time()
    replay(events, live_engine_config(settings), decisions_out=io.BytesIO())
    return time.process_time() - cpu0


def live_path_overhead(
    settings: Settings, events: list[Event], names: TopicNames, partitions: int, runs: int = 3
) -> tuple[float, float]:
    """(replay, live path without a broker) CPU us per record, the minimum of ``runs`` each."""
    heap.tune_collector()
    fetched = _record_batches(events, names, partitions)
    replays, lives = [], []
    for _ in range(runs):
        replays.append(_replay_cpu(settings, events))
        lives.append(_live_cpu(settings, fetched, partitions))
    return min(replays) / len(events) * 1e6, min(lives) / len(events) * 1e6
