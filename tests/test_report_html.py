"""``lavad report``: one self-contained HTML page from real runs, checked as a person would.

The inputs are made by the real commands on the bundled slices: a replay
(Best Fit against First Fit), a shadow replay (First Fit's placements, LAVA
beside them), the lifetime evaluation, the limits evaluation and the GPA
evaluation. The browser test renders the page in headless Chromium (Debian's
``chromium``; ``make browser`` installs it) and fails on any console error
or any request that leaves the file.
"""

from __future__ import annotations

import asyncio
import base64
import html
import itertools
import os
import re
import shutil
import struct
from pathlib import Path

import orjson
import pytest
from browser_check import CHROMIUM, check_page
from shadow_support import AZURE_SLICE, SLICE_HOSTS, SLICE_WARMUP_S
from typer.testing import CliRunner

from lavad.daemon.cli import app
from lavad.evaluation.report_html import ReportInputError, build_report, kind_of

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "lavad.toml"
LIMITS_SLICE = ROOT / "data" / "google-2011-gcd-limits-slice"
USAGE_SLICE = ROOT / "data" / "google-2011-gcd-slice"
ENV = {
    "COLUMNS": "200",
    "LAVAD_METRICS__WARMUP_S": str(SLICE_WARMUP_S),
    "LAVAD_HOSTS__SOURCE": "shape",
    "LAVAD_HOSTS__COUNT": str(SLICE_HOSTS),
    "LAVAD_HOSTS__GROW_ON_DEMAND": "false",
}
# The shadow run reads the first events of First Fit's stream (the whole
# slice is covered by tests/test_shadow.py).
SHADOW_EVENTS = 30_000


def _run(*args: str, **env: str) -> str:
    result = CliRunner().invoke(app, list(args), env={**ENV, **env})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("report")
    replay = tmp / "replay.json"
    _run(
        "replay", str(AZURE_SLICE), "--compare", "bestfit,firstfit", "--config", str(CONFIG),
        "--metrics-json", str(replay), "--no-progress",
    )  # fmt: skip
    stream = tmp / "firstfit-placed.jsonl"
    _run("shadow", "placements", str(AZURE_SLICE), str(stream), "--config", str(CONFIG))
    head = tmp / "firstfit-placed-head.jsonl"
    with stream.open("rb") as source:
        head.write_bytes(b"".join(itertools.islice(source, SHADOW_EVENTS)))
    shadow = tmp / "shadow.json"
    _run(
        "shadow", "replay", str(head), "--config", str(CONFIG), "--metrics-json", str(shadow),
        "--no-progress", LAVAD_PLACEMENT__POLICY="lava",
    )  # fmt: skip
    lifetime = tmp / "lifetime.json"
    _run("evaluate", "lifetime", str(AZURE_SLICE), "--json", str(lifetime), "--no-river")
    limits = tmp / "limits.json"
    _run("evaluate", "limits", str(LIMITS_SLICE), "--json", str(limits))
    _run(
        "evaluate", "gpa", str(USAGE_SLICE), "--tasks", "20", "--aligned-tasks", "20",
        "--instances", "2", "--realisations", "200", "--capacities", "1", "--rhos", "0.01",
        "--out-dir", str(tmp),
    )  # fmt: skip
    (gpa,) = tmp.glob("*-gpa.json")
    return {
        "replay": replay,
        "shadow": shadow,
        "lifetime": lifetime,
        "limits": limits,
        "gpa": gpa,
    }


