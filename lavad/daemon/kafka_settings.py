"""The broker connection's settings (``[kafka]``): the daemon's and the federation's."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from lavad.daemon.config_file import Section
from lavad.streams.kafka.deadletter import DEFAULT_MAX_BYTES


class KafkaSettings(Section):
    """The broker connection; security options pass through to aiokafka unchanged."""

    bootstrap_servers: str = Field(default="127.0.0.1:9092", min_length=1)
    client_id: str = "lavad"
    group_id: str = Field(default="lavad", min_length=1)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"] = (
        "PLAIN"
    )
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    sasl_plain_password_file: Path | None = Field(
        default=None, description="read sasl_plain_password from this file (a mounted secret)"
    )
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = Field(
        default=None, description="the password of an encrypted ssl_keyfile"
    )
    ssl_password_file: Path | None = Field(
        default=None, description="read ssl_password from this file (a mounted secret)"
    )
    # Off by default: the embedded Tansu broker answers InitProducerId with an
    # error, so neither works against it; on a real Kafka cluster they may.
    enable_idempotence: bool = False
    transactional_id: str | None = Field(
        default=None,
        description="publish each batch's decisions and its offsets in one transaction",
    )
    request_timeout_ms: int = Field(default=10_000, ge=1000)
    # How soon the group notices a crashed instance and hands its partitions on.
    session_timeout_ms: int = Field(default=10_000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3_000, ge=100)
    max_batch_records: int = Field(default=2_000, ge=1)
    fetch_wait_ms: int = Field(default=20, ge=0)
    dead_letter_max_bytes: int = Field(
        default=DEFAULT_MAX_BYTES,
        ge=4096,
        description=(
            "a dead letter's key, value and headers past this are cut to fit, with the header"
            " lavad.truncated giving the original sizes: keep it under the dead-letter topic's"
            " max.message.bytes (1,048,588 by default), which refuses a larger record on every"
            " retry"
        ),
    )
