"""The benchmarks' commands refuse a bad argument at once, naming it, before any
trace is read, worker started or broker run (before: tracebacks from the first
cell, a division by a rate of 0, or a run that never paced)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("module", "arguments", "said"),
    [
        (
            "placement_matrix",
            ["--shape", "0/128"],
            "got '0/128': cores: Input should be greater than 0",
        ),
        ("placement_matrix", ["--shape", "48"], "want cores/memory[/gpus[/disk]]"),
        (
            "placement_matrix",
            ["--seeds", "0"],
            "Invalid value for '--seeds': Input should be greater than or equal to 1",
        ),
        (
            "placement_matrix",
            ["--warmup-s", "-1"],
            "Invalid value for '--warmup-s': Input should be greater than or equal to 0",
        ),
        ("placement_matrix", ["--window", "nope"], "--window 'nope': want one of azure-head"),
        (
            "placement_matrix",
            ["--first-seed", str(2**63 - 1), "--seeds", "2"],
            "must be at most 9223372036854775807",
        ),
        ("placement_matrix", ["--jobs", "0"], "Invalid value for '--jobs'"),
        (
            "placement_matrix",
            ["--policy", "las+hindsight"],
            "--policy las+hindsight: needs --policy las before it",
        ),
        (
            "placement_matrix",
            ["--policy", "las:bogus=1"],
            "policies.las.bogus: Extra inputs are not permitted",
        ),
        (
            "placement_matrix",
            ["--oracle", "las:cost_tolerance=-1"],
            "policies.las.cost_tolerance: Input should be greater than or equal to 0",
        ),
        ("soak", ["--rate", "0"], "argument --rate: want a finite number above 0, got '0'"),
        ("soak", ["--minutes", "nan"], "argument --minutes: want a finite number above 0"),
        ("failover", ["--rate", "inf"], "argument --rate: want a finite number above 0"),
        ("failover", ["--runs", "0"], "argument --runs: want at least 1, got 0"),
        ("failover", ["--per-pool", "x"], "argument --per-pool: want a whole number, got 'x'"),
    ],
)
def test_a_bad_argument_stops_the_benchmark_with_its_reason(
    module: str, arguments: list[str], said: str
) -> None:
    # In a session of its own: should a check regress, the command runs on, and
    # its worker processes must stop with it. Interrupted first, as from a
    # terminal, so that it stops the broker it may have started (in a session
    # of the broker's own), then killed.
    with subprocess.Popen(
        [sys.executable, "-m", f"benchmarks.{module}", *arguments],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as command:
        try:
            _, stderr = command.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(command.pid, signal.SIGINT)
            try:
                command.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(command.pid, signal.SIGKILL)
                command.communicate()
            pytest.fail(f"{module} {arguments} ran on instead of refusing its argument")
    assert command.returncode == 2, stderr[-2000:]
    assert said in " ".join(stderr.split())
    assert "Traceback" not in stderr