@pytest.fixture(scope="module")
def page(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("page") / "report.html"
    printed = _run("report", *map(str, inputs.values()), "--out", str(out))
    assert "report written to" in printed
    return out


def test_each_input_is_recognised(inputs: dict[str, Path]) -> None:
    for kind, path in inputs.items():
        assert kind_of(orjson.loads(path.read_bytes())) == kind


def test_the_page_needs_nothing_outside_itself(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    # Every src and href is inline data; no script at all.
    refs = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)['"]""", text)
    assert refs and all(ref.startswith("data:") for ref in refs), refs
    assert "<script" not in text.lower() and "http://" not in text and "https://" not in text
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)
    assert len(images) >= 9
    for data in images:
        png = base64.b64decode(data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width >= 400 and height >= 200


def test_the_page_shows_the_numbers_of_its_inputs(inputs: dict[str, Path], page: Path) -> None:
    text = html.unescape(page.read_text(encoding="utf-8"))
    for run in orjson.loads(inputs["replay"].read_bytes())["runs"]:
        metrics = run["pools"]["default"]
        assert f">{run['policy']}<" in text
        assert f"{metrics['empty_hosts_pct']:,.2f}" in text
        assert f"{metrics['stranded_memory_pct']:,.2f}" in text
    shadow = orjson.loads(inputs["shadow"].read_bytes())
    agreement = shadow["agreement"]["default"]
    assert f"{100 * agreement['same_host_rate']:.1f}%" in text
    assert f"{100 * agreement['same_class_rate']:.1f}%" in text
    difference = shadow["empty_hosts_difference"]["default"]["mean_pp"]
    assert f"{difference:+.2f} pp" in text
    for section in (
        "Shadow mode: lavad beside the existing scheduler",
        "Both sides' packing metrics",
        "Empty hosts and utilisation over time",
        "Stranding",
        "Decision mix and unfit reasons",
        "Difference in empty hosts over time",
        "Lifetime calibration",
        "CPU and memory limits: Pareto plot",
        "GPA: machines against overflow",
    ):
        assert f"<h2>{section}</h2>" in text, section
    lifetime = orjson.loads(inputs["lifetime"].read_bytes())
    ece = lifetime["models"][0]["thresholds"][0]["expected_calibration_error"]
    assert f"{ece:,.4f}" in text


def test_something_else_is_refused_with_the_reason(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_bytes(orjson.dumps({"hello": 1}))
    with pytest.raises(ReportInputError, match=r"other\.json: not a replay, shadow"):
        build_report([other])
    broken = tmp_path / "broken.json"
    broken.write_bytes(b"{")
    with pytest.raises(ReportInputError, match=r"broken\.json: not JSON"):
        build_report([broken])
    odd = tmp_path / "odd.json"
    odd.write_bytes(orjson.dumps({"runs": [{"policy": "x"}]}))
    with pytest.raises(ReportInputError, match=r"odd\.json: unexpected layout"):
        build_report([odd])


@pytest.mark.parametrize(
    ("where", "value", "error"),
    [
        # A real replay's metrics with one value of another type, each once a traceback.
        (("runs", 0, "pools"), None, "AttributeError"),
        (("runs", 0, "dead_letters"), 1.5, "AttributeError"),
        (("runs", 0, "pools", "default"), [], "AttributeError"),
    ],
)
def test_a_replays_metrics_of_another_layout_are_refused_with_the_reason(
    inputs: dict[str, Path], tmp_path: Path, where: tuple[object, ...], value: object, error: str
) -> None:
    document = orjson.loads(inputs["replay"].read_bytes())
    parent = document
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    odd = tmp_path / "odd.json"
    odd.write_bytes(orjson.dumps(document))
    with pytest.raises(ReportInputError, match=rf"odd\.json: unexpected layout \({error}"):
        build_report([odd])


# A mark, not a skip inside the test: the page's inputs (a module fixture, built
# on each worker that runs a test of this module) cost about a minute to make.
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"{CHROMIUM} not installed (`make browser` installs Debian's chromium)",
)
def test_chromium_renders_it_without_console_errors(page: Path, tmp_path: Path) -> None:
    screenshot = tmp_path / "report.png"
    check = asyncio.run(check_page(page, screenshot))
    assert check.errors == []
    assert check.network == []
    assert check.width >= 1200 and check.height > 3000  # every section laid out
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (check.width, check.height)
    assert len(png) > 100_000  # plots and tables, not a blank page
    keep = os.environ.get("REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(screenshot, keep)
        shutil.copyfile(page, Path(keep).with_suffix(".html"))
