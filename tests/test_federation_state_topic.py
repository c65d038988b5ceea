"""The federation's state topic on the embedded broker: owners publish summaries, a
global scheduler's view reads them; a summary from a non-owner, a record that is not
a summary and one under the wrong key (or a key of thousands of digits) are refused
with the reason, and reading goes on."""

from __future__ import annotations

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.messages import LaunchRequest, PoolSummary, Task
from lavad.federation.owner import PoolOwner
from lavad.federation.state_topic import (
    StateTopicReader,
    ensure_state_topic,
    pool_key,
)
from lavad.federation.summary_codec import SummaryError, decode_summary, encode_summary
from lavad.federation.topology import uniform_topology
from lavad.federation.view import GlobalView
from lavad.streams.kafka.embedded import EmbeddedBroker

TOPIC = "lavad.federation.state"


def _task(tid: int) -> Task:
    return Task(tid, job=tid, tenant=0, demand=(1,), constraints=0, duration=1.0, arrival=0.0)


def test_summary_codec_round_trip_and_refusals() -> None:
    topology = uniform_topology(1, 3, 2)
    owner = PoolOwner("owner-a", topology.pools[0], 2, 1)
    owner.launch(LaunchRequest(0, 1, 0, 0, _task(1), False), 0.0)
    summary = owner.summary(1.5)
    back = decode_summary(encode_summary(summary), hosts=3, resources=1, tenants=1, schedulers=2)
    assert back.free.tolist() == [[0], [1], [1]] and back.seen_seq == (1, 0)
    assert (back.owner, back.version, back.sent_at) == ("owner-a", summary.version, 1.5)
    with pytest.raises(SummaryError, match="free: want 4 rows"):
        decode_summary(encode_summary(summary), hosts=4, resources=1, tenants=1, schedulers=2)
    with pytest.raises(SummaryError, match="not JSON"):
        decode_summary(b"{", hosts=3, resources=1, tenants=1, schedulers=2)
    negative = encode_summary(summary).replace(b'"free":[[0]', b'"free":[[-1]')
    with pytest.raises(SummaryError, match="integer counts >= 0"):
        decode_summary(negative, hosts=3, resources=1, tenants=1, schedulers=2)


@pytest.mark.kafka
async def test_view_built_from_the_state_topic_refuses_non_owners_and_goes_on(
    broker: EmbeddedBroker,
) -> None:
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
    await ensure_state_topic(kafka, TOPIC, partitions=2)
    topology = uniform_topology(2, 4, 2)
    owners = [PoolOwner(f"owner-{p}", topology.pools[p], 2, 1) for p in range(2)]
    impostor = PoolOwner("owner-x", topology.pools[0], 2, 1)
    owners[0].launch(LaunchRequest(0, 1, 0, 0, _task(1), False), 0.0)
    owners[1].launch(LaunchRequest(1, 1, 1, 2, _task(2), False), 0.0)
    for host in range(4):
        impostor.free[host] = 0  # would make pool 0 look full
    raw = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await raw.start()

    async def publish(summary: PoolSummary) -> None:  # as an owner does (live_owner.py)
        await raw.send_and_wait(TOPIC, encode_summary(summary), key=pool_key(summary.pool))

    try:
        await publish(owners[0].summary(1.0))
        await publish(owners[1].summary(1.0))
        await publish(impostor.summary(2.0))
        await raw.send_and_wait(TOPIC, b"not a summary", key=pool_key(1))
        await raw.send_and_wait(TOPIC, encode_summary(owners[1].summary(2.5)), key=pool_key(0))
        await raw.send_and_wait(TOPIC, b"{}", key=b"elsewhere")
        # More digits than int() takes (4,300): refused as naming no pool, not raised.
        await raw.send_and_wait(TOPIC, b"{}", key=b"pool-" + b"9" * 5_000)
        owners[0].end(1, 3.0)
        await publish(owners[0].summary(3.0))  # reading goes on after the bad ones
    finally:
        await raw.stop()
    view = GlobalView(0, topology, {0: "owner-0", 1: "owner-1"}, tenants=1)
    reader = StateTopicReader(kafka, TOPIC, view)
    await reader.start()
    try:
        assert await reader.catch_up() == 8
    finally:
        await reader.stop()
    assert view.free[0].ravel().tolist() == [1, 1, 1, 1]  # the owner's newest
    assert view.free[1].ravel().tolist() == [1, 1, 0, 1]
    assert reader.applied == 3
    reasons = "\n".join(reader.refused)
    assert "from 'owner-x', not its owner 'owner-0'" in reasons
    assert "not JSON" in reasons
    assert "summary of pool 1 under the key of pool 0" in reasons
    assert "key b'elsewhere' names no pool" in reasons
    assert "key b'pool-9999" in reasons
    assert len(reader.refused) == 5
    np.testing.assert_array_equal(view.tenant_usage(), [[1]])
