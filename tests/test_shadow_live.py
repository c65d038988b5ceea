"""Shadow mode in the live shell's parts: topics, gauges per side (the Kafka run is below)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from shadow_support import engine_config, firstfit_stream, fixed_pool_settings

from lavad.core.engine import PlainStrategy
from lavad.daemon.live.shell import LiveDaemon
from lavad.daemon.live.telemetry import Telemetry
from lavad.daemon.settings import Settings
from lavad.daemon.shadow.engine import Shadow, shadow_engine, shadow_of
from lavad.daemon.shadow.live import ShadowTelemetry, ShadowTopicNames, topic_names


def test_every_decision_kind_goes_to_the_shadow_topic_and_dead_letters_stay() -> None:
    settings = fixed_pool_settings(enabled=True, topic="ops.advice")
    names = topic_names(settings)
    assert isinstance(names, ShadowTopicNames)
    for kind in ("placement", "admission", "migration", "limit", "reprediction"):
        assert names.for_decision(kind) == "ops.advice"  # type: ignore[arg-type]
    assert names.dead_letters == settings.topics.dead_letters
    assert names.inputs == settings.topics.inputs
    assert settings.topics.placements not in names.all
    assert set(names.all) == {*settings.topics.inputs, "ops.advice", names.dead_letters}


def _daemon(settings: Settings, snapshots: Path) -> LiveDaemon:
    settings = settings.model_copy(
        update={"live": settings.live.model_copy(update={"snapshot_dir": snapshots})}
    )
    return LiveDaemon(settings, engine_config(settings, "bestfit"))


def test_without_shadow_the_daemon_is_built_as_before(tmp_path: Path) -> None:
    plain = _daemon(fixed_pool_settings(), tmp_path / "plain")
    assert type(plain.engine.strategy) is PlainStrategy
    assert type(plain.telemetry) is Telemetry
    assert type(plain.names).__name__ == "TopicNames"
    shadow = _daemon(fixed_pool_settings(enabled=True), tmp_path / "shadow")
    assert isinstance(shadow.engine.strategy, Shadow)
    assert isinstance(shadow.telemetry, ShadowTelemetry)
    assert isinstance(shadow.names, ShadowTopicNames)


def test_gauges_carry_a_side_label() -> None:
    settings = fixed_pool_settings(enabled=True)
    engine = shadow_engine(engine_config(settings, "lava"))
    for event in firstfit_stream(settings, limit=6_000):
        engine.handle(event, event.time)
    telemetry = ShadowTelemetry()
    telemetry.refresh(engine.pools.values(), None, {}, 0)
    text = generate_latest(telemetry.registry).decode()
    for side in ("actual", "lavad"):
        assert f'lavad_shadow_pool_empty_hosts_ratio{{pool="default",side="{side}"}}' in text
        assert f'lavad_shadow_pool_hosts_used{{pool="default",side="{side}"}}' in text
    assert 'lavad_shadow_agreement_ratio{match="host",pool="default"}' in text
    pool = engine.pools["default"]
    actual = shadow_of(engine).follower.pools["default"]
    # The plain gauges describe the actual cluster.
    value = telemetry.hosts_up.labels("default")._value.get()
    assert value == actual.cluster.hosts_up == pool.cluster.hosts_up
    used = telemetry.side_hosts_used.labels("default", "actual")._value.get()
    assert used == actual.cluster.hosts_up - actual.cluster.hosts_empty
    telemetry.forget_pool("default")
    assert 'side="actual"' not in generate_latest(telemetry.registry).decode()
