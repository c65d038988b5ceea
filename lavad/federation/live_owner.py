"""A pool-owner process: the owners' consumer group on the launch topic (partition p
is pool p), so a pool belongs to exactly one live instance and moves when it dies.

Taking a pool restores its state from the owner-snapshot topic (compacted, keyed by
pool: the newest snapshot and the launch offset it reflects) and replays the launches
after it; the owner is deterministic (its clock is the launch record's timestamp), so a
replayed launch gets the verdict it got before, with the same content. Per batch:
validate, publish the verdicts and the pool's summary, then commit; every
``snapshot_every`` launches, snapshot (after the verdicts are out).

Launches, preemptions (owner.preempt validates them: a victim that already ended is
refused with the reason) and task ends arrive on the pool's partition in the order
they are applied; each gets a verdict. A launch or preemption is named
``(task, attempt)``; the owner keeps the ids it has decided (the newest
``DECIDED_IDS_KEPT`` per pool, in its snapshot) and drops a launch whose id it has
already decided: its verdict is on the verdicts topic already. Global schedulers never
send an id twice on purpose (see request_ledger.py); this is the second line.

A defect (an exception the owner does not know, not a refused record) halts that pool
only: the record is dead-lettered with the error, the partition is paused where the
record is, and the pool is neither snapshotted nor committed past it, so its state,
perhaps half-changed, is never decided on or written. The instance's other pools go
on. The halted pool's launches wait in its partition, as they wait while an owner is
down (schedulers keep them in flight); an owner without the defect (the fix deployed,
or the pool moved) restores the last snapshot written before it and answers them all,
with the verdicts it would have given. An unfixed owner meets the same record again
and halts again. Why not stop the process: every pool the instance owns would stop
with it, and the same record would stop it again at each restart.

``lavad federation owner --instance NAME --config federation.toml`` (cli.py)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    TopicPartition,
)

from lavad.core.quarantine import error_text, trace_text
from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.live_clients import (
    OWNERS_GROUP,
    fetches,
    group_consumer,
    plain_consumer,
    producer,
    topic_partitions,
)
from lavad.federation.live_wire import (
    DEAD_LETTERS,
    LAUNCHES,
    OWNER_SNAPSHOTS,
    STATE,
    VERDICTS,
    WireError,
    decode_owner_record,
    encode_end_verdict,
    encode_owner,
    encode_verdict,
    restore_owner,
)
from lavad.federation.messages import LaunchRequest, PreemptRequest, TaskEnd
from lavad.federation.owner import PoolOwner
from lavad.federation.owner_snapshots import (
    CHUNK_BYTES,
    Manifest,
    SnapshotReader,
    chunk_key,
    snapshot_records,
)
from lavad.federation.request_ledger import LaunchId
from lavad.federation.state_topic import pool_key
from lavad.federation.summary_codec import encode_summary
from lavad.federation.topology import Topology
from lavad.streams.kafka.deadletter import dead_letter_of

log = structlog.get_logger()

# a duplicate arrives within a takeover's window of launches, not thousands of decisions
# later; the bound keeps the snapshot (one record) well under the broker's message size
DECIDED_IDS_KEPT = 10_000


def owner_id(pool: int) -> str:
    """The owner's name in summaries: the role, whichever instance holds it now."""
    return f"owner-of-pool-{pool}"


async def latest_snapshots(kafka: KafkaSettings) -> SnapshotReader:
    """The owner-snapshots topic read to its end: each pool's newest manifest and chunks."""
    consumer = plain_consumer(kafka)
    await consumer.start()
    reader = SnapshotReader()
    try:
        tps = await topic_partitions(consumer, OWNER_SNAPSHOTS)
        if not tps:
            return reader
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(*tps, timeout_ms=500)
            for records in batch.values():
                for record in records:
                    reader.add(record.key, record.value)
    finally:
        await consumer.stop()
    return reader


