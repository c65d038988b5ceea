"""Owners' snapshots in chunks: a pool larger than one broker message restores whole,
a torn or foreign snapshot is refused with the reason (the pool is then rebuilt from
its launches), and a newer snapshot deletes the previous one's chunks."""

from __future__ import annotations

import hashlib

import numpy as np
import orjson
import pytest
from federation_live_support import create_topics

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.live_clients import read_partition
from lavad.federation.live_owner import Owner, latest_snapshots
from lavad.federation.live_wire import OWNER_SNAPSHOTS, WireError, encode_owner, restore_owner
from lavad.federation.messages import LaunchRequest, Task
from lavad.federation.owner import PoolOwner
from lavad.federation.owner_snapshots import (
    SnapshotReader,
    chunk_key,
    manifest_key,
    snapshot_records,
)
from lavad.federation.topology import uniform_topology
from lavad.streams.kafka.embedded import EmbeddedBroker


def _task(tid: int) -> Task:
    return Task(tid, job=tid, tenant=0, demand=(1,), constraints=0, duration=9.0, arrival=0.0)


def _busy_owner(tasks: int) -> PoolOwner:
    topology = uniform_topology(1, tasks, 1)
    owner = PoolOwner("owner-of-pool-0", topology.pools[0], 1, 1)
    for tid in range(tasks):
        owner.launch(LaunchRequest(0, tid + 1, 0, tid, _task(tid), False, attempt=1), 0.0)
    return owner


def test_a_body_is_cut_into_chunks_and_assembled_whole() -> None:
    body = bytes(range(256)) * 10  # 2,560 bytes: chunks of 1,024, 1,024 and 512
    manifest, chunks, (key, value) = snapshot_records(3, body, chunk_bytes=1024)
    assert [len(v) for _, v in chunks] == [1024, 1024, 512]
    assert manifest.chunks == 3 and manifest.sha256 == hashlib.sha256(body).hexdigest()
    assert key == manifest_key(3) and chunks[2][0] == chunk_key(3, manifest.snapshot_id, 2)
    reader = SnapshotReader()
    for k, v in [*chunks, (key, value)]:
        reader.add(k, v)
    assert reader.snapshots() == {3: body} and reader.refused == []


def test_the_newest_manifest_wins_and_a_torn_or_altered_one_is_refused() -> None:
    _, old_chunks, old_manifest = snapshot_records(0, b"a" * 3000, chunk_bytes=1024)
    _, new_chunks, new_manifest = snapshot_records(0, b"b" * 3000, chunk_bytes=1024)
    reader = SnapshotReader()
    for k, v in [*old_chunks, old_manifest, *new_chunks, new_manifest]:
        reader.add(k, v)
    for k, _ in old_chunks:  # the old snapshot's tombstones
        reader.add(k, None)
    assert reader.snapshots() == {0: b"b" * 3000}
    # a crash after the chunks, before the manifest: the previous snapshot stays newest
    torn = SnapshotReader()
    for k, v in [*old_chunks, old_manifest, *new_chunks[:2]]:
        torn.add(k, v)
    assert torn.snapshots() == {0: b"a" * 3000}
    # a manifest whose chunk was deleted, or altered: refused, never half-loaded
    missing = SnapshotReader()
    for k, v in [*new_chunks[1:], new_manifest]:
        missing.add(k, v)
    assert missing.snapshots() == {} and missing.refused == ["pool 0: 1 of 3 chunks missing"]
    altered = SnapshotReader()
    for k, v in [*new_chunks[:2], (new_chunks[2][0], b"c" * 952), new_manifest]:
        altered.add(k, v)
    assert altered.snapshots() == {}
    assert altered.refused == ["pool 0: chunks do not add up to the manifest's"]


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (b"x", b"{}", "record with key 'x': not an owner snapshot's"),
        (None, b"{}", "record with key '': not an owner snapshot's"),
        (b"pool-1", b"{", "pool 1: manifest: not JSON"),
        # the format the single-record snapshots of earlier builds had: rebuilt, not read
        (
            b"pool-1",
            b'{"pool": 1, "offset": 4}',
            "pool 1: manifest: not an owner snapshot's manifest",
        ),
        (
            b"pool-1",
            orjson.dumps({"format": "lavad.owner-snapshot", "v": 2}),
            "pool 1: manifest: version 2, this lavad reads 1",
        ),
        (
            b"pool-1",
            orjson.dumps(
                {"format": "lavad.owner-snapshot", "v": 1, "pool": 1, "id": "../x", "chunks": 1}
            ),
            "pool 1: manifest: a field is missing or out of range",
        ),
        (
            b"pool-1",
            orjson.dumps(
                {
                    "format": "lavad.owner-snapshot",
                    "v": 1,
                    "pool": 1,
                    "id": "ab",
                    "chunks": 10**9,
                    "bytes": 1,
                    "sha256": "",
                }
            ),
            "pool 1: manifest: a field is missing or out of range",
        ),
    ],
)
def test_a_record_that_is_not_a_snapshots_is_refused_with_the_reason(
    key: bytes | None, value: bytes, reason: str
) -> None:
    reader = SnapshotReader()
    reader.add(key, value)
    assert reader.snapshots() == {} and reader.refused == [reason]


