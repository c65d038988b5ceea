"""The global scheduler's view of the state topic: ours (aiokafka, each summary decoded,
checked and applied to the view) against faust-streaming's Table (an agent on the
state topic setting ``table[pool] = summary``, the pattern faust documents), and a
plain aiokafka dict of the newest bytes per pool (what a table holds, no decoding).

The state topic is filled on the embedded broker with ``--records`` summaries of
``--pools`` pools of ``--hosts`` hosts; each reader then starts as a fresh process and
reads it to the end. Printed per reader: time from process start to caught up, the
import part of it, records/s while reading, and peak RSS; for faust, the packages it
brings beyond aiokafka.

faust-streaming is not a lavad dependency: install it into a throwaway venv and name
its interpreter, e.g.

    python3 -m venv /tmp/faustvenv
    /tmp/faustvenv/bin/pip install faust-streaming==0.15.3 aiokafka==0.14.0
    .venv/bin/python -m benchmarks.federation_faust --faust-python /tmp/faustvenv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from lavad.streams.kafka.embedded import EmbeddedBroker

STATE = "lavad.federation.state"
PARTITIONS = 4

# Runs in the faust venv (no lavad there): an agent keeps the newest summary bytes of
# each pool in a Table, which faust backs with its own changelog topic.
FAUST_CHILD = r"""
import importlib.metadata as md, json, os, re, sys, time
T0 = time.monotonic()
import faust
T_IMPORT = time.monotonic() - T0
bootstrap, expected_path = sys.argv[1], sys.argv[2]
expected = {k.encode(): v.encode() for k, v in json.load(open(expected_path)).items()}

def closure(name):
    seen, todo = set(), [name]
    while todo:
        dist = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if dist in seen:
            continue
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue
        seen.add(dist)
        todo += [r for r in requires if "extra ==" not in r]
    return seen

app = faust.App(
    f"lavad-view-probe-{os.getpid()}", broker=f"kafka://{bootstrap}", store="memory://",
    web_enabled=False, topic_partitions=4, topic_disable_leader=True,
    broker_session_timeout=4, broker_heartbeat_interval=0.5, broker_rebalance_timeout=4,
    consumer_auto_offset_reset="earliest",
)
state = app.topic("lavad.federation.state", key_type=bytes, value_type=bytes,
                  key_serializer="raw", value_serializer="raw", partitions=4)
raw = faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
view = app.Table("view", schema=raw, partitions=4)
first = []

@app.agent(state)
async def apply(stream):
    async for key, value in stream.items():
        if not first:
            first.append(time.monotonic())
        view[key] = value

@app.timer(0.05)
async def check():
    if len(view) == len(expected) and all(view.get(k) == v for k, v in expected.items()):
        done = time.monotonic()
        extra = closure("faust-streaming") - closure("aiokafka")
        print(json.dumps({
            "caught_up_s": done - T0, "import_s": T_IMPORT, "reading_s": done - first[0],
            "rss_mib": int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read())[1])
            / 1024,
            "packages_beyond_aiokafka": len(extra),
        }), flush=True)
        os._exit(0)

