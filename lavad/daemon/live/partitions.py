"""The partitions one live instance owns: taking them (restore), giving them up, snapshots.

A partition number of the co-partitioned input topics is the unit that moves
between instances (``snapshots.py``). Taking one restores its snapshot (or,
with ``live.on_bad_snapshot = "rebuild"``, moves a bad one aside and re-reads
the partition from the earliest retained offset) and seeks every input topic
to the offsets the snapshot reflects; giving one up snapshots it and drops
its pools from the engine. Snapshots are written only once every decided
batch is acknowledged (``settled``: the batch in flight is waited for, and
``pending`` is 0): a snapshot ahead of what was published would skip those
decisions after a crash.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import TopicPartition

from lavad.core.engine import Engine
from lavad.daemon.live.snapshots import PartitionSnapshot, SnapshotError, SnapshotStorage
from lavad.daemon.live.telemetry import Telemetry
from lavad.daemon.live.watermark import Watermark
from lavad.daemon.settings import LiveSettings

log = structlog.get_logger("lavad.live")
# Pool names per log line at most: a partition may carry thousands.
LOGGED_POOL_NAMES = 20


@dataclass(slots=True)
class OwnedPartition:
    """A partition number of the input topics this instance holds."""

    number: int
    pools: set[str] = field(default_factory=set)
    # input topic -> next offset to process; absent = from the beginning
    positions: dict[str, int] = field(default_factory=dict)


class Partitions:
    """Owned partitions and the pool -> partition map; ``consumer`` is set once connected.

    ``lock`` serialises deciding a batch and sending it against rebalances
    and snapshots, which must see the state between batches. The shell
    decides further batches while earlier ones are being acknowledged
    (``in_flight``, outside the lock), so whoever holds the lock and needs
    the state to match what is published waits for ``settled`` first.
    """

    def __init__(
        self,
        engine: Engine,
        store: SnapshotStorage,
        watermark: Watermark,
        telemetry: Telemetry,
        live: LiveSettings,
        fail: Callable[[Exception], None],
    ) -> None:
        self.engine = engine
        self.store = store
        self.watermark = watermark
        self.telemetry = telemetry
        self.live = live
        self._fail = fail
        self.consumer: Any = None
        self.owned: dict[int, OwnedPartition] = {}
        # Revoked at a rebalance's start, snapshotted, and kept in the engine
        # until its assignment says whether they stay here: aiokafka's
        # rebalances revoke every partition, and most come back to the same
        # instance, which then resumes them without reading its snapshot back.
        self.parked: dict[int, OwnedPartition] = {}
        # Partition number -> how many times this instance has acquired it. A
        # batch fetched before an acquisition may start past the positions it
        # restored (``Intake.process`` fetches such a batch again).
        self.acquisitions: dict[int, int] = {}
        self.pool_partition: dict[str, int] = {}
        self.lock = asyncio.Lock()
        # Decided batches whose decisions are not all acknowledged (the one in
        # flight, or one a stop left unsent): while above 0 the state is ahead
        # of what was published, so it must not be snapshotted.
        self.pending = 0
        # The shell's task publishing decided batches, if any.
        self.in_flight: asyncio.Task[None] | None = None
        # Committing published batches' offsets, behind the publishing; the
        # offsets waiting for it (a newer batch's replace an older one's).
        self.committing: asyncio.Task[None] | None = None
        self._queued_offsets: dict[TopicPartition, int] | None = None
        self.snapshots_loaded = False
        # Set once the shutdown has snapshotted what it owned: an assignment
        # that still arrives while the consumer leaves the group is not taken.
        self.closed = False
        self._fingerprint = engine.fingerprint

    async def published(self) -> bool:
        """Wait for the batch in flight; True when every decided batch is acknowledged.

        The task is waited for, not awaited: cancelling the caller must not
        cancel a publish. A publish that failed (a stop cut its retries
        short, or the shell stopped the daemon over an error) leaves
        ``pending`` up.
        """
        task = self.in_flight
        if task is not None and not task.done():
            await asyncio.wait([task])
        return self.pending == 0

    async def settled(self) -> bool:
        """``published``, and then every queued offset commit done.

        Called with ``lock`` held, so no new batch is decided meanwhile:
        whoever snapshots, gives up partitions or shuts down sees the
        published batches' offsets committed while the partitions are ours.
        """
        published = await self.published()
        task = self.committing
        if task is not None and not task.done():
            await asyncio.wait([task])
        return published

    def commit_later(
        self,
        offsets: dict[TopicPartition, int],
        commit: Callable[[dict[TopicPartition, int]], Awaitable[None]],
    ) -> None:
        """Commit a published batch's ``offsets`` once the commits before them are done.

        Commits go out one at a time, in batch order; when several batches'
        offsets wait, only the newest is committed (they include the older ones).
        """
        self._queued_offsets = offsets
        if self.committing is None or self.committing.done():
            self.committing = asyncio.create_task(self._commit_queued(commit))

    async def _commit_queued(
        self, commit: Callable[[dict[TopicPartition, int]], Awaitable[None]]
    ) -> None:
        while self._queued_offsets is not None:
            offsets, self._queued_offsets = self._queued_offsets, None
            try:
                await commit(offsets)
            except Exception as exc:  # noqa: BLE001 - in a task it would go unseen
                self._fail(exc)
                return

    def offsets(self) -> dict[TopicPartition, int]:
        return {
            TopicPartition(topic, owned.number): offset
            for owned in self.owned.values()
            for topic, offset in owned.positions.items()
        }

    # ------------------------------------------------------------- snapshots

    def snapshot(self, owned: OwnedPartition) -> None:
        engine_pools = self.engine.pools
        pools = {name: engine_pools[name] for name in owned.pools if name in engine_pools}
        keep = self.live.keep_samples_s
        for pool in pools.values():
            # A daemon runs for ever: only a window of samples goes into memory
            # and snapshots (a replay keeps them all).
            if pool.metrics.last is not None:
                pool.drop_samples_before(pool.metrics.last - keep)
        size = self.store.save(
            PartitionSnapshot(owned.number, self._fingerprint, dict(owned.positions), pools)
        )
        self.telemetry.snapshots.inc()
        log.info(
            "snapshot written",
            partition=owned.number,
            pools=len(pools),
            pool_names=sorted(pools)[:LOGGED_POOL_NAMES],
            bytes=size,
            offsets=owned.positions,
        )

    async def snapshot_all(self) -> None:
        """The periodic snapshot of every owned partition.

        A write the filesystem refuses (disk full) is counted and logged, and
        tried again next interval: the previous snapshot still stands, so a
        restart re-reads more, losing nothing. A state that cannot be written
        as data would fail every time: the daemon stops with the path to it.
        """
        async with self.lock:
            if not await self.settled():
                return
            for owned in self.owned.values():
                try:
                    self.snapshot(owned)
                except OSError as exc:
                    self.telemetry.snapshot_failures.inc()
                    log.error("snapshot not written", partition=owned.number, error=str(exc))
                except SnapshotError as exc:
                    self._fail(exc)
                    return

    def snapshot_owned(self) -> None:
        """Every owned partition now (at shutdown); a failure raises."""
        for owned in self.owned.values():
            self.snapshot(owned)

    def close(self) -> None:
        """Give up every partition at shutdown, after ``snapshot_owned``.

        The pools stay in the engine, which goes with the process; the
        partitions resume from their snapshots elsewhere. Leaving the group
        must not redo the snapshots, and a rebalance that completes while the
        consumer leaves may still assign partitions here: those are left to
        the group rather than restored into an engine that holds their pools.
        """
        self.closed = True
        self.owned.clear()
        self.parked.clear()

    # ------------------------------------------------------------ rebalances

    async def acquire(self, assigned: Iterable[Any]) -> int:
        """New partitions: restore each one's snapshot and seek to its offsets.

        Returns how many pools came from snapshots: 0 when nothing was
        restored (a first start, a partition without a snapshot, a partition
        this instance kept), so the caller knows whether there is new
        long-lived state for the collector to settle.
        """
        assigned = list(assigned)
        restored = 0
        # When the group's answer came: a failover's rebalance ends here and
        # its restore begins (benchmarks/failover.py reads these lines).
        log.info("partitions assigned", partitions=sorted({tp.partition for tp in assigned}))
        if self.closed:
            log.info("partitions assigned while stopping: left to the group")
            return restored
        started = time.monotonic()
        async with self.lock:
            by_number: dict[int, list[Any]] = {}
            for tp in assigned:
                by_number.setdefault(tp.partition, []).append(tp)
            self._drop(self.parked.pop(n) for n in list(self.parked) if n not in by_number)
            for number, tps in sorted(by_number.items()):
                if number in self.owned:
                    continue
                snapshot = None
                kept = self.parked.pop(number, None)
                if kept is not None:
                    owned = kept
                else:
                    snapshot = self._restore(number)
                    owned = OwnedPartition(number)
                if snapshot is not None:
                    restored += len(snapshot.pools)
                    self.engine.adopt_pools(snapshot.pools)
                    owned.pools = set(snapshot.pools)
                    owned.positions = dict(snapshot.offsets)
                    for pool in snapshot.pools:
                        self.pool_partition[pool] = number
                # Every seek is synchronous: awaiting here (seek_to_beginning)
                # lets the fetcher reset the partitions not yet sought from the
                # committed offsets, which are ahead of the snapshot. Offset 0
                # below a truncated log start resets to the earliest offset
                # (auto_offset_reset), which is what "from the beginning" means.
                for tp in tps:
                    self.consumer.seek(tp, owned.positions.get(tp.topic, 0))
                self.owned[number] = owned
                self.acquisitions[number] = self.acquisitions.get(number, 0) + 1
                log.info(
                    "partition acquired",
                    partition=number,
                    snapshot=snapshot is not None,
                    kept=kept is not None,
                    pools=len(owned.pools),
                    # Which pools this instance now owns (the first few by name).
                    pool_names=sorted(owned.pools)[:LOGGED_POOL_NAMES],
                    offsets=owned.positions,
                )
            self.store.settle()
            self.watermark.assign(assigned, time.time())
            self.snapshots_loaded = True
            self.telemetry.assigned_partitions.set(len(self.owned))
        log.info(
            "partitions taken",
            owned=sorted(self.owned),
            restored_pools=restored,
            seconds=time.monotonic() - started,
        )
        return restored

    def _restore(self, number: int) -> PartitionSnapshot | None:
        """The partition's snapshot, or None to read it from the earliest retained offset.

        A snapshot that does not load raises (``live.on_bad_snapshot = "stop"``)
        or is renamed aside, kept for inspection, and the partition rebuilt
        ("rebuild").
        """
        try:
            return self.store.load(number, self._fingerprint)
        except SnapshotError as exc:
            if self.live.on_bad_snapshot == "stop":
                raise SnapshotError(
                    f"{exc} [live.on_bad_snapshot = 'stop': move the file away, or set it to "
                    "'rebuild' to re-read the partition from the earliest retained offset]"
                ) from None
            reason = str(exc)
        aside = self.store.move_aside(number)
        self.telemetry.snapshots_rebuilt.inc()
        log.warning(
            "snapshot moved aside, rebuilding the partition from the earliest retained offset",
            partition=number,
            reason=reason,
            moved_to=str(aside),
        )
        return None

    async def release(self, revoked: Iterable[Any]) -> None:
        """Partitions leave: snapshot them (if all their decisions are out) and drop their pools.

        The batch in flight is waited for first (its offsets are committed
        while the partitions are still ours), so the snapshot is taken exactly
        at what was published rather than skipped.
        """
        revoked = list(revoked)
        # When this instance learnt of the rebalance (for a failover, when the
        # group noticed the loss).
        log.info("partitions revoked", partitions=sorted({tp.partition for tp in revoked}))
        async with self.lock:
            published = await self.settled()
            numbers = sorted({tp.partition for tp in revoked})
            for number in numbers:
                owned = self.owned.pop(number, None)
                if owned is None:
                    continue
                if published:
                    self.snapshot(owned)
                    # The state is exactly the snapshot's: fit to resume here.
                    self.parked[number] = owned
                else:
                    # Ahead of what was published: the snapshot before it is
                    # where this partition resumes, here or elsewhere.
                    self._drop([owned])
                log.info("partition released", partition=number, pools=len(owned.pools))
            # The group now waits for every member to rejoin: read the
            # snapshots meanwhile, whichever partitions come next.
            self.store.prefetch()
            self.watermark.revoke(revoked)
            self.telemetry.assigned_partitions.set(len(self.owned))

    def _drop(self, partitions: Iterable[OwnedPartition]) -> None:
        """Take the partitions' pools out of the engine (they resume elsewhere)."""
        for owned in partitions:
            for name in self.engine.take_pools(owned.pools):
                self.telemetry.forget_pool(name)
            # Pools refused unopened too: the instance that takes the partition tries them.
            for name in owned.pools:
                self.pool_partition.pop(name, None)
