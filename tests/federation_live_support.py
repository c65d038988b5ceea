"""What the live federation tests share: the topics, starting a process, producing
requests, reading a topic, waiting for a condition."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from lavad.federation.live_clients import read_partition
from lavad.federation.live_wire import (
    LAUNCHES,
    REQUESTS,
    VERDICTS,
    encode_request,
)
from lavad.federation.messages import Task
from lavad.federation.topics import create_federation_topics, federation_topics


def taken_partitions(log: Path) -> list[int]:
    """The requests partitions a scheduler took in its newest takeover (from its log)."""
    found = re.findall(r"queues taken.*?partitions=\[([0-9, ]*)\]", log.read_text())
    return [int(p) for p in found[-1].split(",") if p.strip()] if found else []


async def create_topics(bootstrap: str, pools: int = 2, queues: int = 2) -> None:
    """The federation's topics, as `lavad federation topics` creates them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await create_federation_topics(admin, federation_topics(pools, queues), 1)
    finally:
        await admin.close()


def federation_config(path: Path, bootstrap: str, **federation: Any) -> Path:
    """A federation TOML file: ``federation`` holds the [federation] keys, with
    ``owner_*`` and ``scheduler_*`` going to its owner and scheduler tables."""
    tables: dict[str, list[str]] = {"federation": [], "owner": [], "scheduler": []}
    for key, value in federation.items():
        table, _, name = key.partition("_")
        if table in ("owner", "scheduler"):
            tables[table].append(f"{name} = {value!r}")
        else:
            tables["federation"].append(f"{key} = {value!r}")
    text = f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
    text += "[federation]\n" + "".join(f"{line}\n" for line in tables["federation"])
    for table in ("owner", "scheduler"):
        text += f"[federation.{table}]\n" + "".join(f"{line}\n" for line in tables[table])
    path.write_text(text, encoding="utf-8")
    return path


def start(log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``lavad federation ARGS`` as a process, its output to ``log``."""
    handle = log.open("ab")
    command = [sys.executable, "-c", "from lavad.daemon.cli import main; main()", "federation"]
    return subprocess.Popen([*command, *args], stdout=handle, stderr=handle, env=dict(os.environ))


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def send(
    bootstrap: str, topic: str, values: list[bytes], key: bytes | None, partition: int
) -> None:
    """``values`` to one partition of ``topic``, in order, each acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, key=key, partition=partition)
    finally:
        await producer.stop()


async def produce(bootstrap: str, tasks: list[Task]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for task in tasks:
            await producer.send_and_wait(
                REQUESTS, encode_request(task), key=b"%d" % task.tenant, partition=task.tenant
            )
    finally:
        await producer.stop()


async def verdicts(bootstrap: str) -> list[tuple[float, dict[str, Any]]]:
    return [
        (r.timestamp / 1000.0, orjson.loads(r.value))
        for r in await read_partition(bootstrap, VERDICTS)
    ]


async def launches(bootstrap: str, pools: int) -> list[tuple[float, dict[str, Any]]]:
    found = []
    for pool in range(pools):
        for record in await read_partition(bootstrap, LAUNCHES, pool):
            if record.value is not None and record.value.startswith(b"{"):
                found.append((record.timestamp / 1000.0, orjson.loads(record.value)))
    return found


def tasks(tenant: int, first: int, count: int) -> list[Task]:
    return [
        Task(
            first + i,
            job=first + i,
            tenant=tenant,
            demand=(1,),
            constraints=0,
            duration=60.0,
            arrival=0.0,
        )
        for i in range(count)
    ]


async def until(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
