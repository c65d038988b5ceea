"""Replay end to end on real slices: determinism, dead letters, the CLI."""

from __future__ import annotations

import io
import warnings
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from support import replay_trace
from typer.testing import CliRunner

from lavad.daemon.cli import app
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.evaluation.report_html import build_report
from lavad.streams.adapters import open_trace
from lavad.streams.codec import encode
from lavad.streams.schema import VmExit, VmRequest

ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"
OPENB_SLICE = ROOT / "data" / "alibaba-openb-slice"
CONFIG = ROOT / "config" / "lavad.toml"


def _replay_bytes(path: Path, policy: str, seed: int) -> tuple[bytes, dict[str, object]]:
    decisions, result = replay_trace(path, policy, seed)
    return decisions, result.as_dict()


@pytest.mark.parametrize("path", [AZURE_SLICE, OPENB_SLICE], ids=["azure", "openb"])
def test_same_trace_and_seed_give_byte_identical_decisions(path: Path) -> None:
    first, summary = _replay_bytes(path, "bestfit", seed=3)
    second, _ = _replay_bytes(path, "bestfit", seed=3)
    assert first == second
    assert first.count(b"\n") == summary["decisions"]["placement"]  # type: ignore[index]


def test_a_different_seed_changes_the_tie_breaks() -> None:
    first, _ = _replay_bytes(AZURE_SLICE, "bestfit", seed=3)
    other, _ = _replay_bytes(AZURE_SLICE, "bestfit", seed=4)
    assert first != other


def test_every_request_gets_exactly_one_decision() -> None:
    decisions, summary = _replay_bytes(AZURE_SLICE, "firstfit", seed=0)
    requested = sum(1 for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest))
    ids = [orjson.loads(line)["vm_id"] for line in decisions.splitlines()]
    assert len(ids) == requested == len(set(ids))
    pool = summary["pools"]["default"]  # type: ignore[index]
    assert pool["requests"] == requested


def test_openb_slice_runs_on_the_traces_own_hosts() -> None:
    _, summary = _replay_bytes(OPENB_SLICE, "bestfit", seed=0)
    pool = summary["pools"]["default"]  # type: ignore[index]
    assert pool["hosts_up_end"] == 1523
    assert pool["hosts_added_on_demand"] == 0


def test_bad_input_is_dead_lettered_counted_and_never_fatal(tmp_path: Path) -> None:
    # Real requests from the Azure slice, with bad records mixed in.
    real = [e for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest)][:50]
    lines = [encode(e) for e in real]
    first = real[0]
    t = real[9].time  # the bad records sit after the 10th line, in time order
    bad = [
        b'{"v": 1, "type": "vm.request", "time": ',  # malformed JSON
        # no vm_id:
        b'{"v": 1, "type": "vm.request", "time": 1, "pool": "default", "cores": 2, '
        b'"memory_gib": 4}',
        orjson.dumps({**orjson.loads(encode(first)), "vm_id": "negative", "cores": -2}),
        encode(VmExit(time=t, pool="default", vm_id="never-requested")),
        encode(replace(first, time=t)),  # duplicate VM id: the same VM again
    ]
    trace_file = tmp_path / "mixed.jsonl"
    trace_file.write_bytes(b"\n".join(lines[:10] + bad + lines[10:]) + b"\n")
    settings = load_settings(CONFIG)
    trace = open_trace(trace_file)
    decisions, dead = io.BytesIO(), io.BytesIO()
    result = replay(
        trace.events(),
        settings.engine_config("bestfit", trace_has_hosts=False),
        decisions_out=decisions,
        dead_letters_out=dead,
    )
    letters = [orjson.loads(line) for line in dead.getvalue().splitlines()]
    assert result.dead_letters == {"malformed": 3, "rejected": 2}
    reasons = " | ".join(letter["reason"] for letter in letters)
    assert "not valid JSON" in reasons
    assert "vm_id" in reasons and "Field required" in reasons
    assert "cores" in reasons and "greater than 0" in reasons
    assert "exit of unknown VM 'never-requested'" in reasons
    assert f"duplicate VM id {first.vm_id!r}" in reasons
    # The valid stream is unaffected: 50 requests, 50 decisions.
    assert result.decisions["placement"] == 50
    assert all(letter["raw_base64"] for letter in letters)


