"""Failover: kill -9 one of two ``lavad run`` instances and time until its pools decide again.

``python -m benchmarks.failover`` (about a minute a run, three runs by default,
then the medians). An embedded broker, six
pools on six partitions (the bundled Azure slice once per pool, its own
seed each), two instances in one group as child processes with the
snapshots on the snapshot topic. The first half of the events is decided
before anything is timed; the rest is published at a steady rate (default
300 records/s in all) while a reader outside the group notes when each
placement arrives. After a steady spell the instance holding three pools
is killed with -9, and the survivor's log says when it heard of the
rebalance, when the group answered and when the moved partitions were
restored. Parts, from the kill:

* detection: until the survivor's partitions are revoked (the group has
  noticed the loss: its session timeout, then the survivor's next heartbeat);
* rebalance: until the group assigns the partitions anew (the survivor's
  snapshots of what it held, the join and sync round trips);
* restore: until the moved partitions' snapshots are read and loaded;
* catch-up: until each moved pool's next new decision (an id never published
  before the kill) arrives: re-reading from the snapshot's offsets,
  re-publishing what was decided since, then the input that waited.

Also printed: how long the survivor's own pools went without a new
decision. The machine's cores are shared by the broker, both instances,
the producer and the reader, so the figures are for a shared box.

The rebalance part is the broker's: Tansu answers a JoinGroup only after
half the session timeout (3 s at 6 s, 5 s at 10 s, whatever the rebalance
timeout), where Apache Kafka answers once every known member has rejoined.
aiokafka's rebalances are eager (every partition is revoked, including the
survivor's own), so its own pools wait for the join too; they resume from
memory, not from their snapshots, and the moved partitions' snapshots are
read while the group settles.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from benchmarks.arguments import above_zero, at_least_one
from benchmarks.live_kafka import azure_events, pools_on_every_partition
from lavad.streams.codec import encode
from lavad.streams.kafka.embedded import EmbeddedBroker, free_port
from lavad.streams.kafka.publish import publish_trace
from lavad.streams.kafka.topics import TopicNames, ensure_topics
from lavad.streams.schema import Event, VmRequest

ROOT = Path(__file__).resolve().parents[1]
NAMES = TopicNames()
PARTITIONS = 6


@dataclass(slots=True)
class Instance:
    """``lavad run`` as a child process with its JSON log in a file."""

    name: str
    log: Path
    port: int
    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, name: str, folder: Path, env: dict[str, str]) -> Instance:
        port = free_port()
        log = folder / f"{name}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from lavad.daemon.cli import main; main()",
                    "run",
                    "--config",
                    str(ROOT / "config" / "lavad.toml"),
                ],
                env={**os.environ, **env, "LAVAD_HTTP__PORT": str(port)},
                stdout=output,
                stderr=output,
            )
        return cls(name, log, port, process)

    async def assigned(self) -> int:
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(
                    f"http://127.0.0.1:{self.port}/metrics",
                    timeout=aiohttp.ClientTimeout(total=2),
                ) as response,
            ):
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return 0
        for row in text.splitlines():
            if row.startswith("lavad_assigned_partitions "):
                return int(float(row.split()[1]))
        return 0

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(line))
        return out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass(slots=True)
class Arrivals:
    """Each placement id's first arrival (wall time) at a reader outside the group."""

    first: dict[str, tuple[float, str]] = field(default_factory=dict)
    records: int = 0
    # Every arrival (wall time, pool), duplicates included.
    every: list[tuple[float, str]] = field(default_factory=list)

    async def run(self, bootstrap: str, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5
        )
        await consumer.start()
        try:
            parts = [TopicPartition(NAMES.placements, p) for p in range(PARTITIONS)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=50)
                now = time.time()
                for records in batch.values():
                    for record in records:
                        self.records += 1
                        body = orjson.loads(record.value)
                        self.first.setdefault(body["decision_id"], (now, body["pool"]))
                        self.every.append((now, body["pool"]))
        finally:
            await consumer.stop()


