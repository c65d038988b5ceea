"""A global-scheduler process: the schedulers' consumer group on the requests topic
(keyed by tenant queue), a view of every pool from the state topic, launches to the
owners' topic (partition p is pool p), verdicts read back: accepted, or refused with
the owner's summary, which the view applies before the task is decided again.

``--state-lag-s`` reads the state topic only that often: a view stale on purpose
(the test that shows stale launches refused and retried).

``python -m lavad.federation.live_scheduler --bootstrap HOST:PORT --gm 0``
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from typing import Any

import numpy as np
import orjson
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from lavad.daemon.settings import KafkaSettings
from lavad.federation.live_clients import group_consumer
from lavad.federation.live_owner import owner_id
from lavad.federation.live_wire import (
    DEAD_LETTERS,
    LAUNCHES,
    REQUESTS,
    STATE,
    VERDICTS,
    WireError,
    decode_request,
    decode_verdict,
    encode_launch,
)
from lavad.federation.messages import LaunchRequest, PoolSummary, Task
from lavad.federation.scheduler import GlobalScheduler, Launch
from lavad.federation.state_topic import StateTopicReader
from lavad.federation.topology import Topology, uniform_topology
from lavad.federation.view import GlobalView
from lavad.streams.kafka.deadletter import dead_letter_headers

log = structlog.get_logger()

ALLOCATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
COMPONENTS = ("queueing", "processing", "communication", "retries")


class AllocationClock:
    """Allocation time of the tasks this scheduler launched (request record timestamp to
    accepted verdict read back), split as section III: queueing (in this scheduler's
    queues), processing (deciding), communication (launch out, the owner, verdict back:
    the owner's validation is inside), retries (attempts refused on a stale view)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Histogram(
            "lavad_federation_allocation_seconds",
            "Request arrival to its launch accepted, at the global scheduler",
            buckets=ALLOCATION_BUCKETS,
            registry=registry,
        )
        self.parts = Histogram(
            "lavad_federation_allocation_component_seconds",
            "Allocation time per component (section III of Megha)",
            ["component"],
            buckets=ALLOCATION_BUCKETS,
            registry=registry,
        )
        self.arrival: dict[int, float] = {}
        self.mark: dict[int, float] = {}
        self.spent: dict[int, list[float]] = {}
        self.retrying: set[int] = set()

    def arrived(self, task: int, at: float) -> None:
        self.arrival[task] = self.mark[task] = at
        self.spent[task] = [0.0, 0.0, 0.0, 0.0]

    def decided(self, task: int, started: float, done: float) -> None:
        spent = self.spent[task]
        spent[3 if task in self.retrying else 0] += max(0.0, started - self.mark[task])
        self.retrying.discard(task)
        spent[1] += done - started
        self.mark[task] = done

    def refused(self, task: int, now: float) -> None:
        self.spent[task][3] += now - self.mark[task]
        self.mark[task] = now
        self.retrying.add(task)

    def accepted(self, task: int, now: float) -> None:
        spent = self.spent.pop(task)
        spent[2] += now - self.mark.pop(task)
        self.total.observe(now - self.arrival.pop(task))
        for name, value in zip(COMPONENTS, spent, strict=True):
            self.parts.labels(component=name).observe(value)