def test_cli_compare_prints_table_writes_json_and_plot(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.json"
    plot = tmp_path / "packing.png"
    out = tmp_path / "decisions.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "replay",
            str(AZURE_SLICE),
            "--compare",
            "bestfit,firstfit",
            "--config",
            str(CONFIG),
            "--metrics-json",
            str(metrics),
            "--plot",
            str(plot),
            "--out",
            str(out),
            "--no-progress",
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "bestfit" in result.output and "firstfit" in result.output
    assert "empty hosts" in result.output
    runs = orjson.loads(metrics.read_bytes())["runs"]
    assert [run["policy"] for run in runs] == ["bestfit", "firstfit"]
    assert plot.stat().st_size > 10_000
    assert (tmp_path / "decisions.bestfit.jsonl").exists()
    assert (tmp_path / "decisions.firstfit.jsonl").exists()


def test_cli_compare_writes_each_policys_dead_letters_beside_out(tmp_path: Path) -> None:
    """One dead-letter file per compared policy, named from ``--out``'s stem once:
    ``decisions.<policy>.deadletters.jsonl``, not from the per-policy decisions file
    (which gave ``decisions.bestfit.bestfit.deadletters.jsonl``)."""
    real = [e for e in open_trace(AZURE_SLICE, seed=0).events() if isinstance(e, VmRequest)][:20]
    lines = [encode(e) for e in real]
    trace_file = tmp_path / "mixed.jsonl"
    trace_file.write_bytes(b"\n".join([*lines[:10], b'{"v": 1, "type": ', *lines[10:]]) + b"\n")
    out = tmp_path / "decisions.jsonl"
    arguments = [
        "replay", str(trace_file), "--compare", "bestfit,firstfit", "--config", str(CONFIG),
        "--metrics-json", str(tmp_path / "metrics.json"), "--out", str(out), "--no-progress",
    ]  # fmt: skip
    result = CliRunner().invoke(app, arguments, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for policy in ("bestfit", "firstfit"):
        dead = (tmp_path / f"decisions.{policy}.deadletters.jsonl").read_bytes().splitlines()
        (letter,) = [orjson.loads(line) for line in dead]
        assert "not valid JSON" in letter["reason"]
        assert letter["position"] == "line 11"
    assert sorted(path.name for path in tmp_path.glob("*.deadletters.jsonl")) == [
        "decisions.bestfit.deadletters.jsonl",
        "decisions.firstfit.deadletters.jsonl",
    ]


def test_cli_a_trace_of_no_valid_event_says_there_is_nothing_to_measure(tmp_path: Path) -> None:
    trace_file = tmp_path / "bad-only.jsonl"
    trace_file.write_bytes(b'{"v": 1, "type": \n')
    arguments = [
        "replay", str(trace_file), "--config", str(CONFIG), "--no-progress",
        "--metrics-json", str(tmp_path / "metrics.json"),
    ]  # fmt: skip
    result = CliRunner().invoke(app, arguments, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "No pool took an event (the trace holds no valid event): nothing to measure." in text
    assert "counted against" not in text
    assert "dead letters {'malformed': 1}" in text
    # Its HTML report has no stranding bars to draw (an empty plot warned), and the
    # existing scheduler's placements of it are "no events".
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        page = build_report([tmp_path / "metrics.json"])
    assert "Stranding" not in page
    placed = tmp_path / "placed.jsonl"
    shadow = ["shadow", "placements", str(trace_file), str(placed), "--config", str(CONFIG)]
    result = CliRunner().invoke(app, shadow, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"{placed}: no events (1 bad records skipped)" in " ".join(result.output.split())


def test_cli_bad_config_exits_with_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[hosts]\ncores = 0\n")
    result = CliRunner().invoke(app, ["replay", str(AZURE_SLICE), "--config", str(bad)])
    assert result.exit_code == 2
    assert "hosts.cores" in result.output


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (["--compare", "bestfit,las,bestfit"], "--compare names 'bestfit' more than once"),
        (["--policy", "las", "--compare", "bestfit,lava"], "give one"),
    ],
    ids=["a policy twice", "policy and compare"],
)
def test_cli_a_policy_list_that_would_drop_or_overwrite_a_run_is_refused(
    tmp_path: Path, arguments: list[str], reason: str
) -> None:
    # The second bestfit would overwrite the first's decisions file; --policy
    # beside --compare was dropped without a word. Neither starts a replay.
    out = tmp_path / "d.jsonl"
    result = CliRunner().invoke(
        app, ["replay", str(AZURE_SLICE), "--config", str(CONFIG), "--out", str(out), *arguments]
    )
    assert result.exit_code == 2, result.output
    assert reason in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []


def test_cli_trace_info(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["trace", "info", str(AZURE_SLICE)])
    assert result.exit_code == 0, result.output
    assert "vm.request" in result.output


@pytest.mark.shared_data
@pytest.mark.slow
def test_openb_full_trace_replays(shared_data: Path) -> None:
    _, summary = _replay_bytes(shared_data / "alibaba-openb", "bestfit", seed=0)
    pool = summary["pools"]["default"]  # type: ignore[index]
    assert pool["requests"] == 8152
    assert pool["empty_hosts_pct"] is not None


def test_converted_trace_replays_to_the_same_decisions(tmp_path: Path) -> None:
    """Trace -> canonical JSON lines -> replay decides exactly as the trace itself."""
    events = tmp_path / "azure.jsonl"
    result = CliRunner().invoke(app, ["trace", "convert", str(AZURE_SLICE), str(events)])
    assert result.exit_code == 0, result.output
    direct, _ = _replay_bytes(AZURE_SLICE, "bestfit", seed=0)
    settings = load_settings(CONFIG)
    sink = io.BytesIO()
    replay(
        open_trace(events).events(),
        settings.engine_config("bestfit", trace_has_hosts=False),
        decisions_out=sink,
    )
    assert sink.getvalue() == direct
