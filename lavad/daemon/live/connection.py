"""aiokafka clients built from ``[kafka]`` settings (security passes through unchanged).

``client_options`` is the one place the secrets are unwrapped: everywhere
else they are ``SecretStr`` and print as ``**********``.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.helpers import create_ssl_context
from pydantic import SecretStr

from lavad.daemon.settings import KafkaSettings


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
        options["ssl_context"] = create_ssl_context(
            cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile else None,
            certfile=str(kafka.ssl_certfile) if kafka.ssl_certfile else None,
            keyfile=str(kafka.ssl_keyfile) if kafka.ssl_keyfile else None,
            password=_reveal(kafka.ssl_password),
        )
    return options


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
