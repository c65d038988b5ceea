"""The daemon never applies a batch fetched before it acquired the partition.

aiokafka fetches a newly assigned partition from the group's committed offset before
the rebalance listener restores the partition and seeks it to the restored positions;
a batch returned then, and processed after the listener (it waits on the partitions'
lock), starts past those positions. Applied, it skipped the records in between (the
pool owners of the live federation lost launches this way). Small fakes stand in for
the consumer: the order of events is the point, and a broker cannot produce it on cue.
"""

from __future__ import annotations

from pathlib import Path

from aiokafka import TopicPartition
from live_support import AZURE_SLICE, NAMES, FakeConsumer, Record, live_settings, placed_vm_ids

from lavad.daemon.live.parsed_records import FetchedRecord
from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.streams.adapters import open_trace
from lavad.streams.codec import encode
from lavad.streams.schema import VmRequest


async def test_a_batch_fetched_before_the_partition_was_acquired_is_fetched_again(
    tmp_path: Path,
) -> None:
    settings = live_settings("127.0.0.1:9", tmp_path / "snapshots")
    daemon = LiveDaemon(settings, live_engine_config(settings))
    consumer = FakeConsumer()
    daemon.partitions.consumer = consumer
    # The bundled real slice's first three requests, at offsets 0-2 of partition 0.
    requests = [e for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest)]
    records: list[FetchedRecord] = [
        Record(offset, encode(event)) for offset, event in enumerate(requests[:3])
    ]
    events = TopicPartition(NAMES.vm_events, 0)
    before = dict(daemon.partitions.acquisitions)
    await daemon.partitions.acquire([TopicPartition(topic, 0) for topic in NAMES.inputs])
    assert (events, 0) in consumer.seeks  # no snapshot: from the beginning
    # Fetched from the committed offset (1) before that seek: not applied, sought back.
    seeks = len(consumer.seeks)
    assert daemon.intake.process({events: records[1:]}, before) == []
    assert consumer.seeks[seeks:] == [(events, 0)]
    assert daemon.partitions.owned[0].positions.get(NAMES.vm_events, 0) == 0
    # Fetched again from offset 0: every request placed, in order.
    out = daemon.intake.process({events: records}, dict(daemon.partitions.acquisitions))
    assert placed_vm_ids(out) == [r.vm_id for r in requests[:3]]
    assert daemon.partitions.owned[0].positions[NAMES.vm_events] == 3