@dataclass(eq=False)
class Owner:
    kafka: KafkaSettings
    instance: str
    topology: Topology
    tenants: int
    snapshot_every: int
    chunk_bytes: int = CHUNK_BYTES
    owned: dict[int, PoolOwner] = field(init=False, default_factory=dict)
    next_offset: dict[int, int] = field(init=False, default_factory=dict)
    since_snapshot: dict[int, int] = field(init=False, default_factory=dict)
    # pool -> ids, oldest first
    decided: dict[int, dict[LaunchId, None]] = field(init=False, default_factory=dict)
    # pool -> its newest snapshot's manifest
    manifests: dict[int, Manifest] = field(init=False, default_factory=dict)
    duplicates: int = field(init=False, default=0)
    # pool -> why a defect halted it (its partition paused; never snapshotted again here)
    halted: dict[int, str] = field(init=False, default_factory=dict)
    # pool -> how many times this instance has taken it: a batch fetched before a take
    # (``handle``'s ``taken``) may hold records from before the take's seek.
    takes: dict[int, int] = field(init=False, default_factory=dict)
    producer: AIOKafkaProducer = field(init=False)
    consumer: AIOKafkaConsumer = field(init=False)

    def __post_init__(self) -> None:
        self.producer = producer(self.kafka)
        self.consumer = group_consumer(self.kafka, OWNERS_GROUP)

    async def take(self, assigned: Any) -> None:
        reader = await latest_snapshots(self.kafka)
        snapshots = reader.snapshots()
        for reason in reader.refused:
            log.warning("owner snapshot record refused", instance=self.instance, reason=reason)
        for tp in assigned:
            if tp.partition >= len(self.topology.pools):
                log.warning("launch partition without a pool", partition=tp.partition)
                continue
            pool = self.topology.pools[tp.partition]
            owner = PoolOwner(owner_id(pool.index), pool, self.topology.schedulers, self.tenants)
            offset = 0
            decided: list[LaunchId] = []
            if pool.index in snapshots:
                try:
                    offset, decided = restore_owner(owner, snapshots[pool.index])
                except WireError as exc:
                    log.warning(
                        "owner snapshot refused, rebuilding",
                        instance=self.instance,
                        pool=pool.index,
                        reason=str(exc),
                    )
                    owner = PoolOwner(
                        owner_id(pool.index), pool, self.topology.schedulers, self.tenants
                    )
                    offset = 0
                    decided = []
            self.owned[pool.index] = owner
            if pool.index in reader.manifests:  # its chunks go once a newer one is written
                self.manifests[pool.index] = reader.manifests[pool.index]
            self.decided[pool.index] = dict.fromkeys(decided)
            self.next_offset[pool.index] = offset
            self.since_snapshot[pool.index] = 0
            self.takes[pool.index] = self.takes.get(pool.index, 0) + 1
            self.consumer.seek(tp, offset)
            log.info("pool taken", instance=self.instance, pool=pool.index, offset=offset)

    async def give(self, revoked: Any) -> None:
        for tp in revoked:
            if tp.partition in self.owned:
                if self.halted.pop(tp.partition, None) is None:
                    await self.snapshot(tp.partition)
                del self.owned[tp.partition]

    async def halt(self, tp: TopicPartition, record: Any, exc: Exception) -> None:
        """A defect met ``record``: dead-letter it and stop this pool where it is."""
        pool = tp.partition
        error = error_text(exc)
        reason = (
            f"defect in the owner of pool {pool}: {error}; the pool is halted at offset "
            f"{record.offset} until an owner without the defect takes it"
        )
        self.halted[pool] = reason
        self.consumer.pause(tp)
        log.error(
            "pool halted by a defect",
            instance=self.instance,
            pool=pool,
            offset=record.offset,
            error=error,
            trace=trace_text(exc),
        )
        await (await self.dead_letter(record, reason))
        # The records before it are answered: the group's lag shows the halted ones.
        await self.consumer.commit({tp: record.offset})

    async def dead_letter(self, record: Any, reason: str) -> Any:
        """The record as it came, its reason and origin in headers: never dropped silently."""
        log.warning("launch dead-lettered", instance=self.instance, reason=reason)
        key, value, headers = dead_letter_of(record, "federation-owner", reason)
        return await self.producer.send(DEAD_LETTERS, value, key=key, headers=headers)

    async def snapshot(self, pool: int) -> None:
        """The pool's chunks, then its manifest, then the previous snapshot's chunks gone."""
        owner = self.owned[pool]
        body = encode_owner(owner, self.next_offset[pool], list(self.decided[pool]))
        manifest, chunks, (key, value) = snapshot_records(pool, body, self.chunk_bytes)
        sent = [await self.producer.send(OWNER_SNAPSHOTS, v, key=k) for k, v in chunks]
        await asyncio.gather(*sent)
        await self.producer.send_and_wait(OWNER_SNAPSHOTS, value, key=key)
        previous = self.manifests.get(pool)
        self.manifests[pool] = manifest
        if previous is not None and previous.snapshot_id != manifest.snapshot_id:
            gone = [
                await self.producer.send(
                    OWNER_SNAPSHOTS, None, key=chunk_key(pool, previous.snapshot_id, i)
                )
                for i in range(previous.chunks)
            ]
            await asyncio.gather(*gone)
        self.since_snapshot[pool] = 0

    async def run(self, stop: asyncio.Event) -> None:
        await self.producer.start()
        owner = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await owner.give(revoked)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                await owner.take(assigned)

        self.consumer.subscribe([LAUNCHES], listener=Listener())
        await self.consumer.start()
        try:
            # Read before each fetch (the generator fetches when the loop asks): a take
            # that runs during the fetch or the batch's handling shows as a change.
            takes = dict(self.takes)
            async for batch in fetches(self.consumer, stop, timeout_ms=100):
                for tp, records in batch.items():
                    await self.handle(tp, records, takes.get(tp.partition, 0))
                takes = dict(self.takes)
        finally:
            for pool in list(self.owned):
                if pool not in self.halted:
                    await self.snapshot(pool)
            await self.consumer.stop()
            await self.producer.stop()

    async def handle(self, tp: TopicPartition, records: list[Any], taken: int) -> None:
        """Answer a batch of one partition, fetched when the pool had been taken ``taken``
        times by this instance."""
        owner = self.owned.get(tp.partition)
        futures = []
        if tp.partition in self.halted:
            return  # fetched before the pause: they wait in the partition with the rest
        if owner is None and tp.partition < len(self.topology.pools):
            # assigned, not yet taken (take() is restoring it) or given up since the fetch:
            # take() seeks to the snapshot's offset, so these records come again
            return
        if owner is not None and self.takes.get(tp.partition, 0) != taken:
            # Taken while this batch was fetched or waited here: aiokafka fetches a newly
            # assigned partition from the group's committed offset while take() restores
            # the snapshot, so the batch may start past the snapshot's offset. Applied to
            # the restored state, it skipped the launches in between: their hosts looked
            # free and were given twice. Fetch again from where the state is.
            self.consumer.seek(tp, self.next_offset[tp.partition])
            return
        if owner is None:
            pools = len(self.topology.pools)
            reason = f"launch on partition {tp.partition}: the federation has {pools} pools"
            for record in records:
                futures.append(await self.dead_letter(record, reason))
            await asyncio.gather(*futures)
            await self.consumer.commit({tp: records[-1].offset + 1})
            return
        for record in records:
            if record.offset < self.next_offset[tp.partition]:
                continue  # applied already (fetched before the take's seek)
            now = record.timestamp / 1000.0
            self.next_offset[tp.partition] = record.offset + 1
            try:
                request = decode_owner_record(record.value)
            except WireError as exc:
                futures.append(await self.dead_letter(record, str(exc)))
                continue
            try:
                answered = self.decide(owner, tp.partition, request, now)
            except Exception as exc:  # noqa: BLE001 - a defect: this pool halts, the others go on
                await asyncio.gather(*futures)
                await self.halt(tp, record, exc)
                return
            if answered is None:
                continue
            task_id, answer = answered
            futures.append(await self.producer.send(VERDICTS, answer, key=str(task_id).encode()))
            self.since_snapshot[tp.partition] += 1
        if not records:
            return
        futures.append(
            await self.producer.send(
                STATE,
                encode_summary(owner.summary(records[-1].timestamp / 1000.0)),
                key=pool_key(tp.partition),
            )
        )
        await asyncio.gather(*futures)
        await self.consumer.commit({tp: self.next_offset[tp.partition]})
        if self.since_snapshot[tp.partition] >= self.snapshot_every:
            await self.snapshot(tp.partition)

    def decide(
        self,
        owner: PoolOwner,
        pool: int,
        request: LaunchRequest | PreemptRequest | TaskEnd,
        now: float,
    ) -> tuple[int, bytes] | None:
        """The task and the encoded verdict on ``request``; None for a duplicate launch."""
        if isinstance(request, TaskEnd):
            return request.task_id, encode_end_verdict(
                request, owner.end(request.task_id, now), self.instance
            )
        launch_id = (request.task.task_id, request.attempt)
        decided = self.decided[pool]
        if launch_id in decided:
            self.duplicates += 1
            log.info("duplicate launch dropped", instance=self.instance, launch=launch_id)
            return None
        decided[launch_id] = None
        if len(decided) > DECIDED_IDS_KEPT:
            del decided[next(iter(decided))]
        if isinstance(request, PreemptRequest):
            verdict = owner.preempt(request, now)
        else:
            verdict = owner.launch(request, now)
        return request.task.task_id, encode_verdict(request, verdict, self.instance)
