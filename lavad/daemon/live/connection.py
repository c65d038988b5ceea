"""aiokafka clients built from ``[kafka]`` settings (security passes through unchanged).

``client_options`` is the one place the secrets are unwrapped: everywhere
else they are ``SecretStr`` and print as ``**********``.

``check_security`` tells a TLS or SASL refusal from a broker outage before a
client starts: aiokafka only logs why a connection failed and then raises
"Unable to bootstrap", so a wrong CA would look like a broker that is down
and be retried for ever.
"""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context
from pydantic import SecretStr

from lavad.daemon.kafka_settings import KafkaSettings


def client_options(kafka: KafkaSettings, *, timeout: bool = True) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "client_id": kafka.client_id,
        "security_protocol": kafka.security_protocol,
    }
    if timeout:
        options["request_timeout_ms"] = kafka.request_timeout_ms
    if kafka.security_protocol.startswith("SASL"):
        options["sasl_mechanism"] = kafka.sasl_mechanism
        options["sasl_plain_username"] = kafka.sasl_plain_username
        options["sasl_plain_password"] = _reveal(kafka.sasl_plain_password)
    if kafka.security_protocol.endswith("SSL"):
        options["ssl_context"] = _ssl_context(kafka)
    return options


def _ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """The TLS context; ``SecurityRefusal`` naming the key when a file does not load."""
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(kafka, key)
        if path is not None and not path.is_file():
            raise SecurityRefusal(f"TLS: kafka.{key} {str(path)!r} is not a readable file")
    try:
        context: ssl.SSLContext = create_ssl_context(
            cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile else None,
            certfile=str(kafka.ssl_certfile) if kafka.ssl_certfile else None,
            keyfile=str(kafka.ssl_keyfile) if kafka.ssl_keyfile else None,
            password=_reveal(kafka.ssl_password),
        )
    except ssl.SSLError as exc:
        raise SecurityRefusal(
            f"TLS: kafka.ssl_cafile/ssl_certfile/ssl_keyfile do not load ({exc.reason or exc}): "
            "they must be PEM, the key must match the certificate, and an encrypted key "
            "needs its kafka.ssl_password"
        ) from None
    except OSError as exc:
        raise SecurityRefusal(f"TLS: a kafka.ssl_* file cannot be read: {exc}") from None
    return context


