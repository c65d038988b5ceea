"""`lavad config check` accepts and refuses exactly what `lavad run` does, and prints no secret."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

import lavad.daemon.live.cli as live_cli
from lavad.daemon.cli import app
from lavad.daemon.settings import LogSettings, Settings

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "lavad.toml"
LAVAD = ROOT / ".venv" / "bin" / "lavad"
SECRET = "s3cr3t-Pa55word"
SASL = {
    "LAVAD_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "LAVAD_KAFKA__SASL_PLAIN_USERNAME": "lavad",
}


class _Daemon:
    """Stands in for the live daemon: `lavad run` got this far, so it accepted the settings."""

    started: ClassVar[list[Settings]] = []

    def __init__(self, settings: Settings, engine_config: object) -> None:
        self.settings = settings

    async def run(self, stop: asyncio.Event) -> None:
        _Daemon.started.append(self.settings)


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    _Daemon.started = []
    monkeypatch.setattr(live_cli, "LiveDaemon", _Daemon)

    def quiet(settings: LogSettings) -> None:
        pass  # structlog is global; these runs need no logging

    monkeypatch.setattr(live_cli, "configure_logging", quiet)
    return _Daemon.started


# (environment, extra TOML appended to the default file, the key refused or
# None when accepted). Before, config check accepted the oracles that run
# refused, and both accepted the unknown variables.
CASES: list[tuple[dict[str, str], str, str | None]] = [
    ({}, "", None),
    ({"LAVAD_PLACEMENT__POLICY": "firstfit"}, "", None),
    ({"LAVAD_PLACEMENT__POLICY": "las-oracle"}, "", "placement.policy"),
    ({"LAVAD_PLACEMENT__POLICY": "la-binary-oracle"}, "", "placement.policy"),
    ({"LAVAD_MIGRATIONS__LIFETIMES": "oracle"}, "", "migrations.lifetimes"),
    ({}, "[policies.lava-oracle]\nrecycle_above = 0.8\n", None),
    ({"LAVAD_HOSTZ__CORES": "8"}, "", "LAVAD_HOSTZ__CORES"),
    ({"LAVAD_KAFKA_BOOTSTRAP_SERVERS": "b:9092"}, "", "LAVAD_KAFKA_BOOTSTRAP_SERVERS"),
    ({"LAVAD_KAFKA__BOOTSTRAP_SERVER": "b:9092"}, "", "LAVAD_KAFKA__BOOTSTRAP_SERVER"),
    ({"LAVAD_HOSTS__CORES": "-1"}, "", "hosts.cores"),
    ({"LAVAD_POOLS__MAX_POOLS": "0"}, "", "pools.max_pools"),
    (SASL, "", "kafka.sasl_plain_username"),
    ({**SASL, "LAVAD_KAFKA__SASL_PLAIN_PASSWORD": SECRET}, "", None),
    (
        {**SASL, "LAVAD_KAFKA__SASL_PLAIN_PASSWORD_FILE": "/nonexistent/pw"},
        "",
        "kafka.sasl_plain_password_file",
    ),
]


def _flat(output: str) -> str:
    # Rich wraps long lines; the message is compared without the wrapping.
    return " ".join(output.split())


@pytest.mark.parametrize(("env", "extra", "key"), CASES)
def test_config_check_and_run_agree(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    no_broker: list[Settings],
    env: dict[str, str],
    extra: str,
    key: str | None,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "lavad.toml"
    config.write_text(DEFAULT.read_text() + "\n" + extra)
    check = CliRunner().invoke(app, ["config", "check", str(config)])
    run = CliRunner().invoke(app, ["run", "--config", str(config)])
    assert (check.exit_code == 0) == (key is None), check.output
    assert (run.exit_code == 0) == (key is None), run.output
    assert len(no_broker) == (1 if key is None else 0)
    if key is not None:
        assert check.exit_code == run.exit_code == 2
        refused = [_flat(r.output).split("configuration error at ", 1)[-1] for r in (check, run)]
        assert refused[0].startswith(key), refused
        # The same key and reason, word for word.
        assert refused[0] == refused[1]
    for result in (check, run):
        assert SECRET not in result.output


def test_config_check_for_a_replay_accepts_the_oracles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAVAD_PLACEMENT__POLICY", "las-oracle")
    assert CliRunner().invoke(app, ["config", "check", str(DEFAULT)]).exit_code == 2
    replay = CliRunner().invoke(app, ["config", "check", "--replay", str(DEFAULT)])
    assert replay.exit_code == 0, replay.output
    assert json.loads(replay.stdout)["placement"]["policy"] == "las-oracle"


@pytest.mark.parametrize("source", ["environment", "file"])
def test_config_check_never_prints_a_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str
) -> None:
    for name, value in SASL.items():
        monkeypatch.setenv(name, value)
    if source == "environment":
        monkeypatch.setenv("LAVAD_KAFKA__SASL_PLAIN_PASSWORD", SECRET)
    else:
        secret_file = tmp_path / "kafka-password"
        secret_file.write_text(SECRET + "\n")
        monkeypatch.setenv("LAVAD_KAFKA__SASL_PLAIN_PASSWORD_FILE", str(secret_file))
    result = CliRunner().invoke(app, ["config", "check", str(DEFAULT)])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    assert json.loads(result.stdout)["kafka"]["sasl_plain_password"] == "**********"


def test_run_start_up_logs_no_secret(tmp_path: Path) -> None:
    """`lavad run` with a secret and no broker: it logs its start-up, and no secret."""
    secret_file = tmp_path / "key-password"
    secret_file.write_text(SECRET + "-ssl\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.upper().startswith("LAVAD_")},
        **SASL,
        "LAVAD_KAFKA__SASL_PLAIN_PASSWORD": SECRET,
        "LAVAD_KAFKA__SSL_PASSWORD_FILE": str(secret_file),
        # Nothing listens on port 1: the daemon logs its retries.
        "LAVAD_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "LAVAD_HTTP__PORT": "0",
        "LAVAD_LIVE__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
        "LAVAD_LOG__LEVEL": "debug",
    }
    log = tmp_path / "stderr.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(LAVAD), "run", "--config", str(DEFAULT)],
            env=env,
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            # Start-up is over once it logs its first retry (bounded by the test).
            deadline = time.monotonic() + 60.0
            while b"broker unreachable at start" not in log.read_bytes():
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    logged = log.read_bytes()
    assert b"http serving" in logged
    assert SECRET.encode() not in logged
