"""A broker behind TLS (and one that demands SASL) for the security tests.

Tansu, the embedded broker, documents ``--cert`` but serves plain Kafka on
its listener whatever is given, so TLS is terminated in front of it by
Debian's stunnel4 (``make test`` installs it), the way a TLS proxy or a
load balancer fronts a broker: Tansu listens in the clear on loopback and
advertises the terminator's address, so every connection a client makes
after bootstrapping goes through TLS too. The terminator also demands a
client certificate, so the clients' ``ssl_certfile``/``ssl_keyfile`` (an
encrypted key) are exercised as well.

Tansu does authenticate with SASL SCRAM itself (``--authentication``), but
its users can only be created by an authenticated client, and its memory
storage starts empty: the broker can only be shown refusing credentials.

The certificates are made for each test run with the openssl command.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest

from lavad.streams.kafka.embedded import broker_binary, free_port

# Set by .ci/run: there the tests must run, so a missing terminator fails them.
REQUIRE_ENV = "CI_REQUIRE_STUNNEL"
# Looked for in everything lavad prints: the client key's password, and a
# SASL password the broker does not know.
KEY_PASSWORD = "k3y-pass-Zq81"
SASL_PASSWORD = "sasl-pass-Wx42"


def needed_binary(*names: str) -> str:
    """The first of ``names`` on PATH; a skip (or a failure in CI) when there is none."""
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    message = (
        f"{' or '.join(names)} not found: `make test` installs it (apt-get install stunnel4 "
        "openssl, as root or with sudo)"
    )
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(message)
    pytest.skip(message)


@dataclass(frozen=True, slots=True)
class Pki:
    """A test CA, the broker's certificate (for ``localhost`` only), a client's, a stranger CA."""

    ca: Path
    other_ca: Path
    broker_cert: Path
    broker_key: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD
    key_password_file: Path


def make_pki(folder: Path) -> Pki:
    openssl = needed_binary("openssl")
    folder.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
    for ca in ("ca", "other-ca"):
        run("req", "-x509", *ec, "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
            "-days", "2", "-subj", f"/CN=lavad test {ca}")  # fmt: skip
    # The broker's name is localhost and nothing else: reaching it as
    # 127.0.0.1 is the wrong host name.
    (folder / "broker.ext").write_text("subjectAltName=DNS:localhost\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    run("req", *ec, "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", "/CN=localhost")  # fmt: skip
    run("req", *ec, "-keyout", "client.key", "-passout", f"pass:{KEY_PASSWORD}",
        "-out", "client.csr", "-subj", "/CN=lavad")  # fmt: skip
    for name in ("broker", "client"):
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
            "-extfile", f"{name}.ext")  # fmt: skip
    password_file = folder / "client.key.password"
    password_file.write_text(KEY_PASSWORD + "\n")
    return Pki(
        ca=folder / "ca.pem",
        other_ca=folder / "other-ca.pem",
        broker_cert=folder / "broker.pem",
        broker_key=folder / "broker.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        key_password_file=password_file,
    )


def _wait_listening(process: subprocess.Popen[bytes], port: int, what: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on port {port} in 20 s") from None
            time.sleep(0.05)
        else:
            return


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_tansu(
    port: int, advertised: str, log: Path, *, authentication: bool = False
) -> subprocess.Popen[bytes]:
    """Tansu in the clear on ``127.0.0.1:port``, telling clients to come back at ``advertised``."""
    command = [
        broker_binary(),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{port}",
        "--advertised-listener-url",
        f"tcp://{advertised}",
        "--storage-engine",
        "memory://tansu/",
    ]
    if authentication:
        command.append("--authentication")
    with log.open("ab") as output:
        process = subprocess.Popen(command, stdout=output, stderr=output, stdin=subprocess.DEVNULL)
    _wait_listening(process, port, "the broker")
    return process


class TlsBroker:
    """Tansu behind stunnel on loopback: clients reach ``localhost:<tls port>`` over TLS."""

    def __init__(self, folder: Path, pki: Pki, *, start_broker: bool = True) -> None:
        stunnel = needed_binary("stunnel4", "stunnel")
        self.folder = folder
        self.plain_port = free_port()
        self.tls_port = free_port()
        self.broker: subprocess.Popen[bytes] | None = None
        config = folder / "stunnel.conf"
        config.write_text(
            "foreground = yes\n"
            "pid =\n"
            "syslog = no\n"
            "debug = warning\n"
            "[kafka]\n"
            f"accept = 127.0.0.1:{self.tls_port}\n"
            f"connect = 127.0.0.1:{self.plain_port}\n"
            f"cert = {pki.broker_cert}\n"
            f"key = {pki.broker_key}\n"
            # Clients must present a certificate signed by the test CA.
            f"CAfile = {pki.ca}\n"
            "verifyChain = yes\n"
        )
        with (folder / "stunnel.log").open("ab") as output:
            self.terminator = subprocess.Popen(
                [stunnel, str(config)], stdout=output, stderr=output, stdin=subprocess.DEVNULL
            )
        try:
            _wait_listening(self.terminator, self.tls_port, "stunnel")
            if start_broker:
                self.start_broker()
        except BaseException:
            self.close()
            raise

    @property
    def bootstrap_servers(self) -> str:
        return f"localhost:{self.tls_port}"

    def start_broker(self) -> None:
        self.broker = start_tansu(
            self.plain_port, self.bootstrap_servers, self.folder / "tansu.log"
        )

    def close(self) -> None:
        _stop(self.broker)
        _stop(self.terminator)

    def __enter__(self) -> TlsBroker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def tls_env(pki: Pki, bootstrap: str, *, ca: Path | None = None) -> dict[str, str]:
    """LAVAD_* variables for TLS with a client certificate (its key's password from a file)."""
    return {
        "LAVAD_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "LAVAD_KAFKA__SECURITY_PROTOCOL": "SSL",
        "LAVAD_KAFKA__SSL_CAFILE": str(ca or pki.ca),
        "LAVAD_KAFKA__SSL_CERTFILE": str(pki.client_cert),
        "LAVAD_KAFKA__SSL_KEYFILE": str(pki.client_key),
        "LAVAD_KAFKA__SSL_PASSWORD_FILE": str(pki.key_password_file),
    }
