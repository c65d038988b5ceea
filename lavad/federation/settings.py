"""The federation's configuration: one TOML file read by `lavad federation owner` and
`lavad federation scheduler` alike, checked whole at start-up (an unknown or bad key
fails with the key and the reason, before any connection is made).

```toml
[kafka]                      # the broker connection, as lavad's own [kafka]
bootstrap_servers = "kafka:9092"

[federation]
pools = 2                    # launch partition p is pool p
hosts_per_pool = 50
schedulers = 2               # global-scheduler indices 0 .. schedulers-1
tenants = 2                  # tenant queue t is requests partition t
shares = [0.5, 0.5]          # optional: fair shares per tenant (Algorithm 2's preemptions)

[federation.owner]
snapshot_every = 20          # launches between snapshots of a pool
snapshot_chunk_bytes = 524288  # a snapshot goes out in records of at most this size

[federation.scheduler]
state_lag_s = 0.0            # read the state topic at most this often
metrics_port = 0             # Prometheus /metrics (0: off)
```

Which process is which (an owner's instance name, a scheduler's index) is given on
the command line, not in the file, so one file serves every process.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from lavad.daemon.config_file import ConfigError, Section, read_config_file, validate_config
from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.fairness import Shares

# Keys of [kafka] that lavad's daemon reads and the federation's processes do not:
# set in a federation file they would be ignored, so they are refused instead.
UNUSED_KAFKA_KEYS = {
    "group_id": "the federation's processes use their own groups (owners, schedulers)",
    "transactional_id": "the federation does not publish in transactions",
    "enable_idempotence": "the federation names its launches instead (task, attempt)",
    "sasl_plain_password_file": "give kafka.sasl_plain_password (files: lavad run only)",
    "ssl_password_file": "give kafka.ssl_password (files: lavad run only)",
    "max_batch_records": "the federation's batch sizes are its own",
    "fetch_wait_ms": "the federation's fetch waits are its own",
}

# A crashed member is noticed within the session timeout, and the failover time is
# that plus a rebalance, so the federation's default is shorter than lavad's 10 s.
FEDERATION_KAFKA = KafkaSettings(session_timeout_ms=4000, heartbeat_interval_ms=500)


class OwnerSettings(Section):
    snapshot_every: int = Field(default=20, ge=1, description="launches between pool snapshots")
    # Below the broker's message.max.bytes (1 MB by default), with room for the record's own.
    snapshot_chunk_bytes: int = Field(
        default=512 * 1024, ge=1024, le=64 * 1024 * 1024, description="largest snapshot record"
    )


class SchedulerSettings(Section):
    state_lag_s: float = Field(default=0.0, ge=0, description="read the state topic this often")
    metrics_port: int = Field(default=0, ge=0, le=65535, description="/metrics here (0: off)")


class FederationSection(Section):
    pools: int = Field(default=2, ge=1, le=10_000)
    hosts_per_pool: int = Field(default=50, ge=1, le=1_000_000)
    schedulers: int = Field(default=2, ge=1, le=1_000)
    tenants: int = Field(default=2, ge=1, le=100_000)
    shares: tuple[float, ...] | None = Field(
        default=None, description="one share per tenant: schedulers preempt (Algorithm 2)"
    )
    owner: OwnerSettings = OwnerSettings()
    scheduler: SchedulerSettings = SchedulerSettings()


class FederationSettings(Section):
    kafka: KafkaSettings = FEDERATION_KAFKA
    federation: FederationSection = FederationSection()


def load_federation_settings(path: Path | None) -> FederationSettings:
    """Read ``path`` (None: every default); raise ``ConfigError`` with the key and reason."""
    values = {} if path is None else read_config_file(path)
    kafka = values.get("kafka")
    if isinstance(kafka, dict):
        for key, why in UNUSED_KAFKA_KEYS.items():
            if key in kafka:
                raise ConfigError(f"kafka.{key}", f"not used by the federation: {why}")
        # the federation's defaults under what the file gives
        defaults = FEDERATION_KAFKA.model_dump(exclude_unset=False)
        values["kafka"] = {
            "session_timeout_ms": defaults["session_timeout_ms"],
            "heartbeat_interval_ms": defaults["heartbeat_interval_ms"],
            **kafka,
        }
    settings = validate_config(FederationSettings, values)
    shares = settings.federation.shares
    if shares is not None:
        if len(shares) != settings.federation.tenants:
            raise ConfigError(
                "federation.shares",
                f"{len(shares)} shares for {settings.federation.tenants} tenants: one each",
            )
        try:
            Shares(shares)
        except ValueError as exc:
            raise ConfigError("federation.shares", str(exc)) from None
    kafka_settings = settings.kafka
    if kafka_settings.heartbeat_interval_ms * 3 > kafka_settings.session_timeout_ms:
        raise ConfigError(
            "kafka.heartbeat_interval_ms",
            f"{kafka_settings.heartbeat_interval_ms} ms is more than a third of "
            f"kafka.session_timeout_ms ({kafka_settings.session_timeout_ms} ms)",
        )
    return settings
