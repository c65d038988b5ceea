"""The replay table's shares say what they are shares of (the issue: 44 % empty beside 94 % CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_replay_table_names_the_basis_of_every_share(tmp_path: Path) -> None:
    # `make replay`: the bundled slice grows its pool on demand, so empty hosts
    # are restated on a common pool while booked CPU stays a share of hosts up.
    result = subprocess.run(
        [
            sys.executable, "-c", "from lavad.daemon.cli import main; main()",
            "replay", str(PROJECT_ROOT / "data" / "azure-v1-vms-slice"),
            "--compare", "bestfit,firstfit",
            "--config", str(PROJECT_ROOT / "config" / "lavad.toml"),
            "--metrics-json", str(tmp_path / "metrics.json"),
        ],
        env={**os.environ, "LAVAD_METRICS__WARMUP_S": "21600"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    header = result.stdout.split("┡")[0]
    assert "empty hosts %" in header
    assert "of 416 hosts" in header
    assert header.count("of hosts up") == 2  # CPU and memory booked
    assert header.count("of schedulable") == 2  # stranded CPU and memory
    assert "util" not in header  # booked requests, not measured usage
    text = " ".join(result.stdout.split())
    assert "Empty hosts are counted against pool default: common pool of 416 hosts" in text
    assert "over the capacity of the hosts up at each moment" in text
