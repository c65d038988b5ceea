"""Requests/s through the live federation (processes over the embedded broker) for 1, 2
and 4 global-scheduler processes, as ratios to 1: 2 pool-owner processes, 2,000
requests in 4 tenant queues produced at once, timed until every one has an accepted
launch. This machine's 2 shared cores run the broker, the owners and the schedulers
together, so the ratio says as much about them as about the federation.

``python -m benchmarks.federation_live`` (about 2 minutes).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from lavad.federation.live_clients import read_partition
from lavad.federation.live_wire import (
    REQUESTS,
    VERDICTS,
    encode_request,
)
from lavad.federation.messages import Task
from lavad.federation.topics import create_federation_topics, federation_topics
from lavad.streams.kafka.embedded import EmbeddedBroker

REQUEST_COUNT = 2000
TENANTS = 4
POOLS = 2
HOSTS = 1200  # per pool: room for every request


async def _topics(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await create_federation_topics(admin, federation_topics(POOLS, TENANTS), 1)
    finally:
        await admin.close()


async def _accepted(bootstrap: str) -> int:
    records = await read_partition(bootstrap, VERDICTS)
    return len({int(r.key) for r in records if r.value and b'"accepted":true' in r.value})


async def _one(schedulers: int, logs: Path) -> float:
    broker = EmbeddedBroker.start()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        bootstrap = broker.bootstrap_servers
        await _topics(bootstrap)
        config = logs / f"federation-{schedulers}.toml"
        config.write_text(
            f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
            f"[federation]\npools = {POOLS}\nhosts_per_pool = {HOSTS}\n"
            f"schedulers = {schedulers}\ntenants = {TENANTS}\n"
            "[federation.owner]\nsnapshot_every = 500\n",
            encoding="utf-8",
        )
        lavad = [sys.executable, "-c", "from lavad.daemon.cli import main; main()", "federation"]
        for name in ("a", "b"):
            processes.append(
                subprocess.Popen(
                    [*lavad, "owner", "--instance", name, "--config", str(config)],
                    stdout=(logs / f"owner-{schedulers}-{name}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        for g in range(schedulers):
            processes.append(
                subprocess.Popen(
                    [*lavad, "scheduler", "--gm", str(g), "--config", str(config)],
                    stdout=(logs / f"gm-{schedulers}-{g}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
            )
        await asyncio.sleep(8)  # both groups formed (the owners' pools taken)
        tasks = [
            Task(
                i, job=i, tenant=i % TENANTS, demand=(1,), constraints=0, duration=60.0, arrival=0.0
            )
            for i in range(REQUEST_COUNT)
        ]
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        started = time.monotonic()
        try:
            futures = [
                await producer.send(
                    REQUESTS, encode_request(t), key=b"%d" % t.task_id, partition=t.tenant
                )
                for t in tasks
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        while await _accepted(bootstrap) < REQUEST_COUNT:
            if time.monotonic() - started > 300:
                raise RuntimeError(f"{schedulers} schedulers: not all accepted in 300 s")
            await asyncio.sleep(0.5)
        return REQUEST_COUNT / (time.monotonic() - started)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        broker.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        rates = [(n, asyncio.run(_one(n, Path(folder)))) for n in (1, 2, 4)]
    base = rates[0][1]
    print("live federation: 2 owner processes, 2,000 requests at once (embedded broker)")
    for n, rate in rates:
        print(
            f"  {n} global scheduler process(es): {rate:8,.0f} requests/s "
            f"({rate / base:4.2f}x of 1)"
        )


if __name__ == "__main__":
    main()