async def paced(bootstrap: str, events: Iterable[Event], rate: float, stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    await producer.start()
    try:
        began = time.monotonic()
        for count, event in enumerate(events):
            if stop.is_set():
                break
            wait = began + count / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await producer.send(
                NAMES.for_event_type(event.type), encode(event), key=event.pool.encode()
            )
        await producer.flush()
    finally:
        await producer.stop()


def _snapshotted(instance: Instance, since: float) -> bool:
    lines = instance.lines()
    taken = [line for line in lines if line.get("event") == "partitions taken"]
    written = {
        line["partition"]
        for line in lines
        if line.get("event") == "snapshot written" and _wall(line) >= since
    }
    return bool(taken) and set(taken[-1]["owned"]) <= written


def _wall(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(line["timestamp"]).timestamp()


def _first_after(lines: list[dict[str, Any]], event: str, after: float) -> dict[str, Any]:
    for line in lines:
        if line.get("event") == event and _wall(line) >= after:
            return line
    raise RuntimeError(f"the survivor never logged {event!r} after the kill")


async def failover(args: argparse.Namespace) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="lavad-failover-"))
    pools = pools_on_every_partition(PARTITIONS, "pool")
    events = azure_events(pools, args.per_pool, first_seed=0)
    warm, rest = events[: len(events) // 2], events[len(events) // 2 :]
    broker = EmbeddedBroker.start(log=folder / "broker.log")
    bootstrap = broker.bootstrap_servers
    env = {
        "LAVAD_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "LAVAD_KAFKA__SESSION_TIMEOUT_MS": str(args.session_ms),
        "LAVAD_KAFKA__HEARTBEAT_INTERVAL_MS": str(args.heartbeat_ms),
        "LAVAD_LIVE__SNAPSHOT_STORE": "topic",
        "LAVAD_LIVE__SNAPSHOT_INTERVAL_S": str(args.snapshot_interval_s),
        "LAVAD_LIVE__SNAPSHOT_DIR": str(folder / "snapshots"),
        "LAVAD_TOPICS__PARTITIONS": str(PARTITIONS),
        "LAVAD_PLACEMENT__POLICY": args.policy,
    }
    instances: list[Instance] = []
    stop = asyncio.Event()
    arrivals = Arrivals()
    tasks: list[asyncio.Task[None]] = []
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await ensure_topics(admin, NAMES, PARTITIONS)
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            await publish_trace(warm, producer, NAMES)
        finally:
            await producer.stop()
        instances = [Instance.start(name, folder, env) for name in ("a", "b")]
        deadline = time.monotonic() + 120
        while [await i.assigned() for i in instances] != [3, 3]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the instances did not split the partitions ({folder})")
            await asyncio.sleep(0.2)
        tasks.append(asyncio.create_task(arrivals.run(bootstrap, stop)))
        warm_requests = sum(isinstance(e, VmRequest) for e in warm)
        while len(arrivals.first) < warm_requests:
            await asyncio.sleep(0.2)
        tasks.append(asyncio.create_task(paced(bootstrap, rest, args.rate, stop)))
        # Steady operation: the victim has snapshotted each of its partitions
        # since the paced input began, as it does every interval.
        paced_from = time.time()
        while not _snapshotted(instances[0], paced_from):
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.steady_s)
        victim = instances[0]
        t_kill = time.time()
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        seen_before = set(arrivals.first)
        await asyncio.sleep(args.after_s)
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for instance in instances:
            instance.stop()
        broker.close()
    return report(instances[1], t_kill, seen_before, arrivals, pools, folder)


