"""The consuming side of the live shell: a fetched batch through the engine, as records to publish.

Each input record is decoded (a record that does not decode, came on
another input topic than its event type's, belongs to another partition's
pool, or contradicts the state becomes a dead letter with
the reason, published after the decisions the engine's timers made on the
way), fed to the engine at its event time, and its decisions become
``Outgoing`` records. After the batch, the timers run up to the watermark,
which only plausible event times move.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import structlog

from lavad.core.engine import Engine
from lavad.core.input_bounds import NEVER
from lavad.daemon.live.parsed_records import FetchedRecord
from lavad.daemon.live.partitions import OwnedPartition, Partitions
from lavad.daemon.live.publisher import Outgoing
from lavad.daemon.live.telemetry import Telemetry
from lavad.daemon.live.watermark import Watermark
from lavad.streams.codec import SchemaError, decode_event, encode
from lavad.streams.kafka.deadletter import bounded, dead_letter_headers
from lavad.streams.kafka.topics import TopicNames
from lavad.streams.schema import EVENT_TYPES, Decision, Placement

log = structlog.get_logger("lavad.live")


def record_time_refusal(now: float, record_ms: int | None, bound: float) -> str | None:
    """Why an event at ``now`` cannot be on a Kafka record stamped ``record_ms``, or None.

    ``[input] max_ahead_s`` (30 days) lets a pool wake after weeks of quiet,
    so by its pool's clock alone a record stamped a day ahead by a fast clock
    is plausible: handled, it would move the pool's clock a day on, and every
    rightly stamped event after it would be refused as more than
    ``max_behind_s`` behind, for a day. The record's timestamp says when it
    was produced (or appended), so an event time ``bound`` past it is the
    record's fault, and it alone is refused; below ``max_behind_s``, the
    events after one let through are late by less than that and handled at
    the pool's clock. Read off the record, not this machine's clock, so a
    record read again (a restart, another owner) is refused again. 0: no
    bound; a record without a timestamp (-1) is not checked. Milliseconds
    sent as seconds are caught here first, in live.
    """
    if not bound or record_ms is None or record_ms < 0:
        return None
    stamped = record_ms / 1000.0
    ahead = now - stamped
    if ahead > bound:
        return (
            f"event time {now!r} is {ahead:.0f} s ahead of its record's timestamp {stamped!r}"
            f" (live.max_ahead_of_record_s = {bound:g}): the event's clock is ahead of the"
            " producer's"
        )
    return None


@dataclass(eq=False)
class Intake:
    engine: Engine
    partitions: Partitions
    watermark: Watermark
    telemetry: Telemetry
    names: TopicNames
    log_decisions: bool
    # A dead letter's key, value and headers at most (``deadletter.bounded``).
    dead_letter_max_bytes: int
    # ``record_time_refusal``'s bound (``[live] max_ahead_of_record_s``).
    max_ahead_of_record_s: float
    records_processed: int = field(init=False, default=0)
    _event_counts: Counter[str] = field(init=False, default_factory=Counter)
    # Each event type's input topic (``TopicNames.for_event_type``), looked up per record.
    _topic_of: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self._topic_of = {kind: self.names.for_event_type(kind) for kind in EVENT_TYPES}

    def process(
        self, batch: dict[Any, list[FetchedRecord]], acquired: dict[int, int]
    ) -> list[Outgoing]:
        """``batch``'s records in order, with what to publish; ``acquired`` is
        ``Partitions.acquisitions`` as it was when the fetch began."""
        out: list[Outgoing] = []
        partitions = self.partitions
        owned_by_number = partitions.owned
        wall = time.time()
        for tp, records in batch.items():
            owned = owned_by_number.get(tp.partition)
            if owned is None or not records:
                continue  # revoked between fetch and processing: the next owner reads them
            expected = owned.positions.get(tp.topic, 0)
            if partitions.acquisitions.get(tp.partition, 0) != acquired.get(tp.partition, 0):
                # Acquired while this batch was fetched or waited for the lock:
                # aiokafka fetches a newly assigned partition from the group's
                # committed offset before the rebalance listener restores and
                # seeks, so the batch may start past the restored positions, and
                # applied it would skip the records in between. Fetch again.
                partitions.consumer.seek(tp, expected)
                continue
            if records[0].offset < expected:
                # Already reflected in the state (a fetch that raced a seek).
                fresh = [record for record in records if record.offset >= expected]
                self.telemetry.records_skipped.inc(len(records) - len(fresh))
            else:
                fresh = records
            self._records(owned, tp, fresh, wall, out)
            owned.positions[tp.topic] = records[-1].offset + 1
            self.records_processed += len(records)
        for event_type, count in self._event_counts.items():
            self.telemetry.events.labels(event_type).inc(count)
        self._event_counts.clear()
        self._log_defects()
        return out

    def _records(
        self,
        owned: OwnedPartition,
        tp: Any,
        records: list[FetchedRecord],
        wall: float,
        out: list[Outgoing],
    ) -> None:
        """One partition's records, in order, appending what to publish to ``out``.

        ``records`` are aiokafka's parsed records (``parsed_records.py``).
        Names are bound once per batch, not looked up per record.
        """
        engine = self.engine
        handle = engine.handle
        pools = engine.pools
        pool_partition = self.partitions.pool_partition
        observe = self.watermark.observe
        counts = self._event_counts
        decision = self.decision
        number = owned.number
        topic = tp.topic
        topic_of = self._topic_of
        latest = NEVER
        ahead_bound = self.max_ahead_of_record_s
        for record in records:
            raw: bytes | None = record.value
            if raw is None:
                tombstone = "record has no value (tombstone)"
                out.append(self.dead_letter(record, tp, "decode", tombstone))
                continue
            try:
                event = decode_event(raw)
            except SchemaError as exc:
                out.append(self.dead_letter(record, tp, "decode", str(exc)))
                continue
            if topic_of[event.type] != topic:
                # Applied, it would be ordered against its pool's other events by
                # how fetches interleave (an exit before its request), and a
                # producer publishing to the wrong topic would go unnoticed.
                reason = (
                    f"a {event.type} event belongs on topic {topic_of[event.type]!r}, "
                    f"in whose order its pool's events are applied; it came on {topic!r}"
                )
                out.append(self.dead_letter(record, tp, "routing", reason))
                continue
            refused = record_time_refusal(event.time, record.timestamp, ahead_bound)
            if refused is not None:
                # Before its pool is looked up: a refused record opens nothing.
                out.append(self.dead_letter(record, tp, "time", refused))
                continue
            pool = event.pool
            owner = pool_partition.get(pool)
            if owner is None:
                pool_partition[pool] = owner = number
                owned.pools.add(pool)
            if owner != number:
                reason = (
                    f"pool {pool!r} lives on partition {owner} of the input topics, this record "
                    f"came on partition {number}: key every input record by its pool"
                )
                out.append(self.dead_letter(record, tp, "routing", reason))
                continue
            counts[event.type] += 1
            handled = handle(event, event.time)
            rejection = handled.rejection
            if not handled.time_refused:
                # Only a plausible time moves the watermark (and every pool's timers);
                # the latest of the batch is enough (observe keeps the maximum).
                latest = max(latest, event.time)
            if pool not in pools and not engine.holds(pool):
                # Refused before the pool opened: its name must not be kept either
                # (a pool whose opening raised is kept: its refusal goes with its partition).
                owned.pools.discard(pool)
                pool_partition.pop(pool, None)
            timestamp = record.timestamp
            for made in handled.decisions:
                out.append(decision(made, timestamp))
            if rejection is not None:
                # After the decisions the timers made on the way: both are published.
                out.append(self.dead_letter(record, tp, rejection.stage, rejection.reason))
        if latest != NEVER:
            observe(tp, latest, wall)

    def advance_timers(self) -> list[Outgoing]:
        now = self.watermark.current(time.time())
        self.telemetry.watermark.set(now if now != NEVER else 0.0)
        decided = [self.decision(d, None) for d in self.engine.advance(now)]
        self._log_defects()
        return decided

    def _log_defects(self) -> None:
        """Each pool a defect quarantined since the last call, with its trace, at error level."""
        for pool, quarantine in self.engine.take_defects():
            log.error(
                "pool quarantined",
                pool=pool,
                during=quarantine.during,
                event_time=quarantine.time,
                error=quarantine.error,
                trace=quarantine.trace,
            )

    def decision(self, decision: Decision, timestamp_ms: int | None) -> Outgoing:
        if self.log_decisions:
            log.debug("decision", decision_id=decision.decision_id, kind=decision.kind)
        elif isinstance(decision, Placement) and decision.host_id is None:
            # A request nobody could take is worth a line at info level.
            log.info(
                "unplaced",
                decision_id=decision.decision_id,
                reason=decision.reason,
                retryable=decision.retryable,
            )
        return Outgoing(
            self.names.for_decision(decision.kind),
            decision.pool.encode(),
            encode(decision),
            [("lavad.decision_id", decision.decision_id.encode())],
            timestamp_ms,
            decision.kind,
        )

    def dead_letter(self, record: FetchedRecord, tp: Any, stage: str, reason: str) -> Outgoing:
        self.telemetry.dead_letters.labels(stage).inc()
        log.info(
            "dead letter",
            stage=stage,
            reason=reason,
            topic=tp.topic,
            partition=tp.partition,
            offset=record.offset,
        )
        key, value, headers = bounded(
            record.key,
            record.value if record.value is not None else b"",
            dead_letter_headers(stage, reason, tp.topic, tp.partition, record.offset),
            self.dead_letter_max_bytes,
        )
        return Outgoing(
            self.names.dead_letters, key, value, headers, record.timestamp, "dead_letter"
        )
