"""An output file that cannot be written stops the command at once, naming the option
and the reason, before the work (before: a traceback, for ``--plot`` and
``--metrics-json`` after the whole replay had run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lavad.daemon.cli import app

ROOT = Path(__file__).resolve().parents[1]
AZURE = str(ROOT / "data" / "azure-v1-vms-slice")
GOOGLE = str(ROOT / "data" / "google-2011-gcd-slice")
MEGHA = str(ROOT / "data" / "megha-goog-slice")

# {file}: a path under a regular file (its folder cannot be made); {folder}: a folder.
CASES = [
    (
        ["replay", AZURE, "--out", "{file}/x.jsonl"],
        "--out {file}/x.jsonl: its folder cannot be made",
    ),
    (["replay", AZURE, "--metrics-json", "{folder}"], "--metrics-json {folder}: is a folder"),
    (["replay", AZURE, "--plot", "{file}/x.png"], "--plot {file}/x.png: its folder cannot be made"),
    (
        ["replay", AZURE, "--compare", "bestfit,las", "--out", "{file}/d.jsonl"],
        "--out {file}/d.bestfit.jsonl: its folder cannot be made",
    ),
    (["trace", "convert", AZURE, "{folder}"], "OUTPUT {folder}: is a folder"),
    (["report", AZURE, "--out", "{file}/r.html"], "--out {file}/r.html: its folder cannot be made"),
    (["shadow", "placements", AZURE, "{folder}"], "OUTPUT {folder}: is a folder"),
    (["shadow", "replay", AZURE, "--out", "{folder}"], "--out {folder}: is a folder"),
    (["evaluate", "lifetime", AZURE, "--json", "{folder}"], "--json {folder}: is a folder"),
    (["evaluate", "migrations", AZURE, "--json", "{folder}"], "--json {folder}: is a folder"),
    (["evaluate", "admission", AZURE, "--json", "{folder}"], "--json {folder}: is a folder"),
    (["evaluate", "limits", GOOGLE, "--json", "{folder}"], "--json {folder}: is a folder"),
    (["evaluate", "limits", GOOGLE, "--plot", "{folder}"], "--plot {folder}: is a folder"),
    (["evaluate", "federation", MEGHA, "--json", "{folder}"], "--json {folder}: is a folder"),
    (["evaluate", "federation", MEGHA, "--plot", "{folder}"], "--plot {folder}: is a folder"),
    (
        ["evaluate", "gpa", GOOGLE, "--out-dir", "{file}/gpa"],
        "--out-dir {file}/gpa: cannot hold files",
    ),
]


@pytest.mark.parametrize(("arguments", "said"), CASES)
def test_an_output_that_cannot_be_written_stops_the_command_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arguments: list[str], said: str
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default outputs (lavad-metrics.json) would go
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    a_folder = tmp_path / "a-folder"
    a_folder.mkdir()
    places = {"file": str(a_file), "folder": str(a_folder)}
    result = CliRunner().invoke(app, [part.format(**places) for part in arguments])
    assert result.exit_code == 2, result.output
    # Rich wraps a long path anywhere: compared without the whitespace.
    assert "".join(said.format(**places).split()) in "".join(result.output.split())
    assert result.exception is None or isinstance(result.exception, SystemExit)
    # Refused before the work: nothing written, the folder as it was.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file", "a-folder"]
    assert list(a_folder.iterdir()) == []


def test_a_missing_folder_is_made_and_only_the_outputs_are_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    metrics = tmp_path / "new" / "deeper" / "metrics.json"
    result = CliRunner().invoke(app, ["replay", AZURE, "--metrics-json", str(metrics)])
    assert result.exit_code == 0, result.output
    assert [path.name for path in metrics.parent.iterdir()] == ["metrics.json"]
