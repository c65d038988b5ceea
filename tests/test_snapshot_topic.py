"""Partition snapshots on a Kafka topic (``live.snapshot_store = "topic"``), on the
embedded broker: chunked past the message size, restored by another store (another
machine), only the newest complete snapshot, torn and foreign ones refused with the
reason."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from lavad.core.engine import Engine
from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.live.snapshot_topic import TopicSnapshotStore, generation_of, snapshot_store
from lavad.daemon.live.snapshots import PartitionSnapshot, SnapshotError, SnapshotStore
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.settings import Settings, load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = [pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"
TOPIC = "lavad.snapshots"


def _engine(events: int) -> tuple[Engine, Settings]:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    engine = Engine(settings.engine_config("bestfit", trace_has_hosts=False))
    for count, event in enumerate(open_trace(AZURE_SLICE, seed=0)):
        if count >= events:
            break
        engine.handle(event, event.time)
    return engine, settings


@pytest.fixture
def kafka(broker: EmbeddedBroker) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers)


@pytest.fixture
def stores(kafka: KafkaSettings) -> Iterator[list[TopicSnapshotStore]]:
    made: list[TopicSnapshotStore] = []
    yield made
    for store in made:
        store.close()


def _store(
    stores: list[TopicSnapshotStore], kafka: KafkaSettings, group: str = "g", chunk: int = 4096
) -> TopicSnapshotStore:
    store = TopicSnapshotStore(kafka, TOPIC, group, chunk_bytes=chunk, partitions=2)
    stores.append(store)
    return store


def test_a_chunked_snapshot_restores_on_another_instance(
    kafka: KafkaSettings, stores: list[TopicSnapshotStore]
) -> None:
    engine, _ = _engine(3000)
    pools = dict(engine.pools)
    body = dumps(pools)
    assert len(body) > 3 * 4096  # several chunks
    writer = _store(stores, kafka)
    assert writer.save(PartitionSnapshot(1, engine.fingerprint, {"vm-events": 3000}, pools)) == (
        len(body)
    )
    reader = _store(stores, kafka)  # a fresh store: another machine
    loaded = reader.load(1, engine.fingerprint)
    assert loaded is not None
    assert loaded.offsets == {"vm-events": 3000}
    # the pools a file store would give back (a set's order is not kept by the codec)
    assert dumps(loaded.pools) == dumps(loads(body))
    assert reader.load(0, engine.fingerprint) is None  # partition 0 has none


def test_only_the_newest_complete_snapshot_is_restored(
    kafka: KafkaSettings, stores: list[TopicSnapshotStore]
) -> None:
    early, _ = _engine(500)
    late, _ = _engine(2500)
    writer = _store(stores, kafka)
    writer.save(PartitionSnapshot(0, early.fingerprint, {"t": 500}, dict(early.pools)))
    writer.save(PartitionSnapshot(0, late.fingerprint, {"t": 2500}, dict(late.pools)))
    # a crash in the middle of a third save: two chunks, no manifest
    writer.write_torn(PartitionSnapshot(0, early.fingerprint, {"t": 9}, dict(early.pools)), 2)
    loaded = _store(stores, kafka).load(0, late.fingerprint)
    assert loaded is not None and loaded.offsets == {"t": 2500}
    assert dumps(loaded.pools) == dumps(loads(dumps(dict(late.pools))))


def _produce(kafka: KafkaSettings, key: bytes, value: bytes, partition: int) -> None:
    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
        await producer.start()
        try:
            await producer.send_and_wait(TOPIC, value, key=key, partition=partition)
        finally:
            await producer.stop()

    asyncio.run(send())


def _manifest(**fields: object) -> bytes:
    return orjson.dumps({"format": "lavad.snapshot-record", "kind": "manifest", **fields}) + b"\n"


def test_torn_and_foreign_snapshots_are_refused_with_the_reason(
    kafka: KafkaSettings, stores: list[TopicSnapshotStore]
) -> None:
    engine, _ = _engine(500)
    writer = _store(stores, kafka)
    writer.save(PartitionSnapshot(0, engine.fingerprint, {"t": 1}, dict(engine.pools)))
    key = writer.manifest_key(0)
    # a manifest whose chunks were never written
    _produce(
        kafka,
        key,
        _manifest(group="g", partition=0, snapshot="0000000009-x", chunks=3, header={}),
        0,
    )
    with pytest.raises(SnapshotError, match="torn snapshot 0000000009-x: chunk 0 of 3"):
        _store(stores, kafka).load(0, engine.fingerprint)
    # another group's manifest under this group's key
    _produce(kafka, key, _manifest(group="other", partition=0, snapshot="1-x", chunks=1), 0)
    with pytest.raises(SnapshotError, match="foreign manifest: group 'other'"):
        _store(stores, kafka).load(0, engine.fingerprint)
    # a complete snapshot of another engine configuration
    writer.save(PartitionSnapshot(0, engine.fingerprint, {"t": 2}, dict(engine.pools)))
    with pytest.raises(SnapshotError, match="another engine configuration"):
        _store(stores, kafka).load(0, "another-fingerprint")
    # moved aside: the partition rebuilds from its input topics
    reader = _store(stores, kafka)
    assert "aside" in reader.move_aside(0)
    assert reader.load(0, engine.fingerprint) is None
    # and saving goes on
    writer.save(PartitionSnapshot(0, engine.fingerprint, {"t": 3}, dict(engine.pools)))
    loaded = _store(stores, kafka).load(0, engine.fingerprint)
    assert loaded is not None and loaded.offsets == {"t": 3}


def test_the_setting_chooses_the_store(tmp_path: Path) -> None:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    as_file = settings.model_copy(
        update={"live": settings.live.model_copy(update={"snapshot_dir": tmp_path})}
    )
    store = snapshot_store(as_file)
    assert isinstance(store, SnapshotStore)
    as_topic = settings.model_copy(
        update={"live": settings.live.model_copy(update={"snapshot_store": "topic"})}
    )
    topic_store = snapshot_store(as_topic)
    try:
        assert isinstance(topic_store, TopicSnapshotStore)
        assert topic_store.chunk_bytes == 524288 and topic_store.topic == "lavad.snapshots"
    finally:
        topic_store.close()


def test_one_reader_loads_again_after_letting_the_chunks_go_and_reads_on_for_newer_ones(
    kafka: KafkaSettings, stores: list[TopicSnapshotStore]
) -> None:
    """A store keeps what it read and reads on from there; a load the kept records cannot
    serve (the chunks let go after the previous load) reads the partition again."""
    engine, _ = _engine(2000)
    writer, reader = _store(stores, kafka), _store(stores, kafka)
    first = dict(engine.pools)
    writer.save(PartitionSnapshot(1, engine.fingerprint, {"vm-events": 2000}, first))
    once = reader.load(1, engine.fingerprint)
    again = reader.load(1, engine.fingerprint)  # no newer snapshot: read from the start
    assert once is not None and again is not None
    assert dumps(once.pools) == dumps(again.pools) == dumps(loads(dumps(first)))
    for count, event in enumerate(open_trace(AZURE_SLICE, seed=0)):
        if count >= 3000:
            break
        if count >= 2000:
            engine.handle(event, event.time)
    writer.save(PartitionSnapshot(1, engine.fingerprint, {"vm-events": 3000}, dict(engine.pools)))
    newer = reader.load(1, engine.fingerprint)  # read on: the newer manifest and its chunks
    assert newer is not None
    assert newer.offsets == {"vm-events": 3000}
    assert dumps(newer.pools) == dumps(loads(dumps(dict(engine.pools))))
    assert reader.load(0, engine.fingerprint) is None


def test_a_load_after_a_prefetch_sees_a_snapshot_written_since_and_settle_lets_go(
    kafka: KafkaSettings, stores: list[TopicSnapshotStore]
) -> None:
    """Prefetched during a rebalance, then another instance snapshots the partition it gives
    up: the load reads on and gets that newer snapshot, and after ``settle`` (the prefetched
    chunks let go) a load still restores it in full."""
    engine, _ = _engine(2000)
    writer, reader = _store(stores, kafka), _store(stores, kafka)
    writer.save(PartitionSnapshot(1, engine.fingerprint, {"vm-events": 2000}, dict(engine.pools)))
    assert reader.load(0, engine.fingerprint) is None  # learns the topic's partitions
    reader.prefetch()
    for count, event in enumerate(open_trace(AZURE_SLICE, seed=0)):
        if count >= 2500:
            break
        if count >= 2000:
            engine.handle(event, event.time)
    newer = dict(engine.pools)
    writer.save(PartitionSnapshot(1, engine.fingerprint, {"vm-events": 2500}, newer))
    loaded = reader.load(1, engine.fingerprint)
    reader.settle()
    again = reader.load(1, engine.fingerprint)
    assert loaded is not None and again is not None
    assert loaded.offsets == again.offsets == {"vm-events": 2500}
    assert dumps(loaded.pools) == dumps(again.pools) == dumps(loads(dumps(newer)))


@pytest.mark.parametrize(
    ("snapshot_id", "generation"),
    [
        ("0000000042-0123456789abcdef", 42),  # as the store writes it
        ("\u00b2-0123456789abcdef", 0),  # isdigit, but int() refuses it
        ("9" * 5_000 + "-x", 0),  # more digits than int() takes
        ("other", 0),
    ],
)
def test_a_snapshot_ids_generation_is_read_or_zero(snapshot_id: str, generation: int) -> None:
    assert generation_of(snapshot_id) == generation