def report(
    survivor: Instance,
    t_kill: float,
    seen_before: set[str],
    arrivals: Arrivals,
    pools: list[str],
    folder: Path,
) -> dict[str, float]:
    lines = survivor.lines()
    taken_before = [
        line for line in lines if line.get("event") == "partitions taken" and _wall(line) < t_kill
    ]
    own = set(taken_before[-1]["owned"])
    moved_pools = [pool for number, pool in enumerate(pools) if number not in own]
    own_pools = [pool for number, pool in enumerate(pools) if number in own]
    revoked = _first_after(lines, "partitions revoked", t_kill)
    assigned = _first_after(lines, "partitions assigned", _wall(revoked))
    taken = _first_after(lines, "partitions taken", _wall(assigned))
    t_revoked, t_assigned = _wall(revoked), _wall(assigned)
    t_taken = t_assigned + float(taken["seconds"])
    # New: first seen once the survivor held the partitions (the victim's
    # last decisions can still reach the reader just after the kill).
    new = [
        (at, pool)
        for decision, (at, pool) in arrivals.first.items()
        if decision not in seen_before and at >= t_assigned
    ]
    nexts = {pool: min((at for at, p in new if p == pool), default=None) for pool in moved_pools}
    if any(at is None for at in nexts.values()):
        raise RuntimeError(f"a moved pool never decided again: {nexts} (logs in {folder})")
    resumed = [at for at in nexts.values() if at is not None]
    # The first decision after the restore, re-published or new: when deciding resumed.
    again = [
        min(at for at, p in arrivals.every if p == pool and at >= t_taken) for pool in moved_pools
    ]
    silences = []
    for pool in own_pools:
        times = sorted(at for at, p in arrivals.first.values() if p == pool)
        window = [t for t in times if t >= t_kill - 2.0]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        silences.append(max(gaps, default=0.0))
    parts = {
        "detection": t_revoked - t_kill,
        "rebalance": t_assigned - t_revoked,
        "restore": t_taken - t_assigned,
        "catch-up": max(resumed) - t_taken,
        "total": max(resumed) - t_kill,
        "after detection": max(resumed) - t_revoked,
        "first re-published": max(again) - t_taken,
        "own pools silent": max(silences),
    }
    print("  " + "  ".join(f"{name} {value:.2f} s" for name, value in parts.items()), flush=True)
    return parts


PARTS = {
    "detection": "kill -> survivor told of the rebalance",
    "rebalance": "-> partitions assigned anew",
    "restore": "-> snapshots loaded, offsets sought",
    "catch-up": "-> every moved pool's next new decision",
    "total": "kill -> every moved pool's next new decision",
    "after detection": "rebalance + restore + catch-up",
    "first re-published": "restore -> a moved pool's first decision, re-published or new",
    "own pools silent": "the survivor's own pools' longest stretch without a new decision",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-pool", type=at_least_one, default=8_000)
    parser.add_argument("--rate", type=above_zero, default=300.0, help="records/s over all pools")
    parser.add_argument("--session-ms", type=at_least_one, default=6_000)
    parser.add_argument("--heartbeat-ms", type=at_least_one, default=1_000)
    parser.add_argument("--snapshot-interval-s", type=above_zero, default=10.0)
    parser.add_argument("--policy", default="bestfit")
    parser.add_argument(
        "--steady-s", type=float, default=3.0, help="after the victim's first snapshots"
    )
    parser.add_argument("--after-s", type=float, default=25.0)
    parser.add_argument("--runs", type=at_least_one, default=3, help="the medians are printed")
    args = parser.parse_args(argv)
    print(
        f"failover: session timeout {args.session_ms} ms, heartbeat {args.heartbeat_ms} ms, "
        f"{args.policy}, {args.rate:.0f} records/s, snapshots every {args.snapshot_interval_s} s"
    )
    runs = [asyncio.run(failover(args)) for _ in range(args.runs)]
    print(f"median of {len(runs)} runs:")
    for name, what in PARTS.items():
        median = statistics.median(run[name] for run in runs)
        print(f"  {name:18s} {median:6.2f} s   {what}")


if __name__ == "__main__":
    main()
