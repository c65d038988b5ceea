"""The replay table's shares say what they are shares of (the issue: 44 % empty beside 94 % CPU)."""

from __future__ import annotations

import html
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from lavad.evaluation.report_html import build_report

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _replay_slice(
    tmp_path: Path, warmup_s: str, *policies: str
) -> subprocess.CompletedProcess[str]:
    """``lavad replay`` of the bundled slice under this warm-up, as a user runs it."""
    result = _run_replay(tmp_path, warmup_s, *policies)
    assert result.returncode == 0, result.stderr
    return result


def _run_replay(tmp_path: Path, warmup_s: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """The same command, ``[metrics] warmup_s`` set in its environment, however it ends."""
    return subprocess.run(
        [
            sys.executable, "-c", "from lavad.daemon.cli import main; main()",
            "replay", str(PROJECT_ROOT / "data" / "azure-v1-vms-slice"), *arguments,
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
    # The bundled slice's arrivals span 16.7 h; a warm-up of 30 days leaves
    # no measured window, which the summary must say rather than print
    # an interval that ends before it begins.
    result = _replay_slice(tmp_path, "2592000", "--policy", "bestfit")
    text = " ".join(result.stdout.split())
    assert "No averages: the measured window is empty" in text
    assert "It would open 2592000 s after the first event" in text
    assert "set [metrics] warmup_s (or --warmup-s) below the trace's span" in text
    assert "Averages over" not in text
    # The HTML report of the same figures says it too.
    page = build_report([tmp_path / "metrics.json"])
    assert "No averages: the measured window is empty" in page
    assert "Averages over" not in page


def test_the_warmup_option_overrides_the_configurations_key(tmp_path: Path) -> None:
    # The configuration (its environment here) leaves no window on the slice,
    # as the default day does; the option opens one 6 h after the first event.
    result = _replay_slice(tmp_path, "2592000", "--policy", "bestfit", "--warmup-s", "21600")
    text = " ".join(result.stdout.split())
    assert "the first 21600 s after the first event are warm-up" in text
    assert "No averages" not in text
    pool = orjson.loads((tmp_path / "metrics.json").read_bytes())["runs"][0]["pools"]["default"]
    assert pool["warmup_s"] == 21600.0
    assert pool["measured_from_s"] < pool["measured_until_s"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("-1", "Input should be greater than or equal to 0"),
        ("nan", "Input should be a finite number"),
    ],
)
def test_a_bad_warmup_option_stops_the_replay_naming_it(
    tmp_path: Path, value: str, reason: str
) -> None:
    result = _run_replay(tmp_path, "21600", "--policy", "bestfit", "--warmup-s", value)
    assert result.returncode == 2
    assert f"--warmup-s {value}: {reason}" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "metrics.json").exists()


def test_an_absurd_warmup_option_replays_and_says_no_window_opened(tmp_path: Path) -> None:
    # The largest finite float: the warm-up is a threshold, never a count of
    # steps, so the replay takes the usual time and measures nothing.
    result = _replay_slice(tmp_path, "21600", "--policy", "bestfit", "--warmup-s", "1e308")
    text = " ".join(result.stdout.split())
    assert "No averages: the measured window is empty" in text
    assert "Averages over" not in text


def test_a_compared_oracle_is_divided_as_its_runs_say(tmp_path: Path) -> None:
    # The replay's shares come from the same runs its JSON holds: the oracle's
    # gain is its empty hosts % less the baseline's. The bundled slice is too
    # short for the oracle to gain over 0.5 pp, so the replay says it gives no
    # share and why (the shares themselves are worked by hand in
    # test_oracle_share.py).
    result = _replay_slice(tmp_path, "21600", "--compare", "bestfit,firstfit,las-oracle")
    document = orjson.loads((tmp_path / "metrics.json").read_bytes())
    empty = {run["policy"]: run["pools"]["default"]["empty_hosts_pct"] for run in document["runs"]}
    gain = empty["las-oracle"] - empty["bestfit"]
    assert 0 < gain <= 0.5
    shares = document["oracle_shares"]
    assert shares["baseline"] == "bestfit"
    assert shares["oracle"] == "las-oracle"
    assert shares["pools"]["default"]["oracle_gain_pp"] == pytest.approx(gain)
    assert shares["pools"]["default"]["shares"] == {"firstfit": None}
    text = " ".join(result.stdout.split())
    line = (
        f"No share of las-oracle's gain in pool default: it gains {gain:+.2f} pp of empty hosts"
        " over bestfit, not over the 0.5 pp a share needs."
    )
    assert line in text
    # The HTML report of the same JSON says the same, beside the table.
    page = build_report([tmp_path / "metrics.json"])
    assert html.escape(line) in page
    table, share = page.index("Packing metrics per policy"), page.index("Share of the oracle")
    assert table < share < page.index("Empty hosts and utilisation over time")


def test_no_oracle_compared_writes_no_shares(tmp_path: Path) -> None:
    result = _replay_slice(tmp_path, "21600", "--compare", "bestfit,firstfit")
    assert "oracle_shares" not in orjson.loads((tmp_path / "metrics.json").read_bytes())
    text = " ".join(result.stdout.split())
    assert "Share of" not in text
    assert "No share of" not in text
