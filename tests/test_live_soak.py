"""The soak benchmark in small: steady input, snapshots, a restart, nothing that grows.

``benchmarks/soak.py`` runs for an hour; here it runs for about half a minute
(a sample every 2 s, a snapshot every 3 s) and what it samples must stay
flat for each instance once its snapshot store is connected: open file
descriptors, and asyncio tasks (which come and go with each publish).
Memory is not held to a bound here: in half a minute the pools are still
filling with the slice's first loop.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RATE = 300


def test_a_short_soak_with_a_restart_keeps_descriptors_and_tasks_flat_and_lag_bounded(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.soak",
            "--minutes",
            "0.4",
            "--interval-s",
            "2",
            "--rate",
            str(RATE),
            "--snapshot-interval-s",
            "3",
            "--json",
            str(out),
        ],
        cwd=PROJECT_ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Its logs are kept only when an instance failed.
    assert not list(tmp_path.glob("lavad-soak-*")), result.stdout
    samples = json.loads(out.read_text())
    instances = sorted({s["instance"] for s in samples})
    assert instances == [0, 1], "the restart half-way did not happen"
    for instance in instances:
        series = [s for s in samples if s["instance"] == instance]
        # From the second sample on, the snapshot store's clients are open.
        settled = series[1:]
        assert len(settled) >= 3, series
        first = settled[0]
        assert max(s["open_fds"] for s in settled) <= first["open_fds"] + 4, series
        # Tasks come and go with each publish and commit (a few either way,
        # more on a loaded machine): the later samples' median may not rise
        # above the earlier ones', and none is far above what the daemon runs
        # (its loops, aiokafka's, the HTTP server).
        tasks = [s["tasks"] for s in settled]
        half = len(tasks) // 2
        assert statistics.median(tasks[half:]) <= statistics.median(tasks[:half]) + 3, series
        assert max(tasks) <= 50, series
        # Deciding keeps up: events keep being processed, the lag stays within
        # a few seconds of input (the daemon decides tens of thousands a second).
        events = [s["events"] for s in settled]
        assert events == sorted(events) and events[-1] > events[0], series
        assert max(s["lag_records"] for s in settled) <= 10 * RATE, series
