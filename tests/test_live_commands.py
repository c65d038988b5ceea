"""The commands of the README's live walk-through, run as a user runs them: child processes.

``lavad broker``, ``lavad topics create``, ``lavad run``, ``lavad produce`` and
``lavad tail`` against the real embedded broker (Tansu) on a free loopback port.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from live_support import AZURE_SLICE, NAMES, PROJECT_ROOT, read_topic

from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord, encode
from lavad.streams.kafka.embedded import EmbeddedBroker, free_port

pytestmark = pytest.mark.kafka
CONFIG = str(PROJECT_ROOT / "config" / "lavad.toml")
LAVAD = [sys.executable, "-c", "from lavad.daemon.cli import main; main()"]


def lavad(
    *args: str, bootstrap: str, cwd: Path, timeout: float = 60.0, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LAVAD, *args],
        env={**os.environ, "LAVAD_KAFKA__BOOTSTRAP_SERVERS": bootstrap, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def topic_partitions(bootstrap: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(None)}
    finally:
        await admin.close()


async def test_topics_create_makes_every_topic_with_the_configured_partitions_and_is_idempotent(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    first = lavad(
        "topics", "create", "--config", CONFIG,
        bootstrap=bootstrap, cwd=tmp_path, LAVAD_TOPICS__PARTITIONS="2",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert {topic: 2 for topic in NAMES.all}.items() <= (await topic_partitions(bootstrap)).items()
    assert first.stdout.count("created") == len(NAMES.all)

    again = lavad(
        "topics", "create", "--config", CONFIG,
        bootstrap=bootstrap, cwd=tmp_path, LAVAD_TOPICS__PARTITIONS="2",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("exists") == len(NAMES.all)
    assert "created" not in again.stdout
    assert {topic: 2 for topic in NAMES.all}.items() <= (await topic_partitions(bootstrap)).items()


async def test_topics_create_refuses_a_topic_with_another_partition_count(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(NAMES.usage, 5, 1)])
    finally:
        await admin.close()

    result = lavad("topics", "create", "--config", CONFIG, bootstrap=bootstrap, cwd=tmp_path)

    assert result.returncode != 0
    message = " ".join(result.stderr.split())  # rich wraps long lines
    assert f"{NAMES.usage} has 5" in message
    assert "topics.partitions = 3" in message
    # Refused before anything was created: no half-made layout to clean up.
    counts = await topic_partitions(bootstrap)
    assert NAMES.vm_events not in counts
    assert counts[NAMES.usage] == 5


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
async def test_broker_command_serves_on_its_port_and_stops_cleanly_on_a_signal(
    stop_signal: signal.Signals, tmp_path: Path
) -> None:
    port = free_port()
    process = subprocess.Popen(
        [*LAVAD, "broker", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the broker listens
        assert f"127.0.0.1:{port}" in line, line + (process.stderr.read() if process.stderr else "")
        bootstrap = f"127.0.0.1:{port}"
        made = lavad("topics", "create", "--config", CONFIG, bootstrap=bootstrap, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        assert NAMES.placements in await topic_partitions(bootstrap)
        children = _children(process.pid)
        assert children, "the broker runs as a child process"

        process.send_signal(stop_signal)
        assert process.wait(timeout=20) == 0
        for child in children:
            assert not Path(f"/proc/{child}").exists() or _is_zombie(child), "broker left running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _is_zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _both_kinds_logged(text: str) -> bool:
    """An aiokafka line and the daemon's own retry line among the complete lines so far."""
    records = [orjson.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
    aiokafka = any(r.get("logger", "").startswith("aiokafka") for r in records)
    return aiokafka and any(r.get("event") == "broker unreachable at start" for r in records)


def test_run_logs_only_json_lines_while_the_broker_is_missing(tmp_path: Path) -> None:
    # Nothing listens on this port: aiokafka logs its connection errors, the
    # daemon logs its retries; every stderr line must be JSON all the same.
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr_file:
        process = subprocess.Popen(
            [*LAVAD, "run", "--config", CONFIG],
            env={
                **os.environ,
                "LAVAD_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
                "LAVAD_HTTP__PORT": str(free_port()),
                "LAVAD_LIVE__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
            },
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
        )
        try:
            # Stop once both kinds of line are out (on a loaded machine the start
            # alone can take seconds), not after a fixed wait.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and process.poll() is None:
                if _both_kinds_logged(log.read_text(encoding="utf-8", errors="replace")):
                    break
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    stderr = log.read_text(encoding="utf-8")
    assert process.returncode == 0, stderr
    records = [orjson.loads(line) for line in stderr.splitlines()]  # raises on any other line
    assert any(record.get("logger", "").startswith("aiokafka") for record in records)
    assert any(record["event"] == "broker unreachable at start" for record in records)
    assert records[-1]["event"] == "stopped"


async def test_produce_from_offset_skips_the_first_records(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    assert (
        lavad("topics", "create", "--config", CONFIG, bootstrap=bootstrap, cwd=tmp_path).returncode
        == 0
    )

    result = lavad(
        "produce", str(AZURE_SLICE), "--config", CONFIG, "--from-offset", "7", "--limit", "20",
        bootstrap=bootstrap, cwd=tmp_path,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    trace = itertools.islice(open_trace(AZURE_SLICE, seed=0).events(), 7, 27)
    expected = {encode(item) for item in trace if not isinstance(item, BadRecord)}
    assert len(expected) == 20
    published = await read_topic(bootstrap, NAMES.vm_events, at_least=20, timeout_s=20)
    assert {record.value for record in published} == expected
    assert "records 7 to 27" in " ".join(result.stdout.split())


def test_produce_without_a_broker_fails_says_how_far_it_got_and_leaks_nothing(
    tmp_path: Path,
) -> None:
    result = lavad(
        "produce", str(AZURE_SLICE), "--config", CONFIG, "--from-offset", "12",
        bootstrap=f"127.0.0.1:{free_port()}", cwd=tmp_path,
        PYTHONWARNINGS="always::ResourceWarning",
    )  # fmt: skip

    message = " ".join(result.stderr.split())
    assert result.returncode != 0
    assert "resume with --from-offset 12" in message
    assert "Unclosed" not in message


@pytest.mark.parametrize(
    ("command", "speed"), [("produce", "nan"), ("produce", "inf"), ("demo", "-1")]
)
def test_produce_and_demo_refuse_a_speed_that_is_not_a_finite_rate(
    tmp_path: Path, command: str, speed: str
) -> None:
    # Each used to publish as fast as 0, unasked; refused before any broker starts.
    result = lavad(
        command, str(AZURE_SLICE), "--config", CONFIG, "--speed", speed,
        bootstrap=f"127.0.0.1:{free_port()}", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--speed must be a finite number >= 0" in " ".join(result.stderr.split())
    assert "broker" not in result.stderr


async def test_produce_on_a_stalled_broker_says_how_far_it_got_and_resumes(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    assert (
        lavad("topics", "create", "--config", CONFIG, bootstrap=bootstrap, cwd=tmp_path).returncode
        == 0
    )
    # Paced so the stall comes mid-trace; the slice's first arrivals are dense.
    process = subprocess.Popen(
        [*LAVAD, "produce", str(AZURE_SLICE), "--config", CONFIG, "--speed", "500"],
        env={
            **os.environ,
            "LAVAD_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "LAVAD_KAFKA__REQUEST_TIMEOUT_MS": "2000",
        },
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Stall once it is under way (its start alone can take seconds under load).
        await read_topic(bootstrap, NAMES.vm_events, at_least=100, timeout_s=60)
        broker.pause()
        _, stderr = process.communicate(timeout=60)
    finally:
        broker.resume()
        if process.poll() is None:
            process.kill()
            process.wait()
    message = " ".join(stderr.split())
    assert process.returncode != 0, message
    assert "resume with --from-offset" in message, message
    reached = int(message.split("resume with --from-offset ")[1].split()[0].rstrip(".;"))
    assert reached > 0
    # Every record it counted is on the broker.
    on_topic = await read_topic(bootstrap, NAMES.vm_events, at_least=reached, timeout_s=30)
    assert len(on_topic) >= reached
    resumed = lavad(
        "produce", str(AZURE_SLICE), "--config", CONFIG, "--from-offset", str(reached),
        "--limit", "5", bootstrap=bootstrap, cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"records {reached} to {reached + 5}" in " ".join(resumed.stdout.split())


async def test_produce_interrupted_then_resumed_publishes_every_record_exactly_once(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    assert (
        lavad("topics", "create", "--config", CONFIG, bootstrap=bootstrap, cwd=tmp_path).returncode
        == 0
    )
    process = subprocess.Popen(
        [*LAVAD, "produce", str(AZURE_SLICE), "--config", CONFIG, "--speed", "3600"],
        env={**os.environ, "LAVAD_KAFKA__BOOTSTRAP_SERVERS": bootstrap},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await read_topic(bootstrap, NAMES.vm_events, at_least=100, timeout_s=60)
        process.send_signal(signal.SIGINT)  # Ctrl-C, mid-batch
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    message = " ".join(stderr.split())
    assert process.returncode != 0, message
    reached = int(message.split("resume with --from-offset ")[1].split()[0])
    assert reached > 0

    resumed = lavad(
        "produce", str(AZURE_SLICE), "--config", CONFIG, "--from-offset", str(reached),
        bootstrap=bootstrap, cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr

    expected = [
        encode(i) for i in open_trace(AZURE_SLICE, seed=0).events() if not isinstance(i, BadRecord)
    ]
    on_topic = await read_topic(bootstrap, NAMES.vm_events, at_least=len(expected), timeout_s=60)
    values = [record.value for record in on_topic]
    # Nothing lost, nothing twice: the count it printed was exact.
    assert len(values) == len(expected)
    assert set(values) == set(expected)
