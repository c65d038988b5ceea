"""Units of the live shell that need no broker: watermark, snapshots, settings."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from live_support import AZURE_SLICE, PROJECT_ROOT

from lavad.core.engine import Engine
from lavad.daemon.config_file import ConfigError
from lavad.daemon.live.shell import live_engine_config
from lavad.daemon.live.snapshots import PartitionSnapshot, SnapshotError, SnapshotStore
from lavad.daemon.live.watermark import Watermark
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord, encode

# ------------------------------------------------------------------ watermark

# (events as (partition, event time, wall), wall of the query, expected watermark)
WATERMARK_CASES = [
    # Both partitions active: the slower one holds the watermark.
    ([("a", 100.0, 0.0), ("b", 50.0, 0.0)], 1.0, 50.0),
    # b silent for 30 s (idle_after 10): it stops holding the watermark back.
    ([("a", 100.0, 25.0), ("b", 50.0, 0.0)], 30.0, 100.0),
    # Everything idle: the largest event time seen.
    ([("a", 100.0, 0.0), ("b", 150.0, 0.0)], 60.0, 150.0),
]


@pytest.mark.parametrize(("events", "wall", "expected"), WATERMARK_CASES)
def test_watermark_rule(
    events: list[tuple[str, float, float]], wall: float, expected: float
) -> None:
    mark = Watermark(idle_after_s=10.0)
    mark.assign(["a", "b"], 0.0)
    for partition, event_time, at in events:
        mark.observe(partition, event_time, at)
    assert mark.current(wall) == expected


def test_watermark_waits_for_a_new_partition_then_never_goes_back() -> None:
    mark = Watermark(idle_after_s=10.0)
    mark.assign(["a", "b"], 0.0)
    mark.observe("a", 100.0, 1.0)
    # b was just assigned and has said nothing: it holds the watermark for 10 s.
    assert mark.current(2.0) == float("-inf")
    assert mark.current(10.5) == 100.0
    mark.observe("b", 20.0, 11.0)  # b wakes up behind: the watermark stays
    assert mark.current(11.0) == 100.0


def test_watermark_rejects_a_nonpositive_idle_time() -> None:
    with pytest.raises(ValueError, match="idle_after_s"):
        Watermark(idle_after_s=0)


# ------------------------------------------------------------------ snapshots


def _engine_with_events(count: int) -> tuple[Engine, list[bytes]]:
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    engine = Engine(live_engine_config(settings))
    items = open_trace(AZURE_SLICE, seed=0, pool="p").events()
    for item in itertools.islice(items, count):
        assert not isinstance(item, BadRecord)
        engine.handle(item, item.time)
    rest = [encode(item) for item in itertools.islice(items, 2_000)]
    return engine, rest


def test_snapshot_round_trip_resumes_the_same_decisions(tmp_path: Path) -> None:
    from lavad.streams.codec import decode_event  # noqa: PLC0415

    engine, rest = _engine_with_events(3_000)
    store = SnapshotStore(tmp_path, "group")
    store.save(PartitionSnapshot(4, engine.fingerprint, {"t": 3_000}, dict(engine.pools)))
    restored = Engine(engine.config)
    loaded = store.load(4, restored.fingerprint)
    assert loaded is not None
    assert loaded.offsets == {"t": 3_000}
    restored.adopt_pools(loaded.pools)
    for raw in rest:
        event = decode_event(raw)
        assert (
            restored.handle(event, event.time).decisions
            == engine.handle(event, event.time).decisions
        )


def test_snapshot_is_refused_under_another_configuration(tmp_path: Path) -> None:
    engine, _ = _engine_with_events(100)
    store = SnapshotStore(tmp_path, "group")
    store.save(PartitionSnapshot(0, engine.fingerprint, {}, dict(engine.pools)))
    with pytest.raises(SnapshotError, match="another engine configuration"):
        store.load(0, "0000000000000000")
    assert store.load(1, engine.fingerprint) is None


def test_snapshot_of_another_format_version_is_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "group")
    store.path(0).write_bytes(
        b'{"format": "lavad.partition-snapshot", "version": 99}\n' + b"\x80\x05N."
    )
    with pytest.raises(SnapshotError, match="format version 99"):
        store.load(0, "x")


def test_truncated_snapshot_is_refused(tmp_path: Path) -> None:
    engine, _ = _engine_with_events(100)
    store = SnapshotStore(tmp_path, "group")
    store.save(PartitionSnapshot(0, engine.fingerprint, {}, dict(engine.pools)))
    data = store.path(0).read_bytes()
    store.path(0).write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match="checksum"):
        store.load(0, engine.fingerprint)


# ------------------------------------------------------------------- settings

BAD_LIVE_SETTINGS = [
    ("LAVAD_TOPICS__USAGE", "lavad.vm-events", "topics.usage"),
    ("LAVAD_KAFKA__SECURITY_PROTOCOL", "SASL_SSL", "kafka.sasl_plain_username"),
    ("LAVAD_KAFKA__SECURITY_PROTOCOL", "CARRIER_PIGEON", "kafka.security_protocol"),
    ("LAVAD_HTTP__PORT", "70000", "http.port"),
    ("LAVAD_LIVE__SNAPSHOT_INTERVAL_S", "0", "live.snapshot_interval_s"),
    # A loop of the live shell at 1e-9 s would spin.
    ("LAVAD_LIVE__CLUSTER_GAUGES_S", "1e-9", "live.cluster_gauges_s"),
    ("LAVAD_LIVE__BROKER_PROBE_S", "0.001", "live.broker_probe_s"),
    ("LAVAD_LIVE__RETRY_INITIAL_S", "1e-9", "live.retry_initial_s"),
    ("LAVAD_LIVE__RETRY_MAX_S", "0.1", "live.retry_max_s"),
    ("LAVAD_LIVE__FALLING_BEHIND_SAMPLES", "-1", "live.falling_behind_samples"),
    ("LAVAD_LIVE__FALLING_BEHIND_SAMPLES", "many", "live.falling_behind_samples"),
    ("LAVAD_LIVE__FALLING_BEHIND_RECORDS", "0", "live.falling_behind_records"),
]


@pytest.mark.parametrize(("variable", "value", "key"), BAD_LIVE_SETTINGS)
def test_bad_live_setting_names_its_key(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, key: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    assert caught.value.key == key
