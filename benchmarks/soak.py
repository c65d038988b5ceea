"""A soak: one ``lavad run`` under steady input for an hour, sampled each minute.

``python -m benchmarks.soak`` (an hour by default; ``--minutes`` and
``--interval-s`` shorten it, ``--json`` writes the samples). An embedded
broker, three pools on three partitions, each the bundled Azure slice
(its own seed) looped in event time: each loop shifts the times past the
previous loop's end and renames the VMs, and the VMs the slice leaves
running get an exit at the loop's end, so a pool's size stays that of the
slice rather than growing by its censored VMs each loop. Published at a
steady rate (default 300 records/s in all), with snapshots on the snapshot
topic every ``--snapshot-interval-s`` and a restart (SIGTERM, then a new
instance) half-way through.

Each interval: the daemon's resident memory and open file descriptors (from
/proc), its asyncio tasks (``lavad_asyncio_tasks``) and its consumer lag
(``lavad_consumer_lag_records``, summed). Printed per sample, then the
first and last tenth of each series (the first and last 10 minutes of an
hour), which is where a leak shows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from benchmarks.arguments import above_zero
from benchmarks.live_kafka import SLICE_AZURE, pools_on_every_partition
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord, encode
from lavad.streams.kafka.embedded import EmbeddedBroker, free_port
from lavad.streams.kafka.topics import TopicNames, ensure_topics
from lavad.streams.schema import Event, VmExit, VmRequest

ROOT = Path(__file__).resolve().parents[1]
NAMES = TopicNames()
PARTITIONS = 3


@dataclass(slots=True)
class Sample:
    minute: float
    instance: int
    rss_mib: float
    open_fds: int
    tasks: int
    lag_records: int
    events: int


def looped(pool: str, seed: int) -> Iterator[Event]:
    """The slice as ``pool``, again and again, each loop later in event time than the last."""
    items = [
        item
        for item in open_trace(SLICE_AZURE, seed=seed, pool=pool).events()
        if not isinstance(item, BadRecord)
    ]
    span = items[-1].time - items[0].time + 1.0
    for loop in itertools.count():
        shift = loop * span
        running: set[str] = set()
        for item in items:
            if isinstance(item, VmRequest | VmExit):
                vm_id = f"{item.vm_id}~{loop}"
                if isinstance(item, VmRequest):
                    running.add(vm_id)
                else:
                    running.discard(vm_id)
                yield replace(item, time=item.time + shift, vm_id=vm_id)
            else:
                yield replace(item, time=item.time + shift)
        end = items[-1].time + shift
        for vm_id in sorted(running):
            yield VmExit(time=end, pool=pool, vm_id=vm_id)


def merged(pools: list[str]) -> Iterator[Event]:
    import heapq  # noqa: PLC0415

    streams = [looped(pool, seed) for seed, pool in enumerate(pools)]
    return heapq.merge(*streams, key=lambda event: event.time)


class Daemon:
    def __init__(self, folder: Path, env: dict[str, str], number: int) -> None:
        self.port = free_port()
        self.number = number
        self.session: aiohttp.ClientSession | None = None
        self.log = (folder / f"instance-{number}.log").open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from lavad.daemon.cli import main; main()",
                "run",
                "--config",
                str(ROOT / "config" / "lavad.toml"),
            ],
            env={**os.environ, **env, "LAVAD_HTTP__PORT": str(self.port)},
            stdout=self.log,
            stderr=self.log,
        )

    async def metrics(self) -> dict[str, float]:
        # One session kept open, as a Prometheus scraper keeps its connection:
        # a connection per sample would leave the server a task per sample
        # until its keep-alive ran out, which would look like a leak.
        if self.session is None:
            self.session = aiohttp.ClientSession()
        async with self.session.get(
            f"http://127.0.0.1:{self.port}/metrics", timeout=aiohttp.ClientTimeout(total=5)
        ) as response:
            text = await response.text()
        sums: dict[str, float] = {}
        for row in text.splitlines():
            if row and not row.startswith("#"):
                name = row.split("{", 1)[0].split(" ", 1)[0]
                sums[name] = sums.get(name, 0.0) + float(row.rsplit(" ", 1)[1])
        return sums

    async def ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if (await self.metrics()).get("lavad_assigned_partitions", 0) == PARTITIONS:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"instance {self.number} did not take the partitions")
            await asyncio.sleep(0.2)

    async def sample(self, minute: float) -> Sample:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        rss_kib = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
        )
        fds = len(os.listdir(f"/proc/{self.process.pid}/fd"))
        metrics = await self.metrics()
        return Sample(
            minute=minute,
            instance=self.number,
            rss_mib=rss_kib / 1024,
            open_fds=fds,
            tasks=int(metrics.get("lavad_asyncio_tasks", 0)),
            lag_records=int(metrics.get("lavad_consumer_lag_records", 0)),
            events=int(metrics.get("lavad_events_total", 0)),
        )

    async def stop(self) -> int:
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


async def publish(bootstrap: str, rate: float, stop: asyncio.Event) -> None:
    # Batches of a fifth of a second: the embedded broker's fetches slow
    # down with the number of batches in a partition (at one record a batch
    # it served nothing after about 40,000 per partition, 7 minutes here).
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=200)
    await producer.start()
    try:
        began = time.monotonic()
        pools = pools_on_every_partition(PARTITIONS, "soak")
        for count, event in enumerate(merged(pools)):
            if stop.is_set():
                return
            wait = began + count / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await producer.send(
                NAMES.for_event_type(event.type), encode(event), key=event.pool.encode()
            )
    finally:
        await producer.stop()


async def soak(args: argparse.Namespace) -> list[Sample]:
    folder = Path(tempfile.mkdtemp(prefix="lavad-soak-"))
    broker = EmbeddedBroker.start(log=folder / "broker.log")
    env = {
        "LAVAD_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "LAVAD_LIVE__SNAPSHOT_STORE": "topic",
        "LAVAD_LIVE__SNAPSHOT_INTERVAL_S": str(args.snapshot_interval_s),
        "LAVAD_LIVE__SNAPSHOT_DIR": str(folder / "snapshots"),
        "LAVAD_LIVE__CLUSTER_GAUGES_S": str(min(10.0, args.interval_s / 2)),
        "LAVAD_TOPICS__PARTITIONS": str(PARTITIONS),
        "LAVAD_LOG__LEVEL": "warning",
    }
    samples: list[Sample] = []
    stop = asyncio.Event()
    daemon: Daemon | None = None
    feeding: asyncio.Task[None] | None = None
    codes: list[int] = []
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        await admin.start()
        try:
            await ensure_topics(admin, NAMES, PARTITIONS)
        finally:
            await admin.close()
        daemon = Daemon(folder, env, 0)
        await daemon.ready()
        feeding = asyncio.create_task(publish(broker.bootstrap_servers, args.rate, stop))
        # The schedule leaves the restart out: each half gets its share of samples.
        began = origin = time.monotonic()
        total = args.minutes * 60.0
        restarted = False
        for tick in itertools.count(1):
            await asyncio.sleep(max(0.0, began + tick * args.interval_s - time.monotonic()))
            if feeding.done():
                feeding.result()  # the publisher failed: say why
            sample = await daemon.sample((time.monotonic() - origin) / 60.0)
            samples.append(sample)
            print(
                f"{sample.minute:7.2f} min  instance {sample.instance}  "
                f"rss {sample.rss_mib:7.1f} MiB  fds {sample.open_fds:4d}  "
                f"tasks {sample.tasks:3d}  lag {sample.lag_records:6d}  events {sample.events}",
                flush=True,
            )
            elapsed = time.monotonic() - began
            if elapsed >= total:
                break
            if not restarted and elapsed >= total / 2:
                restarted = True
                stopping = time.monotonic()
                codes.append(await daemon.stop())
                daemon = Daemon(folder, env, daemon.number + 1)
                await daemon.ready()
                began += time.monotonic() - stopping
    finally:
        stop.set()
        if feeding is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await feeding
        if daemon is not None:
            codes.append(await daemon.stop())
        broker.close()
    if any(codes):
        raise RuntimeError(f"an instance exited with {codes} (logs in {folder})")
    # The logs are for a failure: a run that ends well leaves nothing behind
    # (an exception above keeps them, as the traceback shows where it failed).
    shutil.rmtree(folder)
    return samples


def summary(samples: list[Sample]) -> None:
    tenth = max(1, len(samples) // 10)
    print("series            first tenth (mean / max)    last tenth (mean / max)")
    for name in ("rss_mib", "open_fds", "tasks", "lag_records"):
        first = [float(getattr(s, name)) for s in samples[:tenth]]
        last = [float(getattr(s, name)) for s in samples[-tenth:]]
        print(
            f"{name:16s}  {sum(first) / len(first):10.1f} / {max(first):10.1f}"
            f"      {sum(last) / len(last):10.1f} / {max(last):10.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=above_zero, default=60.0)
    parser.add_argument("--interval-s", type=above_zero, default=60.0)
    parser.add_argument("--rate", type=above_zero, default=300.0, help="records/s over all pools")
    parser.add_argument("--snapshot-interval-s", type=above_zero, default=60.0)
    parser.add_argument("--json", type=Path, help="write the samples here")
    args = parser.parse_args(argv)
    samples = asyncio.run(soak(args))
    summary(samples)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(s) for s in samples]))


if __name__ == "__main__":
    main()
