"""The placement matrix (``lavad evaluate placement``) reads any folder laid out as
``../shared/data``: held-back traces of the same kinds check the defaults on
periods they were not chosen on.

These use the bundled Azure V1 slice (200 arrival lines, 46,214 requests) as
such a folder, so they run on a fresh clone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from lavad.daemon.settings import load_settings
from lavad.evaluation import placement_matrix as matrix
from lavad.streams.adapters import open_trace
from lavad.streams.adapters.base import TraceFormatError
from lavad.streams.schema import VmRequest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SLICE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"


def _held_back(root: Path) -> Path:
    """A data folder whose Azure V1 traces are the bundled slice (split ``devhead``)."""
    data = root / "data"
    shutil.copytree(SLICE, data / "azure-v1-vms")
    return data


def _requests(trace: Path) -> list[float]:
    return [e.time for e in open_trace(trace, seed=0).events() if isinstance(e, VmRequest)]


def test_the_azure_windows_are_the_halves_of_the_folders_own_split(tmp_path: Path) -> None:
    sources = matrix.Sources(_held_back(tmp_path))
    head = matrix.trace_path("azure-head", tmp_path / "scratch", sources)
    tail = matrix.trace_path("azure-tail", tmp_path / "scratch", sources)
    # The slice's split is devhead; its halves keep its censoring time's name.
    assert sorted(p.name for p in head.glob("v1.*head*.txt")) == [
        "v1.devheadhead.c2100000.txt",
        "v1.devheadhead.txt",
    ]
    for half, which in ((head, "head"), (tail, "tail")):
        files = (f"v1.devhead{which}.txt", f"v1.devhead{which}.c2100000.txt")
        # 100 of the slice's 200 arrival lines each, and as many lines of lifetimes.
        assert [len((half / name).read_text().splitlines()) for name in files] == [100, 100]
    head_times, tail_times = _requests(head), _requests(tail)
    # Together they are the whole slice, the head before the tail.
    assert len(head_times) + len(tail_times) == len(_requests(SLICE)) == 46_214
    assert head_times and tail_times and max(head_times) < min(tail_times)


def test_the_whole_window_is_the_folders_split_in_one_trace(tmp_path: Path) -> None:
    whole = matrix.trace_path(
        "azure-whole", tmp_path / "scratch", matrix.Sources(_held_back(tmp_path))
    )
    files = ("v1.devheadwhole.txt", "v1.devheadwhole.c2100000.txt")
    assert [len((whole / name).read_text().splitlines()) for name in files] == [200, 200]
    # The same requests at the same times as the slice replayed from its own folder.
    assert _requests(whole) == _requests(SLICE)


def test_a_folder_of_two_splits_must_name_the_one_to_halve(tmp_path: Path) -> None:
    data = _held_back(tmp_path)
    azure = data / "azure-v1-vms"
    shutil.copy(azure / "v1.devhead.txt", azure / "v1.later.txt")
    shutil.copy(azure / "v1.devhead.c2100000.txt", azure / "v1.later.c2100000.txt")
    with pytest.raises(TraceFormatError, match=r"holds 2 splits \['devhead', 'later'\]"):
        matrix.check_sources(matrix.Sources(data), ["azure-head"])
    matrix.check_sources(matrix.Sources(data, "later"), ["azure-head"])
    head = matrix.trace_path("azure-head", tmp_path / "scratch", matrix.Sources(data, "later"))
    assert (head / "v1.laterhead.txt").is_file()


def test_files_that_do_not_line_up_are_refused(tmp_path: Path) -> None:
    data = _held_back(tmp_path)
    durations = data / "azure-v1-vms" / "v1.devhead.c2100000.txt"
    lines = durations.read_text().splitlines(keepends=True)
    durations.write_text("".join(lines[:-1]))
    with pytest.raises(TraceFormatError, match=r"199 lines against 200 .* line by line"):
        matrix.trace_path("azure-tail", tmp_path / "scratch", matrix.Sources(data))


def test_a_window_missing_from_the_folder_is_named(tmp_path: Path) -> None:
    data = _held_back(tmp_path)
    with pytest.raises(TraceFormatError, match="alibaba-dlrm: window dlrm reads this folder"):
        matrix.check_sources(matrix.Sources(data), ["azure-head", "dlrm"])


# The console script, run by this interpreter.
LAVAD = (sys.executable, "-c", "from lavad.daemon.cli import main; main()")


def _evaluate(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LAVAD, "evaluate", "placement", *arguments],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_lavad_evaluate_placement_replays_a_held_back_folder(tmp_path: Path) -> None:
    data = _held_back(tmp_path)
    common = [str(data), "--window", "azure-tail", "--shape", "48/192", "--fleet", "grown"]
    common += ["--seeds", "1", "--policy", "bestfit", "--policy", "las", "--oracle", "las"]
    common += ["--jobs", "1"]
    # Each half spans about eight hours of arrivals, under the configuration's
    # day of warm-up: no figure, and the command says which option measures it.
    short = _evaluate(*common)
    assert short.returncode == 2, short.stderr[-2000:]
    said = " ".join(short.stderr.split())
    assert "window azure-tail measured nothing" in said and "pass --warmup-s" in said
    assert "Traceback" not in short.stderr
    cells = tmp_path / "cells.json"
    measured = _evaluate(*common, "--warmup-s", "7200", "--json", str(cells))
    assert measured.returncode == 0, measured.stderr[-2000:]
    rows = [line for line in measured.stdout.splitlines() if line.startswith("| azure-tail |")]
    assert [row.split("|")[5].strip() for row in rows] == ["bestfit", "las"]
    (cell,) = orjson.loads(cells.read_bytes())
    assert (cell["window"], cell["shape"], cell["fleet"], cell["seed"]) == (
        "azure-tail",
        "48/192",
        "grown",
        0,
    )
    # Best Fit's pool shows empty hosts over a measured window; its gain over
    # itself is nothing, so the table's first row says +0.00.
    assert cell["rows"][0]["empty_pct"] > 0
    assert "| bestfit | +0.00 [+0.00, +0.00] |" in rows[0]


def test_by_default_the_windows_are_those_the_folder_holds(tmp_path: Path) -> None:
    data = _held_back(tmp_path)
    common = [str(data), "--shape", "48/192", "--fleet", "grown", "--seeds", "1"]
    common += ["--policy", "bestfit", "--oracle", "bestfit", "--jobs", "1", "--warmup-s", "7200"]
    ran = _evaluate(*common)
    assert ran.returncode == 0, ran.stderr[-2000:]
    said = " ".join(ran.stderr.split())
    for window, folder in (("openb", "alibaba-openb"), ("dlrm", "alibaba-dlrm")):
        assert f"window {window} skipped: {data / folder} not found" in said
    measured = {
        line.split("|")[1].strip() for line in ran.stdout.splitlines() if "| bestfit |" in line
    }
    assert {"azure-head", "azure-tail", "azure-whole"} <= measured
    assert not measured & {"openb", "openb-cpu050", "dlrm"}
    # A window asked for by name is required.
    named = _evaluate(*common, "--window", "dlrm")
    assert named.returncode == 2
    assert "window dlrm reads this folder: not found" in " ".join(named.stderr.split())
    nothing = tmp_path / "empty"
    nothing.mkdir()
    none_here = _evaluate(str(nothing), "--seeds", "1")
    assert none_here.returncode == 2
    assert "no window's traces here" in " ".join(none_here.stderr.split())


def test_a_missing_folder_or_split_stops_before_any_replay(tmp_path: Path) -> None:
    missing = _evaluate(str(tmp_path / "nothing"), "--window", "azure-head")
    assert missing.returncode == 2
    assert "no such folder of traces" in " ".join(missing.stderr.split())
    data = _held_back(tmp_path)
    wrong = _evaluate(str(data), "--window", "azure-head", "--azure-split", "test")
    assert wrong.returncode == 2
    assert "no split 'test' here; found ['devhead']" in " ".join(wrong.stderr.split())


def _cell(seed: int, figures: dict[str, tuple[float, float, float]]) -> dict[str, object]:
    rows = [
        {"policy": policy, "empty_pct": empty, "stranded_cpu_pct": cpu, "stranded_memory_pct": mem}
        for policy, (empty, cpu, mem) in figures.items()
    ]
    return {"window": "azure-tail", "shape": "48/192", "fleet": "grown", "seed": seed, "rows": rows}


def test_the_summary_counts_the_conditions_at_the_goal() -> None:
    # Two seeds of one condition: (empty %, stranded CPU %, stranded memory %).
    seed_0 = {"bestfit": (10.0, 1.0, 1.0), "las": (11.0, 1.4, 1.0), "oracle": (12.0, 1.0, 1.1)}
    seed_1 = {"bestfit": (12.0, 1.0, 1.0), "las": (13.4, 1.2, 0.9), "oracle": (14.0, 1.1, 1.0)}
    cells = [_cell(0, seed_0), _cell(1, seed_1)]
    table, worst = matrix.summarise(cells, "oracle")
    # LAS gains +1.0 and +1.4 pp (mean +1.2); the oracle +2.0 and +2.0: a share
    # of 1.2 / 2.0 = 60%, at the goal. Its CPU strands +0.4 and +0.2 pp over
    # Best Fit (mean +0.30), over the goal's +0.25.
    assert "| azure-tail | 48/192 | grown | 11.00 | las | +1.20 [+1.00, +1.40] | 60% |" in table
    assert worst["las"]["share"] == pytest.approx(0.6)
    assert worst["las"]["strand"] == pytest.approx(0.3)
    assert "| las | 60% (azure-tail 48/192 grown) | +0.30 (azure-tail 48/192 grown) |" in table
    assert (worst["las"]["goal_shares"], worst["las"]["goal_strands"]) == (1, 0)
    # The oracle's memory strands +0.1 and +0.0 (mean +0.05): within the goal.
    assert (worst["oracle"]["goal_shares"], worst["oracle"]["goal_strands"]) == (1, 1)
    # Measured against an oracle that was not replayed, no share is shown, and
    # the table says why.
    table, worst = matrix.summarise(cells, "las-oracle")
    assert "No shares: the oracle las-oracle is not among the policies replayed." in table
    assert (worst["las"]["shown_shares"], worst["las"]["goal_strands"]) == (0, 0)


def test_an_absurd_seed_count_is_bounded_by_the_work_done(tmp_path: Path) -> None:
    # A trillion seeds of a window shorter than the warm-up: the first cell's
    # refusal ends the run, without the trillion units ever being listed or
    # submitted (they were, all at once, before the first cell ran).
    run = matrix.MatrixRun(
        load_settings(PROJECT_ROOT / "config" / "lavad.toml"),
        matrix.Sources(_held_back(tmp_path)),
        ("bestfit",),
        ("grown",),
    )
    with pytest.raises(matrix.EmptyWindow, match="window azure-tail measured nothing"):
        matrix.run_matrix(run, ["azure-tail"], ["48/192"], 10**12, 0, 1)
