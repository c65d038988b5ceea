"""``lavad tail --headers`` against a real Kafka-protocol broker: a dead letter's reason
is in its headers, which the plain value-per-line output leaves out."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from lavad.streams.kafka.deadletter import dead_letter_headers
from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.kafka

CONFIG = str(Path(__file__).resolve().parents[1] / "config" / "lavad.toml")
LAVAD = [sys.executable, "-c", "from lavad.daemon.cli import main; main()"]
TOPIC = "lavad.dead-letters"


async def test_tail_with_headers_shows_each_dead_letters_reason_and_bytes(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    records = [
        (b"default", b"not json at all", dead_letter_headers("decode", "not JSON", "in", 1, 0)),
        (None, b"\xff\xfe\x00", dead_letter_headers("decode", "not UTF-8", "in", 2, 7)),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    await producer.start()
    try:
        for key, value, headers in records:
            # One partition for both: the output keeps their order.
            await producer.send_and_wait(TOPIC, value, key=key, headers=headers, partition=0)
    finally:
        await producer.stop()
    env = {**os.environ, "LAVAD_KAFKA__BOOTSTRAP_SERVERS": broker.bootstrap_servers}
    common = ["tail", TOPIC, "--no-follow", "--config", CONFIG]
    shown = subprocess.run(
        [*LAVAD, *common, "--headers"],
        env=env, cwd=tmp_path, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr.decode()[-2000:]
    first, second = (orjson.loads(line) for line in shown.stdout.splitlines())
    assert first["headers"]["lavad.reason"] == "not JSON"
    assert first["headers"]["lavad.source.offset"] == "0"
    assert (first["key"], first["value"]) == ("default", "not json at all")
    assert second["headers"]["lavad.reason"] == "not UTF-8"
    assert second["key"] is None
    assert base64.b64decode(second["value_base64"]) == b"\xff\xfe\x00"
    # Without the option: the values alone, byte for byte.
    plain = subprocess.run(
        [*LAVAD, *common], env=env, cwd=tmp_path, capture_output=True, timeout=120, check=False
    )
    assert plain.returncode == 0, plain.stderr.decode()[-2000:]
    assert plain.stdout == b"not json at all\n\xff\xfe\x00\n"
