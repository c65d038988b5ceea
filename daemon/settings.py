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

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lavad.daemon.engine import EngineConfig, HostShape, PoolSetup
from lavad.daemon.metrics.pool import MetricsConfig
from lavad.daemon.placement.registry import (
    REGISTRY,
    PolicyArgs,
    PolicyConfigError,
    validate_policy_args,
)


class ConfigError(Exception):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"configuration error at {key}: {reason}")
        self.key = key
        self.reason = reason


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlacementSettings(_Section):
    policy: str = Field(default="bestfit", description="a name from `lavad policies`")


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
    for name in settings.policies:
        if name not in REGISTRY:
            raise ConfigError(
                f"policies.{name}", f"unknown policy; known: {', '.join(sorted(REGISTRY))}"
            )
        settings.policy_args(name)
    return settings
