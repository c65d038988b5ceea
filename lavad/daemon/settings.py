"""Settings: a TOML file, overridden by ``LAVAD_*`` environment variables.

``LAVAD_PLACEMENT__POLICY=firstfit`` overrides ``[placement] policy``; the
double underscore descends one table. Every key is checked at start-up: an
unknown key, a value of the wrong type or out of range, or a policy argument
the policy does not take stops the process with the key and the reason
(``ConfigError``). Nothing falls back to a silent default for a value that was
given but unusable, and an unknown ``LAVAD_*`` variable stops it too, named.

Secrets (``kafka.sasl_plain_password``, ``kafka.ssl_password``) are
``SecretStr``: dumps, reprs and errors show ``**********``. Each can be read
from a file instead (``..._file``, as container secrets are mounted); only
``daemon/live/connection.py`` unwraps them, for aiokafka.

``load_settings`` checks what every command needs; ``check_live_settings``
adds what only the live daemon refuses, for ``lavad run`` and ``lavad config
check`` alike.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lavad.core.admission.registry import AdmissionConfigError, validate_admission_args
from lavad.core.admission.service import AdmissionConfig
from lavad.core.cluster import MAX_VMS_PER_HOST, capacity_problem
from lavad.core.engine import EngineConfig, HostShape, PoolPolicy, PoolSetup
from lavad.core.input_bounds import InputBounds, PoolNames, PoolPattern
from lavad.core.limits.service import LimitsConfig
from lavad.core.metrics.pool import MetricsConfig
from lavad.core.migrations.config import MigrationsConfig
from lavad.core.placement.registry import (
    REGISTRY,
    PolicyArgs,
    PolicyConfigError,
    needs_true_lifetimes,
    validate_policy_args,
)
from lavad.core.quarantine import DefectPolicy
from lavad.daemon.config_file import ConfigError, Section, read_config_file, validate_config
from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.shadow.config import ShadowSettings
from lavad.models.deployments.process import DeploymentPriors, GammaBelief
from lavad.streams.kafka.topics import TopicNames
from lavad.streams.seeds import MAX_SEED, MIN_SEED


class PlacementSettings(Section):
    policy: str = Field(default="bestfit", description="a name from `lavad policies`")
    # A fleet mixes pools: Best Fit for its GPU pools (where no lifetime policy
    # gains, not even with true lifetimes: docs/results/placement-matrix.md),
    # LAS for its CPU pools. Patterns, not names: pools open as events name
    # them, and a fleet names them by kind ("gpu-*").
    pools: dict[PoolPattern, str] = Field(
        default_factory=dict,
        max_length=1_000,
        description="per fnmatch pattern of pool names, the policy that places those pools "
        "instead of `policy` (the first pattern in the file that matches wins); its "
        "arguments are those of [policies.<name>]",
    )


class GammaSettings(Section):
    shape: float = Field(gt=0, description="pseudo-events")
    rate: float = Field(gt=0, description="in this much exposure (seconds, or core-seconds)")


class PriorSettings(Section):
    """Population priors of the deployment model (appendix B), fitted on a trace."""

    core_death: GammaSettings
    scale_out: GammaSettings
    size: GammaSettings
    kill: GammaSettings


class AdmissionSettings(Section):
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


class HostSettings(Section):
    source: Literal["auto", "trace", "shape"] = Field(
        default="auto",
        description="auto: the trace's own hosts when it has them, else the shape below",
    )
    cores: float = Field(default=48.0, gt=0)
    memory_gib: float = Field(default=192.0, gt=0)
    disk_gib: float = Field(default=0.0, ge=0)
    gpus: float = Field(default=0.0, ge=0)
    # At most 100,000 hosts a pool at start, ten times the largest cell in the
    # shared traces (Google's 12,500 machines): 1e9 passed the check and took
    # every byte of memory when the first pool opened.
    count: int = Field(default=0, ge=0, le=100_000, description="hosts of this shape at start")
    grow_on_demand: bool = Field(
        default=True, description="open a new host when no host fits (shape source only)"
    )
    # The same ten times Google's largest cell, for every pool's hosts however
    # they come (grown, host.up): a host's column lives as long as its pool.
    max_hosts: int = Field(
        default=100_000,
        ge=1,
        description="hosts one pool holds at most, grown or from host.up; beyond it the "
        "pool grows no host (the request is refused, may retry) and a new host.up is "
        "dead-lettered",
    )
    max_vms: int = Field(
        default=MAX_VMS_PER_HOST,
        ge=1,
        description="VMs one host runs at most: at it the host takes no VM, whatever they "
        "ask, and another scheduler's vm.placed on it is dead-lettered (bounds what a "
        "flood of VMs of no demand costs each exit)",
    )
    on_down: Literal["evict", "replace"] = Field(
        default="evict",
        description="a host.down with VMs on it: evict publishes each eviction (a placement "
        "with no host); replace also places each evicted VM again, as a placement decision",
    )

    @field_validator("max_hosts")
    @classmethod
    def _holds_the_hosts_at_start(cls, value: int, info: ValidationInfo) -> int:
        count = info.data.get("count")
        if isinstance(count, int) and count > value:
            raise ValueError(f"below hosts.count ({count}), the hosts every pool opens with")
        return value

    @field_validator("cores", "memory_gib", "disk_gib", "gpus")
    @classmethod
    def _a_host_capacity(cls, value: float) -> float:
        # The rule a host.up's capacity is held to: refused here at start-up,
        # not when the pool first grows.
        problem = capacity_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


# The shortest wall-clock period of the live shell's loops (snapshots, retries,
# the broker probe, the gauges): at 1e-9 s each would spin, hammering the
# disk or the broker and starving the loop that decides.
MIN_WALL_INTERVAL_S = 0.01


class LiveSettings(Section):
    snapshot_store: Literal["file", "topic"] = Field(
        default="file",
        description=(
            "where partition snapshots live: 'file' (snapshot_dir, shared between the"
            " instances) or 'topic' (snapshot_topic on the Kafka cluster: any machine restores)"
        ),
    )
    snapshot_topic: str = Field(default="lavad.snapshots", min_length=1)
    snapshot_chunk_bytes: int = Field(
        default=512 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="a snapshot on the topic goes in chunks of this size (< message.max.bytes)",
    )
    snapshot_dir: Path = Path("var/lavad/snapshots")
    snapshot_interval_s: float = Field(default=60.0, ge=MIN_WALL_INTERVAL_S)
    idle_partition_s: float = Field(
        default=30.0,
        gt=0,
        description="a partition with no record for this long stops holding the watermark back",
    )
    max_ahead_of_record_s: float = Field(
        default=1_800.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "how far an event time may be ahead of its Kafka record's timestamp (when it was"
            " produced, or appended by the broker); further is dead-lettered (0: no bound)."
            " Keep it below input.max_behind_s"
        ),
    )
    keep_samples_s: float = Field(
        default=30 * 86_400.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "event time of each pool's metric samples (hourly) a daemon keeps, the shadow"
            " comparison's window; older ones are dropped at each snapshot, so memory and"
            " snapshots stay bounded however long it runs. Replays keep every sample"
        ),
    )
    retry_initial_s: float = Field(default=0.2, ge=MIN_WALL_INTERVAL_S)
    retry_max_s: float = Field(default=5.0, ge=MIN_WALL_INTERVAL_S)
    broker_probe_s: float = Field(default=2.0, ge=MIN_WALL_INTERVAL_S)
    cluster_gauges_s: float = Field(
        default=10.0,
        ge=MIN_WALL_INTERVAL_S,
        description="how often the cluster gauges (and stranding) refresh",
    )
    falling_behind_samples: int = Field(
        default=6,
        ge=0,
        le=1000,
        description=(
            "while ready, the consumer lag growing at this many consecutive refreshes"
            " (every cluster_gauges_s) logs 'falling behind' and sets lavad_falling_behind;"
            " as many refreshes without growth clear it; 0 turns the watch off"
        ),
    )
    falling_behind_records: int = Field(
        default=1000,
        ge=1,
        description=(
            "falling behind also needs the lag to have grown by at least this many records"
            " over those falling_behind_samples refreshes"
        ),
    )
    on_defect: DefectPolicy = Field(
        default="quarantine",
        description=(
            "an exception the engine does not know (a defect in lavad) while handling a"
            " pool's record or timers: 'quarantine' dead-letters the record (stage 'defect')"
            " and every later record of that pool (stage 'quarantined'), keeps the quarantine"
            " across restarts, and lets the other pools go on; 'stop' exits, and the same"
            " record stops the daemon again at each restart. Replay always stops"
        ),
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


class HttpSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65535)


class LogSettings(Section):
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
        allow_inf_nan=False,
    )

    seed: int = Field(default=0, ge=MIN_SEED, le=MAX_SEED)
    placement: PlacementSettings = PlacementSettings()
    # Arguments of each policy by name, validated by the policy registry.
    policies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    hosts: HostSettings = HostSettings()
    metrics: MetricsConfig = MetricsConfig()
    limits: LimitsConfig = LimitsConfig()
    admission: AdmissionSettings = AdmissionSettings()
    migrations: MigrationsConfig = MigrationsConfig()
    input: InputBounds = InputBounds()
    pools: PoolNames = PoolNames()
    kafka: KafkaSettings = KafkaSettings()
    topics: TopicNames = TopicNames()
    live: LiveSettings = LiveSettings()
    http: HttpSettings = HttpSettings()
    log: LogSettings = LogSettings()
    shadow: ShadowSettings = ShadowSettings()

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

    def placing_policies(self) -> dict[str, str]:
        """Each configured policy that places pools, by its key: ``placement.policy``,
        then ``placement.pools.<pattern>``."""
        placing = {"placement.policy": self.placement.policy}
        for pattern, name in self.placement.pools.items():
            placing[f"placement.pools.{pattern}"] = name
        return placing

    def engine_config(self, policy: str | None = None, *, trace_has_hosts: bool) -> EngineConfig:
        name = policy or self.placement.policy
        hosts = self.hosts
        use_shape = hosts.source == "shape" or (hosts.source == "auto" and not trace_has_hosts)
        shape = HostShape(hosts.cores, hosts.memory_gib, hosts.disk_gib, hosts.gpus)
        return EngineConfig(
            policy=name,
            policy_args=self.policy_args(name),
            pool_policies=tuple(
                PoolPolicy(pattern, chosen, self.policy_args(chosen))
                for pattern, chosen in self.placement.pools.items()
            ),
            pools=PoolSetup(
                shape=shape if use_shape else None,
                initial_hosts=hosts.count if use_shape else 0,
                grow_on_demand=hosts.grow_on_demand and use_shape,
                max_hosts=hosts.max_hosts,
                max_vms=hosts.max_vms,
            ),
            seed=self.seed,
            limits=self.limits,
            admission=self.admission_config(),
            migrations=self.migrations,
            metrics=self.metrics,
            input=self.input,
            pool_names=self.pools,
            on_host_down=hosts.on_down,
        )


def load_settings(path: Path | str | None = None) -> Settings:
    """Read ``path`` (optional) and the environment; raise ``ConfigError`` on any bad key."""
    values = {} if path is None else read_config_file(Path(path))
    check_environment(os.environ)
    settings = _read_secret_files(validate_config(Settings, values))
    for key, name in settings.placing_policies().items():
        if name not in REGISTRY:
            raise ConfigError(
                key, f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY.names))}"
            )
        settings.policy_args(name)
    settings.admission_config()
    _check_live(settings)
    for name in settings.policies:
        if name not in REGISTRY:
            raise ConfigError(
                f"policies.{name}", f"unknown policy; known: {', '.join(sorted(REGISTRY.names))}"
            )
        settings.policy_args(name)
    return settings


def check_live_settings(settings: Settings) -> None:
    """Refuse what ``lavad run`` cannot run though a replay can: the oracles.

    ``lavad run`` and ``lavad config check`` both call it after
    ``load_settings``, so the check accepts and refuses exactly what the
    daemon does. Raises ``ConfigError`` with the key.
    """
    placing = settings.placing_policies()
    for key, name in placing.items():
        if needs_true_lifetimes(name):
            # The daemon cannot know a VM's future: an oracle is for replays only.
            raise ConfigError(
                key,
                f"{name!r} is an oracle (it reads each VM's true lifetime, which only"
                " `lavad replay` knows); use it without '-oracle'",
            )
    if settings.migrations.lifetimes == "oracle":
        raise ConfigError(
            "migrations.lifetimes",
            "'oracle' reads each VM's true lifetime, which only `lavad replay` knows; use 'policy'",
        )
    if settings.migrations.relief.enabled:
        # A replay may name its policies on the command line; the engine
        # refuses relief for a pool that is not placed by gpa there.
        for key, name in placing.items():
            if name != "gpa":
                raise ConfigError(
                    "migrations.relief.enabled",
                    "relief moves VMs off GPA hosts that break their overflow promise; it needs"
                    f" every pool placed by 'gpa', got {key} {name!r}",
                )


ENV_PREFIX = "LAVAD_"
_ENV_DELIMITER = "__"


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse a ``LAVAD_*`` variable that names no configuration key.

    pydantic-settings drops a variable it cannot map (``LAVAD_HOSTZ__CORES``,
    or ``LAVAD_KAFKA_BOOTSTRAP_SERVERS`` with one underscore), so the daemon
    would run on the default the variable meant to replace. The variable is
    named, never its value (it may be a misspelt secret).
    """
    for name in sorted(environ):
        # Case-insensitive, as pydantic-settings reads them.
        if not name.upper().startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split(_ENV_DELIMITER)
        if _names_a_key(Settings, path):
            continue
        known = sorted(_env_names(Settings, ENV_PREFIX))
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.6)
        hint = (
            f"; did you mean {close[0]}?"
            if close
            else f"; variables are {ENV_PREFIX}<TABLE>{_ENV_DELIMITER}<KEY> (see config/lavad.toml)"
        )
        raise ConfigError(name, f"unknown environment variable: no such configuration key{hint}")