sys.argv = [sys.argv[0], "worker", "-l", "warn", "--without-web"]
app.main()
"""


async def fill(bootstrap: str, pools: int, hosts: int, records: int) -> dict[str, str]:
    """``records`` summaries round-robin over the pools; the newest of each pool."""
    from lavad.federation.messages import PoolSummary  # noqa: PLC0415 - the parent only
    from lavad.federation.state_topic import pool_key  # noqa: PLC0415
    from lavad.federation.summary_codec import encode_summary  # noqa: PLC0415

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(STATE, PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    rng = np.random.default_rng(0)
    newest: dict[str, str] = {}
    try:
        pending = []
        for i in range(records):
            pool = i % pools
            summary = PoolSummary(
                pool=pool,
                owner=f"owner-of-pool-{pool}",
                version=i // pools + 1,
                sent_at=float(i),
                free=rng.integers(0, 4, size=(hosts, 1), dtype=np.int64),
                seen_seq=(0, 0),
                tenant_usage=np.zeros((2, 1), dtype=np.int64),
                queue_length=0,
            )
            data = encode_summary(summary)
            newest[pool_key(pool).decode()] = data.decode()
            pending.append(
                await producer.send(STATE, data, key=pool_key(pool), partition=pool % PARTITIONS)
            )
            if len(pending) >= 2_000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return newest


async def child_ours(bootstrap: str, pools: int, hosts: int, started: float) -> dict[str, float]:
    imported = time.monotonic()
    from lavad.daemon.kafka_settings import KafkaSettings  # noqa: PLC0415 - timed: the import
    from lavad.federation.state_topic import StateTopicReader  # noqa: PLC0415
    from lavad.federation.topology import uniform_topology  # noqa: PLC0415
    from lavad.federation.view import GlobalView  # noqa: PLC0415

    import_s = time.monotonic() - imported
    topology = uniform_topology(pools, hosts, 2)
    view = GlobalView(0, topology, {p: f"owner-of-pool-{p}" for p in range(pools)}, 2)
    reader = StateTopicReader(KafkaSettings(bootstrap_servers=bootstrap), STATE, view)
    await reader.start()
    reading = time.monotonic()
    read = await reader.catch_up()
    done = time.monotonic()
    await reader.stop()
    if reader.applied != read or reader.refused:
        raise RuntimeError(f"ours: {reader.applied} of {read} applied, {reader.refused[:3]}")
    return {"caught_up_s": done - started, "import_s": import_s, "reading_s": done - reading}


async def child_plain(bootstrap: str, started: float) -> dict[str, float]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    newest: dict[bytes, bytes] = {}
    try:
        await consumer.topics()
        tps = [TopicPartition(STATE, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        reading = time.monotonic()
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for records in (await consumer.getmany(*tps, timeout_ms=300)).values():
                for record in records:
                    if record.key is not None and record.value is not None:
                        newest[record.key] = record.value
        done = time.monotonic()
    finally:
        await consumer.stop()
    return {"caught_up_s": done - started, "import_s": 0.0, "reading_s": done - reading}


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    status = Path("/proc/self/status").read_text(encoding="ascii")
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(kib) / 1024


def _child(argv: list[str], started: float) -> None:
    kind, bootstrap, pools, hosts = argv[0], argv[1], int(argv[2]), int(argv[3])
    if kind == "ours":
        result = asyncio.run(child_ours(bootstrap, pools, hosts, started))
    else:
        result = asyncio.run(child_plain(bootstrap, started))
    result["rss_mib"] = peak_rss_mib()
    print(orjson.dumps(result).decode(), flush=True)


def _run(command: list[str], timeout_s: float) -> dict[str, float]:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    wall_s = time.monotonic() - started
    # faust sends what its worker prints to its log (stderr)
    output = (done.stdout + done.stderr).splitlines()
    lines = [line[line.index("{") :] for line in output if '{"caught_up_s"' in line]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{command[:3]} failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, float] = orjson.loads(lines[-1])
    result["wall_s"] = wall_s
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.federation_faust")
    parser.add_argument("--faust-python", type=Path, help="an interpreter with faust-streaming")
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    broker = EmbeddedBroker.start()
    try:
        bootstrap = broker.bootstrap_servers
        newest = asyncio.run(fill(bootstrap, args.pools, args.hosts, args.records))
        with tempfile.TemporaryDirectory() as folder:
            expected = Path(folder) / "newest.json"
            expected.write_bytes(orjson.dumps(newest))
            script = Path(folder) / "faust_view.py"
            script.write_text(FAUST_CHILD, encoding="utf-8")
            me = [sys.executable, "-m", "benchmarks.federation_faust", "--child"]
            readers: dict[str, list[str]] = {
                "ours (decode, check, apply to the view)": [*me, "ours"],
                "plain aiokafka dict (newest bytes per pool)": [*me, "plain"],
            }
            if args.faust_python is not None:
                readers["faust-streaming Table (agent sets table[pool])"] = [
                    str(args.faust_python),
                    str(script),
                ]
            common = [bootstrap, str(args.pools), str(args.hosts)]
            print(
                f"state topic: {args.records:,} summaries of {args.pools} pools x "
                f"{args.hosts} hosts, read to the end by a fresh process (embedded broker)"
            )
            for name, command in readers.items():
                extra = [bootstrap, str(expected)] if "faust" in name else common
                for _ in range(args.repeats):
                    result = _run([*command, *extra], timeout_s=300)
                    rate = args.records / result["reading_s"]
                    packages = result.get("packages_beyond_aiokafka")
                    print(
                        f"  {name:46s} process {result['wall_s']:6.2f} s "
                        f"(imports {result['import_s']:4.2f} s), {rate:9,.0f} records/s, "
                        f"peak RSS {result['rss_mib']:5.0f} MiB"
                        + (f", {packages:.0f} packages beyond aiokafka" if packages else "")
                    )
    finally:
        broker.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:], time.monotonic())
    else:
        main()
