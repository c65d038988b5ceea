"""Shadow mode in the live shell's parts: topics, gauges per side (the Kafka run is below)."""

from __future__ import annotations

from prometheus_client import generate_latest
from shadow_support import engine_config, firstfit_stream, fixed_pool_settings

from lavad.core.engine import Engine
from lavad.daemon.live.telemetry import Telemetry
from lavad.daemon.shadow.engine import ShadowEngine
from lavad.daemon.shadow.live import (
    ShadowTelemetry,
    ShadowTopicNames,
    build_engine,
    build_telemetry,
    topic_names,
)


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


def test_without_shadow_the_daemon_is_built_as_before() -> None:
    settings = fixed_pool_settings()
    config = engine_config(settings, "bestfit")
    assert type(build_engine(settings, config)) is Engine
    assert type(build_telemetry(settings)) is Telemetry
    assert type(topic_names(settings)).__name__ == "TopicNames"
    shadow = fixed_pool_settings(enabled=True)
    assert isinstance(build_engine(shadow, config), ShadowEngine)
    assert isinstance(build_telemetry(shadow), ShadowTelemetry)


def test_gauges_carry_a_side_label() -> None:
    settings = fixed_pool_settings(enabled=True)
    engine = ShadowEngine(engine_config(settings, "lava"))
    for event in firstfit_stream(settings, limit=6_000):
        engine.handle(event, event.time)
    telemetry = ShadowTelemetry()
    telemetry.refresh(engine.pools.values(), None, {})
    text = generate_latest(telemetry.registry).decode()
    for side in ("actual", "lavad"):
        assert f'lavad_shadow_pool_empty_hosts_ratio{{pool="default",side="{side}"}}' in text
        assert f'lavad_shadow_pool_hosts_used{{pool="default",side="{side}"}}' in text
    assert 'lavad_shadow_agreement_ratio{match="host",pool="default"}' in text
    pool = engine.pools["default"]
    actual = engine.follower.pools["default"]
    # The plain gauges describe the actual cluster.
    value = telemetry.hosts_up.labels("default")._value.get()
    assert value == actual.cluster.hosts_up == pool.cluster.hosts_up
    used = telemetry.side_hosts_used.labels("default", "actual")._value.get()
    assert used == actual.cluster.hosts_up - actual.cluster.hosts_empty
    telemetry.forget_pool("default")
    assert 'side="actual"' not in generate_latest(telemetry.registry).decode()