def section_of(annotation: Any) -> type | None:
    """The table a field holds (``X`` or ``X | None``), or None for a value.

    A table is a pydantic model or a dataclass of the core (``MetricsConfig``,
    ``MigrationsConfig``...), which the settings validate as they are.
    """
    if isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)
    ):
        return annotation
    if get_origin(annotation) in (Union, UnionType):
        tables = [a for a in get_args(annotation) if a is not NoneType]
        if len(tables) == 1:
            return section_of(tables[0])
    return None


def _fields_of(table: type) -> dict[str, Any]:
    """A table's keys and their types."""
    if issubclass(table, BaseModel):
        return {key: field.annotation for key, field in table.model_fields.items()}
    # The core's modules postpone annotations: resolve them.
    hints = get_type_hints(table)
    return {field.name: hints[field.name] for field in dataclasses.fields(table)}  # type: ignore[arg-type]


def _names_a_key(table: type, path: list[str]) -> bool:
    fields = _fields_of(table)
    if path[0] not in fields:
        return False
    if len(path) == 1:
        return True  # a value, or a whole table as JSON
    annotation = fields[path[0]]
    inner = section_of(annotation)
    if inner is not None:
        return _names_a_key(inner, path[1:])
    # Below a free-form mapping (policy arguments, admission.args) the
    # registries check the keys once the settings are built.
    return get_origin(annotation) is dict


