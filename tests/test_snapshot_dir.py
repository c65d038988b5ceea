"""A snapshot directory that cannot be made or written stops ``lavad run`` at start-up
with the setting and the reason (before: a traceback from ``mkdir``; a directory
that could not be written would have failed only at the first snapshot, and the
daemon run on with nothing to restart from)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import lavad.daemon.live.cli as live_cli
from lavad.daemon.cli import app
from lavad.daemon.live.snapshots import SnapshotError, SnapshotStore
from lavad.daemon.settings import LogSettings

ROOT = Path(__file__).resolve().parents[1]


def test_a_usable_directory_is_made_and_left_as_it_was(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", "lavad")
    assert store.directory.is_dir()
    # The write probe is gone.
    assert list(store.directory.iterdir()) == []


def test_a_directory_under_a_file_is_refused_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(
        SnapshotError, match=r"^live\.snapshot_dir .*a-file/snapshots.*Not a directory"
    ):
        SnapshotStore(tmp_path / "a-file" / "snapshots", "lavad")


def test_lavad_run_stops_at_start_up_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def quiet(settings: LogSettings) -> None:
        pass  # structlog is global; this run needs no logging

    monkeypatch.setattr(live_cli, "configure_logging", quiet)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("LAVAD_LIVE__SNAPSHOT_DIR", str(tmp_path / "a-file" / "snapshots"))
    # Nothing listens on port 9: the refusal must come before any connection.
    monkeypatch.setenv("LAVAD_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    run = CliRunner().invoke(app, ["run", "--config", str(ROOT / "config" / "lavad.toml")])
    assert run.exit_code == 2, run.output
    flat = " ".join(run.output.split())
    assert "live.snapshot_dir" in flat
    assert "cannot hold snapshots (Not a directory)" in flat
    assert "Traceback" not in run.output