def _reveal(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


def decision_producer(kafka: KafkaSettings) -> AIOKafkaProducer:
    """acks=all: a decision counts as published once every in-sync replica has it."""
    return AIOKafkaProducer(
        acks="all",
        enable_idempotence=kafka.enable_idempotence or kafka.transactional_id is not None,
        transactional_id=kafka.transactional_id,
        linger_ms=2,
        max_batch_size=256 * 1024,
        **client_options(kafka),
    )


def input_consumer(kafka: KafkaSettings) -> AIOKafkaConsumer:
    # The range assignor gives one member the same partition number of every
    # (co-partitioned) input topic: all of a pool's events, whatever their topic.
    return AIOKafkaConsumer(
        group_id=kafka.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed" if kafka.transactional_id else "read_uncommitted",
        partition_assignment_strategy=(RangePartitionAssignor,),
        fetch_max_wait_ms=kafka.fetch_wait_ms,
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        # JoinGroup is answered only when the group settles (about 5 s on
        # Tansu), so the consumer keeps aiokafka's own 40 s request timeout;
        # the producer's shorter one is what notices a silent broker.
        **client_options(kafka, timeout=False),
    )


class SecurityRefusal(Exception):
    """The broker's TLS or SASL layer refused this configuration; retrying cannot help."""


# Verification codes that mean "the certificate does not name this host":
# X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_HOST_MISMATCH = frozenset({62, 64})
_SASL_REFUSED = (SaslAuthenticationFailed, UnsupportedSaslMechanismError, IllegalSaslStateError)


async def check_security(kafka: KafkaSettings) -> None:
    """Connect as the clients will; raise ``SecurityRefusal`` if TLS or SASL refuses.

    Each bootstrap server is tried until one completes the TLS handshake and
    the SASL exchange. One that does not answer (refused, reset, closed
    mid-handshake, timed out) is passed over: that is an outage, which the
    caller retries. Nothing is checked for PLAINTEXT, which has neither.
    """
    if kafka.security_protocol == "PLAINTEXT":
        return
    sasl = kafka.security_protocol.startswith("SASL")
    for host, port, _family in collect_hosts(kafka.bootstrap_servers, randomize=False):
        if not await _answers(kafka, host, port, sasl=False):
            continue
        if not sasl:
            return
        # Some brokers (Tansu) close the connection on a mechanism they do
        # not offer instead of answering with an error. The same broker
        # answered a moment ago without SASL, so a connection closed during
        # the SASL exchange, twice, is a refusal, not an outage.
        for _attempt in range(2):
            if await _answers(kafka, host, port, sasl=True):
                return
        raise SecurityRefusal(
            _sasl_refused(kafka, host, port, "the broker closed the connection during the exchange")
        )


async def _answers(kafka: KafkaSettings, host: str, port: int, *, sasl: bool) -> bool:
    """Whether one connection (TLS if configured, then SASL if ``sasl``) gets an answer.

    False for an outage; ``SecurityRefusal`` for a refusal.
    """
    options = client_options(kafka)
    protocol = kafka.security_protocol
    if not sasl:
        protocol = "SSL" if protocol.endswith("SSL") else "PLAINTEXT"
    try:
        conn = await create_conn(
            host,
            port,
            client_id=kafka.client_id,
            request_timeout_ms=kafka.request_timeout_ms,
            ssl_context=options.get("ssl_context"),
            security_protocol=protocol,
            sasl_mechanism=options.get("sasl_mechanism"),
            sasl_plain_username=options.get("sasl_plain_username"),
            sasl_plain_password=options.get("sasl_plain_password"),
        )
    except ssl.SSLCertVerificationError as exc:
        raise SecurityRefusal(_certificate_refused(kafka, host, port, exc)) from None
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError):
        return False  # the connection dropped: nothing was refused yet
    except ssl.SSLError as exc:
        raise SecurityRefusal(
            f"TLS handshake with {host}:{port} failed: {exc.reason or exc} "
            f"(kafka.security_protocol = {kafka.security_protocol}: does this "
            "listener speak TLS, and with a version and ciphers in common?)"
        ) from None
    except _SASL_REFUSED as exc:
        raise SecurityRefusal(_sasl_refused(kafka, host, port, repr(exc))) from None
    except (KeyError, ValueError) as exc:
        # aiokafka's SCRAM client raises these on a server-final message
        # that carries an error instead of the server's signature, or a
        # wrong signature: the broker did not accept these credentials.
        if not sasl:
            raise
        raise SecurityRefusal(
            _sasl_refused(kafka, host, port, f"the SCRAM exchange failed ({exc!r})")
        ) from None
    except (OSError, KafkaError, TimeoutError):
        return False
    conn.close()
    return True


def _certificate_refused(
    kafka: KafkaSettings, host: str, port: int, exc: ssl.SSLCertVerificationError
) -> str:
    reason = str(exc.verify_message).rstrip(".")
    cause = f"TLS: the certificate of {host}:{port} was refused ({reason})"
    if exc.verify_code in _HOST_MISMATCH:
        return (
            f"{cause}: kafka.bootstrap_servers must name the broker as its certificate does, "
            "and the broker must advertise such a name"
        )
    cafile = kafka.ssl_cafile if kafka.ssl_cafile is not None else "the system's CAs"
    return f"{cause}: kafka.ssl_cafile ({cafile}) must hold the CA that signed it"


def _sasl_refused(kafka: KafkaSettings, host: str, port: int, cause: str) -> str:
    # The user name helps whoever reads this; the password never appears.
    return (
        f"SASL: {host}:{port} refused {kafka.sasl_mechanism} authentication as "
        f"{kafka.sasl_plain_username!r}: {cause} (check kafka.sasl_mechanism, "
        "kafka.sasl_plain_username and the password)"
    )
