"""Progress a person can follow: piped, one line per replayed policy and per evaluation."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from lavad.daemon.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_a_piped_replay_says_what_each_policy_did(tmp_path: Path) -> None:
    args = [
        "replay", str(ROOT / "data" / "azure-v1-vms-slice"), "--compare", "bestfit,firstfit",
        "--config", str(ROOT / "config" / "lavad.toml"),
        "--metrics-json", str(tmp_path / "m.json"),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for policy in ("bestfit", "firstfit"):
        line = re.search(
            rf"^{policy}: 91,740 events in [\d.]+ s \([\d,]+/s\), 46,214 decisions,"
            r" 0 dead letters$",
            result.output,
            re.MULTILINE,
        )
        assert line is not None, result.output


def test_a_piped_evaluation_ends_with_its_wall_time() -> None:
    result = CliRunner().invoke(
        app, ["evaluate", "limits", str(ROOT / "data" / "google-2011-gcd-limits-slice")]
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"^lavad evaluate limits: done in [\d.]+ s$", result.output, re.MULTILINE)
    failed = CliRunner().invoke(app, ["evaluate", "limits", "/nonexistent/trace"])
    assert failed.exit_code == 2
    assert re.search(r"^lavad evaluate limits: stopped in [\d.]+ s$", failed.output, re.MULTILINE)
