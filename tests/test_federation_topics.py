"""`lavad federation topics`: the federation's topics laid out from its file, created on
a real broker; running it again changes nothing; a topic with another partition count
is refused by name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from typer.testing import CliRunner

from lavad.daemon.cli import app
from lavad.federation.live_wire import LAUNCHES, REQUESTS, STATE, VERDICTS
from lavad.streams.kafka.embedded import EmbeddedBroker
from lavad.streams.kafka.topics import partition_counts

pytestmark = [pytest.mark.kafka]


def _file(tmp_path: Path, bootstrap: str, pools: int, tenants: int) -> Path:
    path = tmp_path / f"federation-{pools}-{tenants}.toml"
    path.write_text(
        f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
        f"[federation]\npools = {pools}\ntenants = {tenants}\n",
        encoding="utf-8",
    )
    return path


async def _counts(bootstrap: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await partition_counts(admin)
    finally:
        await admin.close()


def test_topics_are_created_once_and_a_wrong_layout_is_refused(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    runner = CliRunner()
    config = _file(tmp_path, bootstrap, pools=3, tenants=5)
    first = runner.invoke(app, ["federation", "topics", str(config)])
    assert first.exit_code == 0, first.output
    assert f"{REQUESTS}: created (5 partitions)" in first.output
    counts = asyncio.run(_counts(bootstrap))
    # Launch and state partition p is pool p; requests partition t is tenant queue t.
    assert (counts[LAUNCHES], counts[STATE], counts[REQUESTS], counts[VERDICTS]) == (3, 3, 5, 1)

    again = runner.invoke(app, ["federation", "topics", str(config)])
    assert again.exit_code == 0, again.output
    assert "created" not in again.output

    # A file with 4 pools would send pool 3's launches to a partition that is not there.
    other = _file(tmp_path, bootstrap, pools=4, tenants=5)
    refused = runner.invoke(app, ["federation", "topics", str(other)])
    assert refused.exit_code == 1
    assert f"{LAUNCHES} has 3 (needs 4)" in refused.output