def _env_names(table: type, prefix: str) -> list[str]:
    names = []
    for key, annotation in _fields_of(table).items():
        name = prefix + key.upper()
        inner = section_of(annotation)
        if inner is None:
            names.append(name)
        else:
            names += _env_names(inner, name + _ENV_DELIMITER)
    return names


# Each secret and the key naming a file that holds it instead.
_SECRET_FILES = {
    "sasl_plain_password": "sasl_plain_password_file",
    "ssl_password": "ssl_password_file",
}


def _read_secret_files(settings: Settings) -> Settings:
    kafka = settings.kafka
    update: dict[str, SecretStr] = {}
    for key, file_key in _SECRET_FILES.items():
        path: Path | None = getattr(kafka, file_key)
        if path is None:
            continue
        if getattr(kafka, key) is not None:
            raise ConfigError(
                f"kafka.{file_key}",
                f"kafka.{key} is also set; give the secret or its file, not both",
            )
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"kafka.{file_key}", f"cannot read {str(path)!r}: {exc.strerror or exc}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"kafka.{file_key}", f"{str(path)!r} is not UTF-8 text") from None
        # Secret files usually end with a newline the secret does not have.
        secret = text.rstrip("\r\n")
        if not secret:
            raise ConfigError(f"kafka.{file_key}", f"{str(path)!r} is empty")
        update[key] = SecretStr(secret)
    if not update:
        return settings
    return settings.model_copy(update={"kafka": kafka.model_copy(update=update)})


def _check_live(settings: Settings) -> None:
    seen: dict[str, str] = {}
    for key, name in settings.topics.named().items():
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
