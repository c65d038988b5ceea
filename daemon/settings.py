"""Settings: a TOML file, overridden by ``LAVAD_*`` environment variables.

``LAVAD_PLACEMENT__POLICY=firstfit`` overrides ``[placement] policy``; the
double underscore descends one table. Every key is checked at start-up: an
unknown key, a value of the wrong type or out of range, or a policy argument
the policy does not take stops the process with the key and the reason
(``ConfigError``). Nothing falls back to a silent default for a value that was
given but unusable.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lavad.daemon.admission.registry import AdmissionConfigError, validate_admission_args
from lavad.daemon.admission.service import AdmissionConfig
from lavad.daemon.engine import EngineConfig, HostShape, PoolSetup
from lavad.daemon.limits.service import RECOMMENDERS, LimitsConfig
from lavad.daemon.metrics.pool import MetricsConfig
from lavad.daemon.migrations.config import DefragConfig, MigrationsConfig
from lavad.daemon.placement.registry import (
    REGISTRY,
    PolicyArgs,
    PolicyConfigError,
    validate_policy_args,
)
from lavad.models.deployments.process import DeploymentPriors, GammaBelief


class ConfigError(Exception):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"configuration error at {key}: {reason}")
        self.key = key
        self.reason = reason


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlacementSettings(_Section):
    policy: str = Field(default="bestfit", description="a name from `lavad policies`")


class LimitSettings(_Section):
    recommender: str = Field(
        default="ml", description="CPU and memory limits from usage: off, ml, vpa, window-<stat>"
    )
    tolerance: float = Field(
        default=0.05, ge=0, description="a limit within this fraction of the last is not news"
    )

    @field_validator("recommender")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in RECOMMENDERS:
            raise ValueError(f"unknown recommender; known: {', '.join(RECOMMENDERS)}")
        return value


class GammaSettings(_Section):
    shape: float = Field(gt=0, description="pseudo-events")
    rate: float = Field(gt=0, description="in this much exposure (seconds, or core-seconds)")


class PriorSettings(_Section):
    """Population priors of the deployment model (appendix B), fitted on a trace."""

    core_death: GammaSettings
    scale_out: GammaSettings
    size: GammaSettings
    kill: GammaSettings


class AdmissionSettings(_Section):
    policy: Literal["off", "zeroth", "first", "second"] = Field(
        default="off", description="admission of deployments: off, or a moment policy"
    )
    capacity_cores: float | None = Field(
        default=None, gt=0, description="cores the admitted deployments share (required unless off)"
    )
    args: dict[str, Any] = Field(default_factory=dict, description="the policy's arguments")
    priors: PriorSettings | None = Field(
        default=None, description="required by the first and second moment policies"
    )
    refresh_s: float = Field(default=3600.0, gt=0, description="event time between full recomputes")


class DefragSettings(_Section):
    empty_below: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="drain hosts when empty open hosts fall below this share of the pool (0: off)",
    )
    check_interval_s: float = Field(
        default=300.0, gt=0, description="event time between looks at the empty-host share"
    )
    max_draining_hosts: int = Field(
        default=2, ge=1, description="defragmentation drains in progress at most, per pool"
    )


class MigrationSettings(_Section):
    """Drains by live migration: maintenance (host.drain events) and defragmentation."""

    order: Literal["lars", "arrival", "shortest", "random"] = Field(
        default="lars", description="which queued VM goes next; lars: longest remaining first"
    )
    lifetimes: Literal["policy", "model", "oracle"] = Field(
        default="policy",
        description="policy: the placement policy's predictions (see config/lavad.toml);"
        " model: always a model (the policy's or the planner's own); oracle: replays only",
    )
    max_concurrent: int = Field(default=3, ge=1, description="live migrations at once, per pool")
    duration_s: float = Field(
        default=1200.0, ge=0, description="how long a migration keeps its source and target busy"
    )
    retry_s: float = Field(
        default=300.0, gt=0, description="when no queued VM fits anywhere, look again after"
    )
    defrag: DefragSettings = DefragSettings()

    def config(self) -> MigrationsConfig:
        return MigrationsConfig(
            order=self.order,
            lifetimes=self.lifetimes,
            max_concurrent=self.max_concurrent,
            duration_s=self.duration_s,
            retry_s=self.retry_s,
            defrag=DefragConfig(
                empty_below=self.defrag.empty_below,
                check_interval_s=self.defrag.check_interval_s,
                max_draining_hosts=self.defrag.max_draining_hosts,
            ),
        )


class HostSettings(_Section):
    source: Literal["auto", "trace", "shape"] = Field(
        default="auto",
        description="auto: the trace's own hosts when it has them, else the shape below",
    )
    cores: float = Field(default=48.0, gt=0)
    memory_gib: float = Field(default=192.0, gt=0)
    disk_gib: float = Field(default=0.0, ge=0)
    gpus: float = Field(default=0.0, ge=0)
    count: int = Field(default=0, ge=0, description="hosts of this shape at start")
    grow_on_demand: bool = Field(
        default=True, description="open a new host when no host fits (shape source only)"
    )


class MetricsSettings(_Section):
    warmup_s: float = Field(default=86_400.0, ge=0)
    sample_interval_s: float = Field(default=3_600.0, gt=0)
    stranding: bool = True
    until: Literal["last_request", "trace_end"] = Field(
        default="last_request",
        description="close the averaging window at the last request or at the trace end",
    )
    mix_window: int = Field(default=10_000, ge=1)
    mix_max_shapes: int = Field(default=32, ge=1)


class KafkaSettings(_Section):
    """The broker connection; security options pass through to aiokafka unchanged."""

    bootstrap_servers: str = Field(default="127.0.0.1:9092", min_length=1)
    client_id: str = "lavad"
    group_id: str = Field(default="lavad", min_length=1)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"] = (
        "PLAIN"
    )
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
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


class TopicSettings(_Section):
    """Input topics are co-partitioned: keyed by pool, with one partition count."""

    vm_events: str = "lavad.vm-events"
    deployments: str = "lavad.deployments"
    usage: str = "lavad.usage"
    placements: str = "lavad.placements"
    admissions: str = "lavad.admissions"
    migrations: str = "lavad.migrations"
    limits: str = "lavad.limits"
    repredictions: str = "lavad.repredictions"
    dead_letters: str = "lavad.dead-letters"
    # How `lavad topics create` lays the topics out. Excluded from model_dump,
    # which the daemon and the config check read as the map of topic names.
    partitions: int = Field(
        default=3, ge=1, exclude=True, description="partitions of every topic lavad creates"
    )
    replication_factor: int = Field(
        default=1, ge=1, exclude=True, description="replicas of every topic lavad creates"
    )


class LiveSettings(_Section):
    snapshot_dir: Path = Path("var/lavad/snapshots")
    snapshot_interval_s: float = Field(default=60.0, gt=0)
    idle_partition_s: float = Field(
        default=30.0,
        gt=0,
        description="a partition with no record for this long stops holding the watermark back",
    )
    retry_initial_s: float = Field(default=0.2, gt=0)
    retry_max_s: float = Field(default=5.0, gt=0)
    broker_probe_s: float = Field(default=2.0, gt=0)
    cluster_gauges_s: float = Field(
        default=10.0, gt=0, description="how often the cluster gauges (and stranding) refresh"
    )
    on_bad_snapshot: Literal["stop", "rebuild"] = Field(
        default="stop",
        description=(
            "a partition snapshot that cannot be loaded (truncated, corrupt, another version or"
            " configuration): 'stop' exits with the reason, 'rebuild' renames it aside and"
            " re-reads the partition from the earliest retained offset. 'stop' by default:"
            " once the input topics' retention has dropped records, a rebuild resumes from"
            " less history than the snapshot held and its decisions differ from the ones"
            " already published, which an operator should choose knowingly"
        ),
    )


class HttpSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65535)


class LogSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="debug logs every decision id"
    )
    format: Literal["json", "console"] = "json"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LAVAD_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    seed: int = Field(default=0, ge=0)
    placement: PlacementSettings = PlacementSettings()
    # Arguments of each policy by name, validated by the policy registry.
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    hosts: HostSettings = HostSettings()
    metrics: MetricsSettings = MetricsSettings()
    limits: LimitSettings = LimitSettings()
    admission: AdmissionSettings = AdmissionSettings()
    migrations: MigrationSettings = MigrationSettings()
    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    live: LiveSettings = LiveSettings()
    http: HttpSettings = HttpSettings()
    log: LogSettings = LogSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init arguments; the environment wins.
        return (env_settings, init_settings)

    def policy_args(self, name: str) -> PolicyArgs:
        try:
            return validate_policy_args(name, self.policies.get(name, {}))
        except PolicyConfigError as exc:
            raise ConfigError(exc.key, exc.reason) from None

    def admission_config(self) -> AdmissionConfig | None:
        admission = self.admission
        if admission.policy == "off":
            return None
        if admission.capacity_cores is None:
            raise ConfigError("admission.capacity_cores", "required when admission.policy is set")
        try:
            validate_admission_args(admission.policy, admission.args, key="admission.args")
        except AdmissionConfigError as exc:
            raise ConfigError(exc.key, exc.reason) from None
        if admission.priors is None:
            if admission.policy != "zeroth":
                raise ConfigError(
                    "admission.priors",
                    f"the {admission.policy} moment policy needs the deployment priors"
                    " (`lavad evaluate admission` fits them on a trace)",
                )
            # The zeroth moment policy reads active cores only; the model's
            # moments are kept but never consulted, so any proper prior does.
            unused = GammaBelief(1.0, 1.0)
            priors = DeploymentPriors(unused, unused, unused, unused)
        else:
            p = admission.priors
            priors = DeploymentPriors(
                *(GammaBelief(g.shape, g.rate) for g in (p.core_death, p.scale_out, p.size, p.kill))
            )
        return AdmissionConfig(
            admission.policy,
            dict(admission.args),
            admission.capacity_cores,
            priors,
            admission.refresh_s,
        )

    def engine_config(self, policy: str | None = None, *, trace_has_hosts: bool) -> EngineConfig:
        name = policy or self.placement.policy
        hosts = self.hosts
        use_shape = hosts.source == "shape" or (hosts.source == "auto" and not trace_has_hosts)
        shape = HostShape(hosts.cores, hosts.memory_gib, hosts.disk_gib, hosts.gpus)
        return EngineConfig(
            policy=name,
            policy_args=self.policy_args(name),
            pools=PoolSetup(
                shape=shape if use_shape else None,
                initial_hosts=hosts.count if use_shape else 0,
                grow_on_demand=hosts.grow_on_demand and use_shape,
            ),
            seed=self.seed,
            limits=LimitsConfig(self.limits.recommender, self.limits.tolerance),
            admission=self.admission_config(),
            migrations=self.migrations.config(),
            metrics=MetricsConfig(
                warmup_s=self.metrics.warmup_s,
                sample_interval_s=self.metrics.sample_interval_s,
                stranding=self.metrics.stranding,
                until=self.metrics.until,
                mix_window=self.metrics.mix_window,
                mix_max_shapes=self.metrics.mix_max_shapes,
            ),
        )


def load_settings(path: Path | str | None = None) -> Settings:
    """Read ``path`` (optional) and the environment; raise ``ConfigError`` on any bad key."""
    values: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        try:
            values = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(str(file), "configuration file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(file), f"not valid TOML: {exc}") from None
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        key = ".".join(str(part) for part in first["loc"]) or "<root>"
        raise ConfigError(key, f"{first['msg']} (got {first.get('input')!r})") from None
    if settings.placement.policy not in REGISTRY:
        raise ConfigError(
            "placement.policy",
            f"unknown policy {settings.placement.policy!r}; known: {', '.join(sorted(REGISTRY))}",
        )
    settings.policy_args(settings.placement.policy)
    settings.admission_config()
    _check_live(settings)
    for name in settings.policies:
        if name not in REGISTRY:
            raise ConfigError(
                f"policies.{name}", f"unknown policy; known: {', '.join(sorted(REGISTRY))}"
            )
        settings.policy_args(name)
    return settings


def _check_live(settings: Settings) -> None:
    topics = settings.topics.model_dump()
    seen: dict[str, str] = {}
    for key, name in topics.items():
        if name in seen:
            raise ConfigError(
                f"topics.{key}", f"topic {name!r} is also topics.{seen[name]}; each needs its own"
            )
        seen[name] = key
    kafka = settings.kafka
    if (
        kafka.security_protocol.startswith("SASL")
        and kafka.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
        and (kafka.sasl_plain_username is None or kafka.sasl_plain_password is None)
    ):
        raise ConfigError(
            "kafka.sasl_plain_username",
            f"{kafka.sasl_mechanism} over {kafka.security_protocol} needs a username and password",
        )
    if kafka.heartbeat_interval_ms >= kafka.session_timeout_ms:
        raise ConfigError("kafka.heartbeat_interval_ms", "must be below kafka.session_timeout_ms")
    if settings.live.retry_max_s < settings.live.retry_initial_s:
        raise ConfigError("live.retry_max_s", "must not be below live.retry_initial_s")
