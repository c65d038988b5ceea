"""A global-scheduler process: the schedulers' consumer group on the requests topic
(keyed by tenant queue), a view of every pool from the state topic, launches to the
owners' topic (partition p is pool p), verdicts read back: accepted, or refused with
the owner's summary, which the view applies before the task is decided again.

``--state-lag-s`` reads the state topic only that often: a view stale on purpose
(the test that shows stale launches refused and retried).

A defect (an exception the scheduler does not know, not a refused record) met while
admitting one request, deciding one task or applying one verdict sets that record
aside: dead-lettered with the error, logged at error level with the traceback, counted
in ``lavad_federation_records_set_aside_total``. A request set aside, at admission or at
its decision, is done for its queue (committed past, as a malformed one is): once fixed,
produce it again from its dead letter. A verdict set aside leaves its task waiting for
it; every scheduler reads the verdicts from the beginning at its start, so one without
the defect applies it then. Why not stop: a request's queue moves to another scheduler
when its holder dies, and every scheduler reads every verdict, so one such record would
stop them all, at each restart. A defect in what a decision does for every queue at
once (the fairness view, the bookkeeping of a launch decided) still stops the process:
no one record can be set aside there.

``lavad federation scheduler --gm 0 --config federation.toml`` (cli.py)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import orjson
import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from prometheus_client import CollectorRegistry, Counter

from lavad.core.quarantine import error_text, trace_text
from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.live.connection import client_options
from lavad.federation.fairness import Shares
from lavad.federation.inflight import LaunchesInFlight
from lavad.federation.launch_backlog import launches_since_owners_commit
from lavad.federation.live_allocation import AllocationClock
from lavad.federation.live_clients import (
    SCHEDULERS_GROUP,
    fetches,
    group_consumer,
    plain_consumer,
    producer,
    topic_partitions,
)
from lavad.federation.live_owner import owner_id
from lavad.federation.live_wire import (
    DEAD_LETTERS,
    LAUNCHES,
    REQUESTS,
    STATE,
    VERDICTS,
    EndVerdict,
    LaunchVerdict,
    WireError,
    decode_request,
    decode_verdict,
    encode_launch,
    encode_request,
)
from lavad.federation.messages import LaunchRequest, PoolSummary, PreemptRequest, Task
from lavad.federation.request_ledger import CommitWatermark, RequestLedger
from lavad.federation.running_tasks import RunningTasks
from lavad.federation.scheduler import GlobalScheduler, Launch, Preempt
from lavad.federation.state_topic import StateTopicReader
from lavad.federation.topology import Topology
from lavad.federation.view import GlobalView
from lavad.streams.kafka.deadletter import (
    DEFAULT_MAX_BYTES,
    bounded,
    dead_letter_headers,
    dead_letter_of,
)

log = structlog.get_logger()

# Offsets are committed at most this often: a commit is a round trip to the group's
# coordinator, and committing less only means more requests read again (and skipped
# as final) by the queue's next holder.
COMMIT_EVERY_S = 0.5
# The ledger forgets the requests below the queues' committed offsets this often (a
# round trip to the group's coordinator for every queue's offset), and after every so
# many verdicts read (with the offsets it has: a start reads the whole verdicts log, and
# the ledger must not hold all of it first).
RETIRE_EVERY_S = 5.0
RETIRE_EVERY_VERDICTS = 10_000


class Scheduler:
    """One global-scheduler process. Restart-safe: a request's offset is committed only
    once it is final (its launch accepted, or refused for good); a launch is named by its
    request and attempt; a scheduler that takes tenant queues over (at start, after a
    rebalance, after another's crash) first learns every verdict and every launch still
    unanswered, then reads the queues from their committed offsets: a request already
    final is skipped, one with a launch unanswered waits for its verdict, the others are
    decided with their next attempt. Launch seqs go on from the highest this scheduler's
    index ever sent, so a restarted process is not refused as out of order."""

    def __init__(
        self,
        kafka: KafkaSettings,
        gm: int,
        topology: Topology,
        tenants: int,
        state_lag_s: float,
        shares: Shares | None = None,
    ) -> None:
        self.kafka = kafka
        self.gm = gm
        self.topology = topology
        self.state_lag_s = state_lag_s
        owners = {p.index: owner_id(p.index) for p in topology.pools}
        self.view = GlobalView(gm, topology, owners, tenants)
        self.sched = GlobalScheduler(gm, topology, self.view, list(range(tenants)), shares)
        self.running = RunningTasks(len(topology.pools), tenants, len(topology.resources))
        self.ledger = RequestLedger()
        self.owned: dict[int, CommitWatermark] = {}  # requests partition -> its watermark
        self.to_take: list[int] = []  # partitions assigned, not yet taken over
        self.holding: dict[int, int] = {}  # task queued or in flight here -> its partition
        # launches whose verdict this one acts on
        self.inflight = LaunchesInFlight(tenants, len(topology.resources))
        self.replayed = {"already_final": 0, "launch_unanswered": 0, "decided_again": 0}
        self.retired = 0  # requests the ledger forgot, below their queue's commit
        self.committed: dict[int, int] = {}  # requests partition -> the group's commit, last read
        self.verdicts_since_retire = 0
        self.lock = asyncio.Lock()  # one of: a loop's work, giving queues up, taking them
        self.producer = producer(kafka)
        self.requests = group_consumer(kafka, SCHEDULERS_GROUP)
        self.verdicts = plain_consumer(kafka)
        self.verdict_parts: list[TopicPartition] = []
        self.admin = AIOKafkaAdminClient(**client_options(kafka))
        self.state = StateTopicReader(kafka, STATE, self.view)
        self.registry = CollectorRegistry()
        self.clock = AllocationClock(self.registry)
        self.set_aside = Counter(
            "lavad_federation_records_set_aside",
            "Records a defect in the scheduler met, dead-lettered with the error",
            ["record"],
            registry=self.registry,
        )

    async def run(self, stop: asyncio.Event) -> None:
        await self.producer.start()
        await self.admin.start()
        await self.state.start()
        # the view is read once before the group is joined, so a scheduler that has
        # taken queues ("queues taken") has read it: with a long state lag, a view
        # stale from its start, not from whenever the first fetch happened to run
        await self.state.catch_up()
        next_state = time.monotonic() + self.state_lag_s
        await self.verdicts.start()
        self.verdict_parts = await topic_partitions(self.verdicts, VERDICTS)
        self.verdicts.assign(self.verdict_parts)
        await self.verdicts.seek_to_beginning(*self.verdict_parts)
        scheduler = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await scheduler.give(revoked)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                scheduler.to_take.extend(tp.partition for tp in assigned)

        self.requests.subscribe([REQUESTS], listener=Listener())
        await self.requests.start()
        next_commit = 0.0
        next_retire = time.monotonic() + RETIRE_EVERY_S
        try:
            async for batch in fetches(self.requests, stop, timeout_ms=50):
                async with self.lock:
                    if self.to_take:
                        await self.take_over()
                    for tp, records in batch.items():
                        await self.read_requests(tp.partition, records)
                    if time.monotonic() >= next_state:
                        await self.state.catch_up()
                        next_state = time.monotonic() + self.state_lag_s
                    await self.read_verdicts(timeout_ms=20)
                    await self.launch_what_fits()
                    if time.monotonic() >= next_commit:
                        await self.commit()
                        next_commit = time.monotonic() + COMMIT_EVERY_S
                    if time.monotonic() >= next_retire:
                        await self.read_commits()
                        self.retire()
                        next_retire = time.monotonic() + RETIRE_EVERY_S
        finally:
            log.info(
                "scheduler stopping",
                gm=self.gm,
                ledger_entries=self.ledger.entries(),
                retired=self.retired,
                **self.replayed,
            )
            if stop.is_set():  # a clean stop: what is final is committed
                async with self.lock:
                    await self.commit()
            await self.requests.stop()
            await self.verdicts.stop()
            await self.state.stop()
            await self.admin.close()
            await self.producer.stop()

    async def take_over(self) -> None:
        """Learn every launch still unanswered and every verdict, then own the partitions:
        their records (from the committed offsets) are read in the loop."""
        started = time.monotonic()
        taken, self.to_take = sorted(set(self.to_take)), []
        await self.read_commits()
        unanswered = await launches_since_owners_commit(self.kafka, self.admin)
        for launch in unanswered:
            self.ledger.located(launch.task, launch.queue, launch.request_offset)
            self.ledger.launched(launch.task, launch.attempt, launch.gm, launch.seq, launch.pool)
        await self.read_verdicts(to_end=True)
        self.sched.seq = max(self.sched.seq, self.ledger.max_seq.get(self.gm, 0))
        for partition in taken:
            self.owned[partition] = CommitWatermark()
        for task in self.ledger.waiting_again(set(taken)):
            self.requeue(task)
        log.info(
            "queues taken",
            gm=self.gm,
            partitions=taken,
            launches_since_owners_commit=len(unanswered),
            seq=self.sched.seq,
            seconds=round(time.monotonic() - started, 3),
        )

    def requeue(self, task: Task) -> None:
        """A task a preemption ended goes back to its tenant's queue, if the queue is here
        (tenant queue t is requests partition t); its holder re-reads it at a takeover."""
        partition = task.tenant
        if partition not in self.owned or task.task_id in self.holding:
            return
        self.holding[task.task_id] = partition
        self.clock.arrived(task.task_id, time.time())
        self.sched.enqueue(task)

    async def give(self, revoked: Any) -> None:
        """The queues move: commit what is final, forget the rest (its new holder reads
        it again); every launch decided is in the log before this returns."""
        async with self.lock:
            await self.producer.flush()
            await self.commit()
            parts = {tp.partition for tp in revoked}
            self.to_take = [p for p in self.to_take if p not in parts]
            for partition in parts:
                self.owned.pop(partition, None)
            gone = {task for task, partition in self.holding.items() if partition in parts}
            self.sched.drop(gone)
            for launch_id in [i for i in self.inflight.ids() if i[0] in gone]:
                self.inflight.pop(launch_id)
            for task in gone:
                del self.holding[task]
                self.clock.forget(task)
            log.info("queues given up", gm=self.gm, partitions=sorted(parts), tasks=len(gone))

    async def read_requests(self, partition: int, records: list[Any]) -> None:
        mark = self.owned.get(partition)
        if mark is None:
            return  # revoked since the fetch: its new holder reads it again
        for record in records:
            try:
                task = decode_request(record.value)
                unfit = self.unfit_task(task)
                if unfit is not None:
                    raise WireError(f"request: {unfit}")
            except WireError as exc:
                await self.dead_letter(record, str(exc))
                mark.read(record.offset, None)
                continue
            try:
                self.admit(task, partition, record.offset, record.timestamp / 1000.0)
            except Exception as exc:  # noqa: BLE001 - a defect: this request is set aside
                await self.set_aside_record(record, "request", exc)
                mark.read(record.offset, None)
                continue
            mark.read(record.offset, task.task_id)

    def admit(self, task: Task, partition: int, offset: int, arrival: float) -> None:
        self.ledger.located(task.task_id, partition, offset)
        if self.ledger.is_final(task.task_id):
            self.replayed["already_final"] += 1
            return
        if task.task_id in self.holding:
            return  # the same request twice in the queue: one decision
        self.holding[task.task_id] = partition
        self.clock.arrived(task.task_id, arrival)
        waiting = self.ledger.outstanding(task.task_id)
        if waiting is not None:
            self.replayed["launch_unanswered"] += 1
            log.info(
                "request waits for its launch's verdict",
                task=task.task_id,
                attempt=waiting.attempt,
                gm_of_launch=waiting.gm,
            )
            self.inflight.add((task.task_id, waiting.attempt), task)
            return
        if self.ledger.next_attempt(task.task_id) > 1:
            self.replayed["decided_again"] += 1
        self.sched.enqueue(task)

    async def read_verdicts(self, *, timeout_ms: int = 0, to_end: bool = False) -> None:
        ends = await self.verdicts.end_offsets(self.verdict_parts) if to_end else {}
        while True:
            answers = await self.verdicts.getmany(*self.verdict_parts, timeout_ms=timeout_ms)
            for records in answers.values():
                for record in records:
                    try:
                        self.answer(decode_verdict(record.value), record.timestamp / 1000.0)
                    except WireError as exc:
                        await self.dead_letter(record, str(exc))
                    except Exception as exc:  # noqa: BLE001 - a defect: this verdict is set aside
                        await self.set_aside_record(record, "verdict", exc)
                self.verdicts_since_retire += len(records)
            if self.verdicts_since_retire >= RETIRE_EVERY_VERDICTS:
                self.retire()
            if not to_end:
                return
            behind = [
                tp for tp in self.verdict_parts if await self.verdicts.position(tp) < ends[tp]
            ]
            if not behind:
                return
            timeout_ms = 300

    async def commit(self) -> None:
        """Each owned partition up to its first request not yet final."""
        offsets = {}
        for partition, mark in self.owned.items():
            target = mark.advance(self.ledger.is_final)
            if target is not None:
                offsets[TopicPartition(REQUESTS, partition)] = target
        if not offsets:
            return
        try:
            await self.requests.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # the group is rebalancing: the queue's next holder reads the requests since
            # the last commit again, and the ledger makes that harmless
            log.warning("commit refused", gm=self.gm, reason=repr(exc))

    async def read_commits(self) -> None:
        """Every queue's committed offset in the schedulers' group. A commit only moves
        forward, so offsets read earlier stay safe to forget below."""
        tps = [TopicPartition(REQUESTS, queue) for queue in sorted(self.sched.queues)]
        try:
            marks = await self.admin.list_consumer_group_offsets(SCHEDULERS_GROUP, partitions=tps)
        except KafkaError as exc:
            log.warning("committed offsets not read", gm=self.gm, reason=repr(exc))
            return  # the ledger forgets by the offsets it had until the next try
        for tp, mark in marks.items():
            if mark is not None and mark.offset > self.committed.get(tp.partition, -1):
                self.committed[tp.partition] = mark.offset

    def retire(self) -> None:
        """Let the ledger forget the requests below every queue's committed offset: final,
        never read again by any holder (the ledger keeps those still waiting on something)."""
        retired = self.ledger.retire_below(self.committed, self.running.__contains__)
        self.verdicts_since_retire = 0
        if retired:
            self.retired += retired
            log.info(
                "requests forgotten",
                gm=self.gm,
                retired=retired,
                total=self.retired,
                ledger_entries=self.ledger.entries(),
            )

    async def set_aside_record(self, record: Any, kind: str, exc: Exception) -> None:
        """A defect met ``record`` (a request or a verdict): dead-letter it with the error."""
        error = self._report_set_aside(kind, exc, topic=record.topic, offset=record.offset)
        await self.dead_letter(record, f"defect in global scheduler {self.gm}: {error}")

    async def set_aside_task(self, task: Task, exc: Exception) -> None:
        """A defect met deciding ``task``: its request is dead-lettered (encoded again from
        the task: the record itself was read long before) and is done for its queue."""
        position = self.ledger.position(task.task_id)
        queue, offset = position if position is not None else (task.tenant, -1)
        error = self._report_set_aside("decision", exc, task=task.task_id, offset=offset)
        self.ledger.set_aside(task.task_id)
        self.holding.pop(task.task_id, None)
        self.clock.forget(task.task_id)
        reason = f"defect in global scheduler {self.gm} deciding the task: {error}"
        headers = dead_letter_headers("federation-scheduler", reason, REQUESTS, queue, offset)
        await self._publish_dead_letter(
            *bounded(b"%d" % task.tenant, encode_request(task), headers, DEFAULT_MAX_BYTES)
        )

    def _report_set_aside(self, kind: str, exc: Exception, **where: Any) -> str:
        """Log (with the traceback) and count a record set aside; the error's bounded text."""
        error = error_text(exc)
        log.error(
            "record set aside after a defect",
            record=kind,
            gm=self.gm,
            **where,
            error=error,
            trace=trace_text(exc),
        )
        self.set_aside.labels(record=kind).inc()
        return error

    async def dead_letter(self, record: Any, reason: str) -> None:
        """The record as it came, its reason and origin in headers: never dropped silently."""
        log.warning("request dead-lettered", offset=record.offset, reason=reason)
        await self._publish_dead_letter(*dead_letter_of(record, "federation-scheduler", reason))

    async def _publish_dead_letter(
        self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]
    ) -> None:
        await self.producer.send_and_wait(DEAD_LETTERS, value, key=key, headers=headers)

    def unfit_task(self, task: Task) -> str | None:
        """Why ``task`` cannot be one of this federation's (its tenant, its demand), or None."""
        if task.tenant not in self.sched.queues:
            return f"tenant {task.tenant} is not one of the federation's"
        resources = len(self.topology.resources)
        if len(task.demand) != resources:
            return f"demand names {len(task.demand)} resources, the federation has {resources}"
        return None

    def unfit_verdict(self, verdict: LaunchVerdict | EndVerdict) -> str | None:
        """Why ``verdict`` does not fit this federation (a pool, host, tenant or shape it does
        not have), or None. Checked before any of it is applied, so none is half-applied."""
        pools = len(self.view.free)
        pool = verdict.pool if isinstance(verdict, EndVerdict) else verdict.ids.pool
        if pool >= pools:
            return f"pool {pool}: the federation has {pools}"
        if isinstance(verdict, EndVerdict):
            return None
        free = self.view.free[pool]
        if verdict.ids.host >= free.shape[0]:
            return f"host {verdict.ids.host}: pool {pool} has {free.shape[0]}"
        unfit = self.unfit_task(verdict.request)
        if unfit is not None:
            return unfit
        summary = verdict.summary
        if summary is not None and (
            summary.free.shape != free.shape
            or summary.tenant_usage.shape != self.view.usage[pool].shape
        ):
            return f"summary of shapes {summary.free.shape} and {summary.tenant_usage.shape}"
        return None

    def answer(self, verdict: LaunchVerdict | EndVerdict, at: float) -> None:
        unfit = self.unfit_verdict(verdict)
        if unfit is not None:
            raise WireError(f"verdict: {unfit}")
        if isinstance(verdict, EndVerdict):
            if verdict.accepted:
                self.running.ended(verdict.task_id)
            return
        ids = verdict.ids
        request = verdict.request
        task_id, attempt = request.task_id, ids.attempt
        accepted, final = verdict.accepted, verdict.final
        self.ledger.located(task_id, request.tenant, ids.request_offset)
        self.ledger.answered(task_id, attempt, ids.gm, ids.seq, accepted, final)
        if accepted:
            self.running.started(request, ids.gm, ids.pool, ids.host, at)
            for victim_id in verdict.preempted:
                victim = self.running.ended(victim_id)
                if victim is not None:
                    self.ledger.preempted(victim)
                    self.requeue(victim)
        self.running.answered((task_id, attempt))
        task = self.inflight.pop((task_id, attempt))
        if task is None:
            return  # another's launch, or a duplicate from an owner that replayed it
        summary = verdict.summary
        if summary is not None:
            self.view.apply(
                PoolSummary(
                    pool=ids.pool,
                    owner=summary.owner,
                    version=summary.version,
                    sent_at=0.0,
                    free=summary.free,
                    seen_seq=summary.seen_seq,
                    tenant_usage=summary.tenant_usage,
                    queue_length=0,
                )
            )
        if accepted or final:
            del self.holding[task_id]
            if accepted:
                self.clock.accepted(task_id, time.time())
            else:
                self.clock.forget(task_id)
                log.warning("launch refused, final", task=task_id, reason=verdict.reason)
            return
        self.clock.refused(task_id, time.time())
        if ids.gm == self.gm:
            self.view.forget(ids.pool, ids.seq)
        log.info("stale launch refused, retrying", task=task_id, reason=verdict.reason)
        self.sched.enqueue(task, front=True)

    def fairness_view(self) -> None:
        """Algorithm 2's inputs from the verdicts: each pool's running tasks (but victims of
        our preemptions in flight) and every tenant's usage, with our launches in flight."""
        for pool, tasks in enumerate(self.running.pools):
            self.view.running[pool] = tasks  # read through: kept as tasks start and end
        usage = self.running.usage + self.inflight.usage
        for tenant in self.sched.own_usage:
            self.sched.own_usage[tenant] = usage[tenant]

    async def launch_what_fits(self) -> None:
        futures = []
        if self.sched.shares is not None:
            self.fairness_view()
        while (task := self.sched.next_task()) is not None:
            started = time.time()
            try:
                choice, _ = self.sched.decide(task)
            except Exception as exc:  # noqa: BLE001 - a defect: this task is set aside
                await self.set_aside_task(task, exc)
                continue
            self.clock.decided(task.task_id, started, time.time())
            if not isinstance(choice, Launch | Preempt):
                self.sched.park(task)
                continue
            self.sched.seq += 1
            attempt = self.ledger.next_attempt(task.task_id)
            position = self.ledger.position(task.task_id)
            request_offset = -1 if position is None else position[1]
            request: LaunchRequest | PreemptRequest
            if isinstance(choice, Preempt):
                request = PreemptRequest(
                    self.gm,
                    self.sched.seq,
                    choice.pool,
                    choice.host,
                    choice.victims,
                    task,
                    attempt,
                    request_offset,
                )
                self.running.leaving((task.task_id, attempt), choice.victims)
                log.info("preempting", task=task.task_id, victims=list(choice.victims))
            else:
                request = LaunchRequest(
                    gm=self.gm,
                    seq=self.sched.seq,
                    pool=choice.pool,
                    host=choice.host,
                    task=task,
                    repartition=choice.repartition,
                    attempt=attempt,
                    request_offset=request_offset,
                )
            self.view.reserve(choice.pool, choice.host, np.asarray(task.demand), self.sched.seq)
            self.ledger.launched(task.task_id, request.attempt, self.gm, request.seq, choice.pool)
            self.inflight.add((task.task_id, request.attempt), task)
            if isinstance(choice, Preempt):
                self.fairness_view()  # its victims are no longer candidates
            elif self.sched.shares is not None:
                self.sched.charge(task.tenant, np.asarray(task.demand, dtype=np.int64), +1)
            futures.append(
                await self.producer.send(
                    LAUNCHES,
                    encode_launch(request),
                    key=orjson.dumps(task.task_id),
                    partition=choice.pool,
                )
            )
        if futures:
            await asyncio.gather(*futures)