class Scheduler:
    def __init__(
        self, bootstrap: str, gm: int, topology: Topology, tenants: int, state_lag_s: float
    ) -> None:
        self.gm = gm
        self.topology = topology
        self.state_lag_s = state_lag_s
        owners = {p.index: owner_id(p.index) for p in topology.pools}
        self.view = GlobalView(gm, topology, owners, tenants)
        self.sched = GlobalScheduler(gm, topology, self.view, list(range(tenants)))
        self.inflight: dict[int, Task] = {}
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.requests = group_consumer(bootstrap, "lavad-federation-schedulers")
        self.verdicts = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self.state = StateTopicReader(KafkaSettings(bootstrap_servers=bootstrap), STATE, self.view)
        self.registry = CollectorRegistry()
        self.clock = AllocationClock(self.registry)

    async def run(self, stop: asyncio.Event) -> None:
        await self.producer.start()
        await self.state.start()
        await self.verdicts.start()
        parts = self.verdicts.partitions_for_topic(VERDICTS)
        if not parts:
            await self.verdicts.topics()
            parts = self.verdicts.partitions_for_topic(VERDICTS) or set()
        verdict_parts = [TopicPartition(VERDICTS, p) for p in sorted(parts)]
        self.verdicts.assign(verdict_parts)
        await self.verdicts.seek_to_beginning(*verdict_parts)
        self.requests.subscribe([REQUESTS])
        await self.requests.start()
        next_state = 0.0
        try:
            while not stop.is_set():
                batch = await self.requests.getmany(timeout_ms=50, max_records=500)
                for records in batch.values():
                    for record in records:
                        try:
                            task = decode_request(record.value)
                            self.sched.enqueue(task)
                            self.clock.arrived(task.task_id, record.timestamp / 1000.0)
                        except (WireError, ValueError) as exc:
                            await self.dead_letter(record, str(exc))
                if time.monotonic() >= next_state:
                    await self.state.catch_up()
                    next_state = time.monotonic() + self.state_lag_s
                answers = await self.verdicts.getmany(*verdict_parts, timeout_ms=20)
                for records in answers.values():
                    for record in records:
                        try:
                            self.answer(decode_verdict(record.value))
                        except (WireError, ValueError, KeyError, TypeError) as exc:
                            await self.dead_letter(record, f"verdict: {exc!r}")
                await self.launch_what_fits()
                if batch:
                    await self.requests.commit()
        finally:
            await self.requests.stop()
            await self.verdicts.stop()
            await self.state.stop()
            await self.producer.stop()

    async def dead_letter(self, record: Any, reason: str) -> None:
        """The record as it came, its reason and origin in headers: never dropped silently."""
        log.warning("request dead-lettered", offset=record.offset, reason=reason)
        headers = dead_letter_headers(
            "federation-scheduler", reason, record.topic, record.partition, record.offset
        )
        await self.producer.send_and_wait(
            DEAD_LETTERS, record.value, key=record.key, headers=headers
        )

    def answer(self, verdict: dict[str, Any]) -> None:
        if verdict["gm"] != self.gm:
            return
        task = self.inflight.pop(int(verdict["seq"]), None)
        if task is None:
            return  # a duplicate: an owner that took the pool over replayed the launch
        summary = verdict.get("summary")
        if isinstance(summary, dict):
            self.view.apply(
                PoolSummary(
                    pool=int(verdict["pool"]),
                    owner=str(summary["owner"]),
                    version=int(summary["version"]),
                    sent_at=0.0,
                    free=np.asarray(summary["free"], dtype=np.int64),
                    seen_seq=tuple(int(s) for s in summary["seen_seq"]),
                    tenant_usage=np.asarray(summary["tenant_usage"], dtype=np.int64),
                    queue_length=0,
                )
            )
        if verdict["accepted"]:
            self.clock.accepted(task.task_id, time.time())
        elif not verdict["final"]:
            self.clock.refused(task.task_id, time.time())
        if verdict["accepted"] or verdict["final"]:
            if not verdict["accepted"]:
                log.warning("launch refused, final", task=task.task_id, reason=verdict["reason"])
            return
        self.view.forget(int(verdict["pool"]), int(verdict["seq"]))
        log.info("stale launch refused, retrying", task=task.task_id, reason=verdict["reason"])
        self.sched.enqueue(task, front=True)

    async def launch_what_fits(self) -> None:
        futures = []
        while (task := self.sched.next_task()) is not None:
            started = time.time()
            choice, _ = self.sched.decide(task)
            self.clock.decided(task.task_id, started, time.time())
            if not isinstance(choice, Launch):
                self.sched.park(task)
                continue
            self.sched.seq += 1
            request = LaunchRequest(
                gm=self.gm,
                seq=self.sched.seq,
                pool=choice.pool,
                host=choice.host,
                task=task,
                repartition=choice.repartition,
            )
            self.view.reserve(choice.pool, choice.host, np.asarray(task.demand), self.sched.seq)
            self.inflight[self.sched.seq] = task
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lavad.federation.live_scheduler")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--gm", type=int, required=True, help="this scheduler's index")
    parser.add_argument("--pools", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=50, help="hosts per pool")
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--state-lag-s", type=float, default=0.0)
    parser.add_argument("--metrics-port", type=int, default=0, help="/metrics here (0: off)")
    args = parser.parse_args(argv)
    topology = uniform_topology(args.pools, args.hosts, args.schedulers)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        scheduler = Scheduler(args.bootstrap, args.gm, topology, args.tenants, args.state_lag_s)
        if args.metrics_port:
            start_http_server(args.metrics_port, addr="127.0.0.1", registry=scheduler.registry)
        await scheduler.run(stop)

    asyncio.run(serve())


if __name__ == "__main__":
    main()
