"""The capped usage stores' evictions (core/metrics/limits.py) as Prometheus counters."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry
from support import PROJECT_ROOT

from lavad.core.engine import Engine
from lavad.core.limits.service import LimitsConfig
from lavad.core.placement.gpa import UsageHooks
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.live.telemetry import EvictionMetrics, Telemetry
from lavad.daemon.settings import load_settings
from lavad.streams.schema import HostUp, UsageSample, UsageStats, VmPlaced

CONFIG = PROJECT_ROOT / "config" / "lavad.toml"


def _engine() -> Engine:
    """GPA with at most 1 unplaced usage history, 2 limit jobs and 1 replica deployment."""
    settings = load_settings(CONFIG)
    limits = LimitsConfig("vpa", max_jobs=2, horizontal=True, max_deployments=1)
    engine = Engine(replace(settings.engine_config("gpa", trace_has_hosts=True), limits=limits))
    engine.handle(HostUp(time=0.0, pool="p", host_id="h", cores=64.0, memory_gib=256.0), 0.0)
    pool = engine.pools["p"]
    hooks = pool.policy.hooks
    assert isinstance(hooks, UsageHooks)
    hooks.usage.max_unplaced = 1
    for index, deployment in enumerate(("web", "db", "cache")):
        engine.handle(
            VmPlaced(
                time=0.0,
                pool="p",
                vm_id=f"{deployment}-0",
                host_id="h",
                cores=1.0,
                memory_gib=1.0,
                deployment=deployment,
            ),
            float(index),
        )
    return engine


def _sample(time: float, vm: str) -> UsageSample:
    return UsageSample(
        time=time, pool="p", vm_id=vm, interval_s=300.0, cpu=UsageStats(mean=0.5, peak=0.5)
    )


def _value(registry: CollectorRegistry, state: str) -> float | None:
    return registry.get_sample_value("lavad_state_evicted_total", {"pool": "p", "state": state})


def test_evictions_of_each_capped_store_are_counted_once() -> None:
    engine = _engine()
    registry = CollectorRegistry()
    metrics = EvictionMetrics(registry)
    metrics.refresh(engine.pools["p"])
    assert [_value(registry, s) for s in ("usage_histories", "limit_jobs")] == [0.0, 0.0]
    assert _value(registry, "replica_deployments") == 0.0
    # Window 1 (t in [0, 300)): the three placed VMs and two VMs the pool never
    # placed ("x", "y") each send a sample; window 2's samples close window 1.
    vms = ["web-0", "db-0", "cache-0", "x", "y"]
    for window in range(2):
        for vm in vms:
            engine.handle(_sample(100.0 + 300.0 * window, vm), 100.0 + 300.0 * window)
    metrics.refresh(engine.pools["p"])
    # By hand, from the pool's own counts: usage histories of unplaced VMs
    # kept at most 1, so "y" evicts "x" and "x" evicts "y" again in window 2
    # (3 evictions: x<-y, y<-x, x<-y); limit jobs at most 2: window 1 closes 5
    # jobs one at a time (3 evicted); deployments at most 1: web, db, cache
    # close in turn (2 evicted).
    pool = engine.pools["p"]
    hooks = pool.policy.hooks
    assert isinstance(hooks, UsageHooks)
    assert pool.limits is not None and pool.replicas is not None
    counts = (hooks.usage.evicted, pool.limits.tracker.evicted, pool.replicas.tracker.evicted)
    assert counts == (3, 3, 2)
    exported = [_value(registry, s) for s in ("usage_histories", "limit_jobs")]
    assert exported == [3.0, 3.0]
    assert _value(registry, "replica_deployments") == 2.0
    # A second refresh adds nothing that did not happen.
    metrics.refresh(pool)
    assert _value(registry, "limit_jobs") == 3.0


def test_a_pool_restored_from_an_older_snapshot_never_lowers_a_counter() -> None:
    engine = _engine()
    saved = dumps(engine.pools)
    registry = CollectorRegistry()
    metrics = EvictionMetrics(registry)
    for vm in ("x", "y", "z"):
        engine.handle(_sample(100.0, vm), 100.0)
    metrics.refresh(engine.pools["p"])
    assert _value(registry, "usage_histories") == 2.0
    # Reopened from before those samples: its count (0) is below what was
    # exported, and the re-read samples evict the same histories again.
    engine.pools = loads(saved)
    metrics.refresh(engine.pools["p"])
    assert _value(registry, "usage_histories") == 2.0
    for vm in ("x", "y", "z", "w"):
        engine.handle(_sample(100.0, vm), 100.0)
    metrics.refresh(engine.pools["p"])
    assert _value(registry, "usage_histories") == 3.0
    metrics.forget_pool("p")
    assert _value(registry, "usage_histories") is None


def test_the_live_telemetry_exports_the_evictions_and_forgets_a_moved_pool() -> None:
    engine = _engine()
    telemetry = Telemetry()
    for vm in ("x", "y", "z"):
        engine.handle(_sample(100.0, vm), 100.0)
    # At most 1 unplaced history: y evicts x, z evicts y.
    telemetry.refresh_pool(engine.pools["p"])
    assert _value(telemetry.registry, "usage_histories") == 2.0
    telemetry.forget_pool("p")
    assert _value(telemetry.registry, "usage_histories") is None
