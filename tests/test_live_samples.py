"""A daemon keeps a window of each pool's metric samples, not every one since it started.

A pool samples its hosts every hour of event time (``PoolMetrics``): 8,760
samples a year, each kept in memory and written into every snapshot, so a
daemon that runs for a year writes ever larger snapshots. ``[live]
keep_samples_s`` drops the older ones at each snapshot; a replay keeps all.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import orjson
import pytest
from live_support import (
    AZURE_SLICE,
    NAMES,
    PROJECT_ROOT,
    DaemonProcess,
    create_topics,
    live_settings,
    produce,
    read_topic,
    replay_in_process,
    two_pool_events,
)
from shadow_support import engine_config, firstfit_stream, fixed_pool_settings

from lavad.core.engine import Engine
from lavad.daemon.live.shell import live_engine_config
from lavad.daemon.live.snapshots import SnapshotStore
from lavad.daemon.settings import load_settings
from lavad.daemon.shadow.engine import ShadowPool, shadow_engine
from lavad.streams.adapters import open_trace
from lavad.streams.kafka.embedded import EmbeddedBroker

HOUR = 3_600.0


def _slice_pool() -> Engine:
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    config = settings.engine_config("bestfit", trace_has_hosts=False)
    metrics = dataclasses.replace(config.metrics, warmup_s=0.0)
    engine = Engine(dataclasses.replace(config, metrics=metrics))
    for event in open_trace(AZURE_SLICE, seed=0).events():
        engine.handle(event, event.time)
    return engine


def test_dropping_samples_keeps_the_window_and_the_integrals() -> None:
    pool = _slice_pool().pools["default"]
    metrics, cluster = pool.metrics, pool.cluster
    full = copy.deepcopy(metrics)
    assert len(full.series) > 48 and len(full.stranding) > 48  # 3.5 days, an hour apart
    cutoff = full.series[-1].time - 24 * HOUR
    dropped = metrics.drop_samples_before(cutoff)
    assert dropped == sum(p.time < cutoff for p in full.series) + sum(
        s.time < cutoff for s in full.stranding
    )
    assert [p.time for p in metrics.series] == [p.time for p in full.series if p.time >= cutoff]
    assert all(s.time >= cutoff for s in metrics.stranding)
    # The means over time are integrals, whatever samples are kept.
    end = metrics.last or 0.0
    kept, whole = metrics.summary(cluster, end), full.summary(cluster, end)
    for key in ("empty_hosts_pct", "hosts_used_mean", "cpu_util_pct", "memory_util_pct"):
        assert kept[key] == whole[key]
    # A cutoff before every sample, or one that compares with nothing, drops none.
    kept_series, kept_strands = list(metrics.series), list(metrics.stranding)
    assert metrics.drop_samples_before(-math.inf) == 0
    assert metrics.drop_samples_before(math.nan) == 0
    assert (metrics.series, metrics.stranding) == (kept_series, kept_strands)
    # Past the last sample, the latest stranding sample stays: the next may reuse it.
    metrics.drop_samples_before(math.inf)
    assert metrics.series == [] and metrics.stranding == [full.stranding[-1]]


@pytest.mark.kafka
async def test_a_daemons_snapshots_hold_only_the_window(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    events = two_pool_events(12_000)  # about 2.5 h of event time per pool
    settings = live_settings(bootstrap, tmp_path / "unused")
    placements = sum(len(lines) for lines in replay_in_process(settings, events).values())
    # What an engine that never drops keeps: a sample an hour, from the first event.
    engine = Engine(live_engine_config(settings))
    for event in events:
        engine.handle(event, event.time)
    whole = {name: len(pool.metrics.series) for name, pool in engine.pools.items()}
    assert min(whole.values()) >= 3
    snapshots = tmp_path / "snapshots"
    await create_topics(bootstrap)
    await produce(bootstrap, events)
    daemon = DaemonProcess(
        bootstrap,
        snapshots,
        tmp_path / "daemon.log",
        LAVAD_LIVE__KEEP_SAMPLES_S=str(HOUR),
        LAVAD_METRICS__WARMUP_S="0",
    )
    try:
        await daemon.wait_status("/readyz", 200, 60)
        await read_topic(bootstrap, NAMES.placements, at_least=placements)
    finally:
        assert daemon.stop() == 0  # its shutdown snapshot is the last one written
    kept: dict[str, int] = {}
    for path in snapshots.rglob("*.snapshot"):
        header = orjson.loads(path.read_bytes().split(b"\n", 1)[0])
        snapshot = SnapshotStore(snapshots, path.parent.name).load(
            header["partition"], header["fingerprint"]
        )
        assert snapshot is not None
        for name, pool in snapshot.pools.items():
            series, last = pool.metrics.series, pool.metrics.last
            assert last is not None and all(p.time >= last - HOUR for p in series)
            assert pool.metrics.stranding  # the latest stranding sample stays
            kept[name] = len(series)
    assert sorted(kept) == sorted(whole)
    assert all(kept[name] < whole[name] for name in kept), (kept, whole)


def test_a_shadow_pool_drops_both_sides_samples() -> None:
    """The comparison reads the two sides' series over the same times."""
    settings = fixed_pool_settings()
    engine = shadow_engine(engine_config(settings, "bestfit"))
    for event in firstfit_stream(settings):
        engine.handle(event, event.time)
    pool = engine.pools["default"]
    assert isinstance(pool, ShadowPool) and pool.actual is not None
    sides = (pool.metrics, pool.actual.metrics)
    cutoff = pool.metrics.series[-1].time - 12 * HOUR
    before = [len(side.series) for side in sides]
    assert all(sum(p.time < cutoff for p in side.series) > 0 for side in sides)
    pool.drop_samples_before(cutoff)
    for side, count in zip(sides, before, strict=True):
        assert side.series and all(p.time >= cutoff for p in side.series)
        assert len(side.series) < count
