"""TLS and SASL against a real broker: the live commands over TLS, and refusals at start-up.

TLS is served by stunnel in front of the embedded broker (tls_support.py
says why); SASL by the broker itself. A refusal must stop a command at
once, naming the TLS or SASL cause, with exit status 2; an outage must
still be retried; no secret may appear in anything lavad prints.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from live_support import AZURE_SLICE, DaemonProcess, live_settings, replay_in_process
from tls_support import (
    KEY_PASSWORD,
    SASL_PASSWORD,
    Pki,
    TlsBroker,
    make_pki,
    start_tansu,
    tls_env,
)

from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.kafka.embedded import free_port

pytestmark = pytest.mark.kafka

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(PROJECT_ROOT / "config" / "lavad.toml")
LAVAD = [sys.executable, "-c", "from lavad.daemon.cli import main; main()"]
RECORDS = 2_000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def lavad(
    *args: str, env: dict[str, str], cwd: Path, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LAVAD, *args, "--config", CONFIG],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def flat(text: str) -> str:
    """The text with its line breaks (the console wraps long messages) as single spaces."""
    return " ".join(text.split())


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert KEY_PASSWORD not in text
        assert SASL_PASSWORD not in text


async def test_topics_produce_run_and_tail_over_tls_decide_as_the_replay_does(
    pki: Pki, tmp_path: Path
) -> None:
    events = [
        item
        for item in itertools.islice(open_trace(AZURE_SLICE, seed=0).events(), RECORDS)
        if not isinstance(item, BadRecord)
    ]
    assert len(events) == RECORDS
    expected = replay_in_process(live_settings("unused:9092", tmp_path / "unused"), events)[
        "default"
    ]
    with TlsBroker(tmp_path, pki) as tls:
        env = tls_env(pki, tls.bootstrap_servers)
        made = lavad("topics", "create", env=env, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        assert "lavad.placements: created" in made.stdout
        sent = lavad("produce", str(AZURE_SLICE), "--limit", str(RECORDS), env=env, cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        assert f"published {RECORDS} records" in sent.stdout
        daemon = DaemonProcess(
            tls.bootstrap_servers, tmp_path / "snapshots", tmp_path / "daemon.log", **env
        )
        try:
            # Follows the topic until every expected placement is there.
            tail = lavad(
                "tail", "lavad.placements", "--limit", str(len(expected)), env=env, cwd=tmp_path
            )
        finally:
            stopped = daemon.stop()
    daemon_log = (tmp_path / "daemon.log").read_text()
    assert stopped == 0, daemon_log
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.encode().splitlines() == expected
    events_logged = [orjson.loads(line)["event"] for line in daemon_log.splitlines()]
    assert "connected" in events_logged
    assert_no_secret(made.stdout, made.stderr, sent.stdout, sent.stderr, tail.stderr, daemon_log)


@pytest.mark.parametrize("refused", ["another CA", "another host name"])
def test_run_and_topics_create_refuse_a_certificate_they_cannot_trust_at_once(
    pki: Pki, tmp_path: Path, refused: str
) -> None:
    with TlsBroker(tmp_path, pki) as tls:
        if refused == "another CA":
            env = tls_env(pki, tls.bootstrap_servers, ca=pki.other_ca)
            cause = "must hold the CA that signed it"
        else:
            # The certificate names localhost only.
            env = tls_env(pki, f"127.0.0.1:{tls.tls_port}")
            cause = "must name the broker as its certificate does"
        env["LAVAD_HTTP__PORT"] = str(free_port())
        env["LAVAD_LIVE__SNAPSHOT_DIR"] = str(tmp_path / "snapshots")
        run = lavad("run", env=env, cwd=tmp_path)
        made = lavad("topics", "create", env=env, cwd=tmp_path)
    for result in (run, made):
        assert result.returncode == 2, result.stderr
        assert "TLS: the certificate of" in flat(result.stderr)
        assert cause in flat(result.stderr)
        assert_no_secret(result.stdout, result.stderr)
    assert "broker unreachable" not in run.stderr


def test_the_federation_processes_refuse_a_certificate_they_cannot_trust_at_once(
    pki: Pki, tmp_path: Path
) -> None:
    """The pool owner, the global scheduler and their topics command check TLS first,
    as ``lavad run`` does: a refusal is not retried as an outage."""
    with TlsBroker(tmp_path, pki) as tls:
        config = tmp_path / "federation.toml"
        config.write_text(
            "[kafka]\n"
            f'bootstrap_servers = "{tls.bootstrap_servers}"\n'
            'security_protocol = "SSL"\n'
            f'ssl_cafile = "{pki.other_ca}"\n'
            f'ssl_certfile = "{pki.client_cert}"\n'
            f'ssl_keyfile = "{pki.client_key}"\n'
            f'ssl_password = "{KEY_PASSWORD}"\n'
        )
        federation = [*LAVAD, "federation"]
        commands = (
            [*federation, "owner", "--instance", "o1", "--config", str(config)],
            [*federation, "scheduler", "--gm", "0", "--config", str(config)],
            [*federation, "topics", str(config)],
        )
        results = [
            subprocess.run(
                command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
            )
            for command in commands
        ]
    for result in results:
        assert result.returncode == 2, result.stderr
        assert "TLS: the certificate of" in flat(result.stderr)
        assert "must hold the CA that signed it" in flat(result.stderr)
        assert_no_secret(result.stdout, result.stderr)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_run_refuses_credentials_the_broker_rejects_at_once_and_never_logs_the_password(
    tmp_path: Path, mechanism: str
) -> None:
    port = free_port()
    broker = start_tansu(port, f"127.0.0.1:{port}", tmp_path / "tansu.log", authentication=True)
    try:
        env = {
            "LAVAD_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
            "LAVAD_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "LAVAD_KAFKA__SASL_MECHANISM": mechanism,
            "LAVAD_KAFKA__SASL_PLAIN_USERNAME": "lavad",
            "LAVAD_KAFKA__SASL_PLAIN_PASSWORD": SASL_PASSWORD,
            "LAVAD_HTTP__PORT": str(free_port()),
            "LAVAD_LIVE__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
        }
        run = lavad("run", env=env, cwd=tmp_path)
    finally:
        broker.terminate()
        broker.wait()
    assert run.returncode == 2, run.stderr
    refusal = f"SASL: 127.0.0.1:{port} refused {mechanism} authentication as 'lavad'"
    assert refusal in flat(run.stderr)
    assert "broker unreachable" not in run.stderr
    assert_no_secret(run.stdout, run.stderr)


def test_run_over_tls_retries_while_the_broker_behind_the_terminator_is_down(
    pki: Pki, tmp_path: Path
) -> None:
    """TLS accepted, then the connection dropped: an outage, retried until the broker is up.

    The broker comes up without topics, so the daemon, once through TLS,
    stops on the first thing it finds missing: that says it got there.
    """
    log = tmp_path / "daemon.log"
    with TlsBroker(tmp_path, pki, start_broker=False) as tls:
        env = tls_env(pki, tls.bootstrap_servers)
        with log.open("wb") as output:
            process = subprocess.Popen(
                [*LAVAD, "run", "--config", CONFIG],
                env={
                    **os.environ,
                    **env,
                    "LAVAD_HTTP__PORT": str(free_port()),
                    "LAVAD_LIVE__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
                    "LAVAD_KAFKA__REQUEST_TIMEOUT_MS": "3000",
                },
                cwd=tmp_path,
                stdout=output,
                stderr=output,
            )
        try:
            _wait_for_events(process, log, "broker unreachable at start", count=2)
            tls.start_broker()
            process.wait(timeout=90)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = log.read_text()
    assert process.returncode == 2, text
    assert "input topic 'lavad.vm-events' does not exist" in flat(text)
    assert "TLS" not in text and "SASL" not in text
    assert_no_secret(text)


def _wait_for_events(
    process: subprocess.Popen[bytes], log: Path, event: str, *, count: int
) -> None:
    """Until the daemon has logged ``event`` ``count`` times (it must stay up meanwhile)."""
    deadline = time.monotonic() + 90
    while True:
        lines = [
            line for line in log.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")
        ]
        seen = sum(1 for line in lines if orjson.loads(line).get("event") == event)
        if seen >= count:
            return
        assert process.poll() is None, (
            f"the daemon exited ({process.returncode}): {log.read_text()}"
        )
        assert time.monotonic() < deadline, f"{event!r} logged {seen} times, not {count}"
        time.sleep(0.2)


@pytest.mark.parametrize("wrong", ["key password", "missing CA file"])
def test_run_refuses_tls_files_that_do_not_load_naming_the_setting(
    pki: Pki, tmp_path: Path, wrong: str
) -> None:
    # Nothing listens there: the files are refused before any connection.
    env = tls_env(pki, f"localhost:{free_port()}")
    if wrong == "key password":
        env.pop("LAVAD_KAFKA__SSL_PASSWORD_FILE")
        env["LAVAD_KAFKA__SSL_PASSWORD"] = SASL_PASSWORD
        cause = "an encrypted key needs its kafka.ssl_password"
    else:
        env["LAVAD_KAFKA__SSL_CAFILE"] = str(tmp_path / "absent.pem")
        cause = "kafka.ssl_cafile"
    env["LAVAD_HTTP__PORT"] = str(free_port())
    env["LAVAD_LIVE__SNAPSHOT_DIR"] = str(tmp_path / "snapshots")
    run = lavad("run", env=env, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert cause in flat(run.stderr)
    assert "Traceback" not in run.stderr
    assert_no_secret(run.stdout, run.stderr)
