"""`lavad federation`: its configuration checked at start-up (a bad key exits 2 with the
key and the reason), and the daemon's own commands never load the federation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lavad.daemon.cli import app
from lavad.daemon.config_file import ConfigError
from lavad.federation.settings import load_federation_settings


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "federation.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_and_a_file_that_sets_some_keys(tmp_path: Path) -> None:
    settings = load_federation_settings(None)
    # the federation's failover defaults, not lavad's 10 s session
    assert (settings.kafka.session_timeout_ms, settings.kafka.heartbeat_interval_ms) == (4000, 500)
    path = _file(
        tmp_path,
        '[kafka]\nbootstrap_servers = "k:9"\nsession_timeout_ms = 6000\n'
        "[federation]\npools = 3\n[federation.scheduler]\nstate_lag_s = 2.5\n",
    )
    settings = load_federation_settings(path)
    assert settings.kafka.bootstrap_servers == "k:9"
    assert (settings.kafka.session_timeout_ms, settings.kafka.heartbeat_interval_ms) == (6000, 500)
    assert settings.federation.pools == 3 and settings.federation.scheduler.state_lag_s == 2.5
    assert settings.federation.hosts_per_pool == 50


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[federation]\nhostz = 3\n", "federation.hostz", "Extra inputs"),
        (
            "[federation.owner]\nsnapshot_every = 0\n",
            "federation.owner.snapshot_every",
            "greater than or equal to 1",
        ),
        ("[federation]\npools = 'two'\n", "federation.pools", "valid integer"),
        ('[kafka]\ngroup_id = "x"\n', "kafka.group_id", "not used by the federation"),
        ("[kafka]\nheartbeat_interval_ms = 2000\n", "kafka.heartbeat_interval_ms", "a third"),
        ("[federation\n", "federation.toml", "not valid TOML"),
        ("[federation]\nshares = [0.5]\n", "federation.shares", "1 shares for 2 tenants"),
        ("[federation]\nshares = [0.7, 0.5]\n", "federation.shares", "sum to 1.2000 > 1"),
    ],
)
def test_a_bad_key_is_refused_with_the_key_and_the_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_federation_settings(_file(tmp_path, text))
    assert caught.value.key.endswith(key) and reason in caught.value.reason, caught.value


def test_a_wrong_secret_is_named_but_not_shown(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_federation_settings(_file(tmp_path, "[kafka]\nsasl_plain_password = 12345678\n"))
    assert caught.value.key == "kafka.sasl_plain_password"
    assert "12345678" not in str(caught.value)


def test_the_commands_exit_2_with_the_key_before_connecting(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = _file(tmp_path, "[federation.scheduler]\nmetrics_port = 70000\n")
    for args in (
        ["federation", "owner", "--instance", "a", "--config", str(bad)],
        ["federation", "scheduler", "--gm", "0", "--config", str(bad)],
        ["federation", "check", str(bad)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "federation.scheduler.metrics_port" in result.output.replace("\n", "")
    good = _file(tmp_path, "[federation]\nschedulers = 2\n")
    result = runner.invoke(app, ["federation", "scheduler", "--gm", "2", "--config", str(good)])
    assert result.exit_code == 2 and "--gm: 2 is not a scheduler index" in result.output
    result = runner.invoke(app, ["federation", "check", str(good)])
    assert result.exit_code == 0 and '"schedulers": 2' in result.output
    assert "group_id" not in result.output  # a key the federation does not read is not shown


def test_lavad_run_does_not_load_the_federation() -> None:
    # the import graph is federation -> daemon; `lavad federation` imports it inside
    # the command, so the daemon's own commands never have it in memory
    probe = (
        "import sys; sys.argv = ['lavad', 'run', '--help']; import lavad.daemon.cli; "
        "print(sorted(m for m in sys.modules if m.startswith('lavad.federation')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_the_shipped_example_file_passes_the_check() -> None:
    # config/federation.toml is what the README tells a new user to start from.
    path = Path(__file__).resolve().parent.parent / "config" / "federation.toml"
    settings = load_federation_settings(path)
    assert settings.federation.shares == (0.10, 0.25, 0.15, 0.50)
    assert settings.federation.tenants == 4
