"""The replay table's shares say what they are shares of (the issue: 44 % empty beside 94 % CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lavad.evaluation.report_html import build_report

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _replay_slice(
    tmp_path: Path, warmup_s: str, *policies: str
) -> subprocess.CompletedProcess[str]:
    """``lavad replay`` of the bundled slice under this warm-up, as a user runs it."""
    result = subprocess.run(
        [
            sys.executable, "-c", "from lavad.daemon.cli import main; main()",
            "replay", str(PROJECT_ROOT / "data" / "azure-v1-vms-slice"), *policies,
            "--config", str(PROJECT_ROOT / "config" / "lavad.toml"),
            "--metrics-json", str(tmp_path / "metrics.json"), "--no-progress",
        ],
        env={**os.environ, "LAVAD_METRICS__WARMUP_S": warmup_s, "COLUMNS": "200"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def test_replay_table_names_the_basis_of_every_share(tmp_path: Path) -> None:
    # `make replay`: the bundled slice grows its pool on demand, so empty hosts
    # are restated on a common pool while booked CPU stays a share of hosts up.
    result = _replay_slice(tmp_path, "21600", "--compare", "bestfit,firstfit")
    header = result.stdout.split("┡")[0]
    assert "empty hosts %" in header
    assert "of 416 hosts" in header
    assert header.count("of hosts up") == 2  # CPU and memory booked
    assert header.count("of schedulable") == 2  # stranded CPU and memory
    assert "util" not in header  # booked requests, not measured usage
    text = " ".join(result.stdout.split())
    assert "Empty hosts are counted against pool default: common pool of 416 hosts" in text
    assert "over the capacity of the hosts up at each moment" in text


def test_a_trace_shorter_than_the_warm_up_says_why_it_has_no_averages(tmp_path: Path) -> None:
    # The bundled slice spans about 3.5 days of arrivals; a warm-up of 30 days
    # leaves no measured window, which the summary must say rather than print
    # an interval that ends before it begins.
    result = _replay_slice(tmp_path, "2592000", "--policy", "bestfit")
    text = " ".join(result.stdout.split())
    assert "No averages: the measured window is empty" in text
    assert "It would open 2592000 s after the first event" in text
    assert "set [metrics] warmup_s below the trace's span" in text
    assert "Averages over" not in text
    # The HTML report of the same figures says it too.
    page = build_report([tmp_path / "metrics.json"])
    assert "No averages: the measured window is empty" in page
    assert "Averages over" not in page
