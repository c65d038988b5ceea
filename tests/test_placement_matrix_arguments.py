"""``python -m benchmarks.placement_matrix`` refuses a bad argument at once, naming it,
before any trace is read or worker started (before: tracebacks from the first cell)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--shape", "0/128"], "got '0/128': cores: Input should be greater than 0"),
        (["--shape", "48"], "want cores/memory[/gpus[/disk]]"),
        (["--seeds", "0"], "argument --seeds: want at least 1, got 0"),
        (["--policy", "las:bogus=1"], "policies.las.bogus: Extra inputs are not permitted"),
        (
            ["--oracle", "las:cost_tolerance=-1"],
            "policies.las.cost_tolerance: Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_bad_argument_stops_the_matrix_with_its_reason(arguments: list[str], said: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.placement_matrix", *arguments],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert said in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