@pytest.mark.kafka
async def test_a_pool_larger_than_a_chunk_restores_whole_from_the_topic(
    broker: EmbeddedBroker,
) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, pools=1, queues=1)
    kafka = KafkaSettings(bootstrap_servers=bootstrap)
    busy = _busy_owner(60)
    owner = Owner(kafka, "a", uniform_topology(1, 60, 1), 1, 20, chunk_bytes=1024)
    owner.owned[0] = busy
    owner.next_offset[0] = 60
    owner.decided[0] = dict.fromkeys((tid, 1) for tid in range(60))
    await owner.producer.start()
    try:
        await owner.snapshot(0)
        first = owner.manifests[0]
        busy.end(0, 1.0)  # one task fewer: another snapshot, other chunks
        owner.next_offset[0] = 61
        await owner.snapshot(0)
    finally:
        await owner.producer.stop()
        await owner.consumer.stop()  # made, never started
    assert first.chunks >= 2, "the test needs a snapshot of several chunks"
    records = await read_partition(bootstrap, OWNER_SNAPSHOTS)
    tombstones = {r.key for r in records if r.value is None}
    assert tombstones == {chunk_key(0, first.snapshot_id, i) for i in range(first.chunks)}
    reader = await latest_snapshots(kafka)
    body = reader.snapshots()[0]
    assert body == encode_owner(busy, 61, [(tid, 1) for tid in range(60)])
    fresh = PoolOwner("owner-of-pool-0", uniform_topology(1, 60, 1).pools[0], 1, 1)
    assert restore_owner(fresh, body) == (61, [(tid, 1) for tid in range(60)])
    assert sorted(fresh.running) == list(range(1, 60))
    assert np.array_equal(fresh.free, busy.free) and reader.refused == []


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        # Written so (its digest matched), not damaged: a count past int64 and an
        # offset the consumer cannot seek to are refused like any foreign snapshot.
        ("free", [[2**64 - 1]] * 3, "OverflowError"),
        ("offset", -5, "offset -5 is no Kafka offset"),
        ("offset", 2**63, "is no Kafka offset"),
        ("offset", 1e300, "is no Kafka offset"),
    ],
)
def test_a_snapshot_with_numbers_no_owner_holds_is_refused_with_the_reason(
    key: str, value: object, reason: str
) -> None:
    body = orjson.loads(encode_owner(_busy_owner(3), 7, []))
    body[key] = value
    fresh = PoolOwner("owner-of-pool-0", uniform_topology(1, 3, 1).pools[0], 1, 1)
    with pytest.raises(WireError, match=reason):
        restore_owner(fresh, orjson.dumps(body))
    # The owner is left as it was made: the take rebuilds it from its launches.
    assert fresh.running == {} and fresh.version == 0
