"""The capped stores' evictions (core/metrics/limits.py) and the pools' host bounds as
Prometheus metrics."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry
from support import PROJECT_ROOT

from lavad.core.engine import Engine, EngineConfig, HostShape, PoolSetup
from lavad.core.input_bounds import PoolNames
from lavad.core.limits.service import LimitsConfig
from lavad.core.placement.gpa import UsageHooks
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.live.state_codec import dumps, loads
from lavad.daemon.live.telemetry import EvictionMetrics, Telemetry
from lavad.daemon.settings import Settings, load_settings
from lavad.daemon.shadow.engine import ShadowPool, shadow_engine
from lavad.daemon.shadow.live import ShadowTelemetry
from lavad.models.lifetime.grouped import MAX_ROWS
from lavad.streams.schema import (
    HostDown,
    HostUp,
    UsageSample,
    UsageStats,
    VmExit,
    VmPlaced,
    VmRequest,
)

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


def _refusing_engine(strategy: str) -> Engine:
    """A pool with one host of 1 core that remembers at most 4 refused VMs; with
    ``strategy="shadow"`` the existing scheduler places nothing, so each request waits."""
    config = EngineConfig(
        policy="bestfit",
        policy_args=validate_policy_args("bestfit", {}),
        pools=PoolSetup(shape=HostShape(1.0, 4.0), initial_hosts=1),
        pool_names=PoolNames(max_refused=4),
    )
    return shadow_engine(config) if strategy == "shadow" else Engine(config)


def _ten_large_requests(engine: Engine) -> None:
    for i in range(10):
        request = VmRequest(time=float(i), pool="p", vm_id=f"v{i}", cores=2.0, memory_gib=1.0)
        engine.handle(request, float(i))


def test_the_refused_vms_a_pool_forgets_are_exported() -> None:
    """Ten VMs larger than the host, at most 4 remembered: the 5th refusal forgets
    5 - (4 - 2) = 3, the 8th another 3, so 6 (``forget_least_recent``)."""
    engine = _refusing_engine("plain")
    telemetry = Telemetry()
    telemetry.refresh_pool(engine.pool("p"))
    assert _value(telemetry.registry, "refused_vms") == 0.0
    _ten_large_requests(engine)
    telemetry.refresh_pool(engine.pools["p"])
    assert _value(telemetry.registry, "refused_vms") == 6.0
    assert _value(telemetry.registry, "awaited_requests") is None


def test_shadow_modes_forgotten_awaited_requests_are_exported() -> None:
    """The same ten requests awaited by the followed pool: 6 forgotten, as above."""
    engine = _refusing_engine("shadow")
    telemetry = ShadowTelemetry()
    _ten_large_requests(engine)
    pool = engine.pools["p"]
    assert isinstance(pool, ShadowPool) and pool.actual is not None
    telemetry.refresh_pool(pool)
    assert _value(telemetry.registry, "awaited_requests") == 6.0
    assert pool.actual.counters["awaited_forgotten"] == 6


def test_the_hosts_a_pool_holds_and_those_at_their_vm_limit_are_exported() -> None:
    """Two hosts of at most 2 VMs, three VMs that ask nothing: Best Fit fills one
    host (2 VMs, full) and puts the third on the other; one host then goes down."""
    engine = Engine(
        EngineConfig(
            policy="bestfit",
            policy_args=validate_policy_args("bestfit", {"tie_break": "first"}),
            pools=PoolSetup(shape=HostShape(8.0, 32.0), initial_hosts=2, max_vms=2),
        )
    )
    for i in range(3):
        request = VmRequest(time=float(i), pool="p", vm_id=f"v{i}", cores=0.0, memory_gib=0.0)
        engine.handle(request, float(i))
    telemetry = Telemetry()
    pool = engine.pools["p"]
    telemetry.refresh_pool(pool)

    def gauge(name: str) -> float | None:
        return telemetry.registry.get_sample_value(name, {"pool": "p"})

    assert (gauge("lavad_pool_hosts"), gauge("lavad_pool_hosts_full")) == (2.0, 1.0)
    # The host with one VM goes down: it keeps its place, and no host is full.
    lone = next(h for h in range(2) if pool.cluster.vm_count[h] == 1)
    engine.handle(HostDown(time=4.0, pool="p", host_id=pool.cluster.host_ids[lone]), 4.0)
    full = next(h for h in range(2) if h != lone)
    engine.handle(VmExit(time=5.0, pool="p", vm_id=next(iter(pool.cluster.host_vms[full]))), 5.0)
    telemetry.refresh_pool(pool)
    assert (gauge("lavad_pool_hosts"), gauge("lavad_pool_hosts_full")) == (2.0, 0.0)
    telemetry.forget_pool("p")
    assert gauge("lavad_pool_hosts") is None and gauge("lavad_pool_hosts_full") is None


def _las_engine_with_tenants(settings: Settings, tenants: int) -> Engine:
    """A LAS pool of two 8-core hosts, given VM ``v{i}`` of tenant ``t{i}`` (1 core,
    4 GiB) at second i for each of ``tenants``."""
    engine = Engine(
        replace(
            settings.engine_config("las", trace_has_hosts=False),
            pools=PoolSetup(shape=HostShape(8.0, 32.0), initial_hosts=2),
        )
    )
    for i in range(tenants):
        request = VmRequest(
            time=float(i), pool="p", vm_id=f"v{i}", cores=1.0, memory_gib=4.0, tenant=f"t{i}"
        )
        engine.handle(request, float(i))
    return engine


def test_the_groups_of_a_pools_lifetime_model_are_exported() -> None:
    """Three VMs of one shape from three tenants, under LAS. A VM's groups are its
    tenant and shape, its shape at an hour and batch size, its shape, every VM, and
    the pool (``features.lifetime_keys``): 3 tenant groups + 4 shared = 7 groups."""
    settings = load_settings(CONFIG)
    engine = _las_engine_with_tenants(settings, 3)
    telemetry = Telemetry()
    telemetry.refresh_pool(engine.pools["p"])
    labels = {"pool": "p"}
    assert telemetry.registry.get_sample_value("lavad_pool_lifetime_groups", labels) == 7.0
    bound = telemetry.registry.get_sample_value("lavad_pool_lifetime_groups_bound", labels)
    assert bound == settings.policies["las"].get("max_groups", MAX_ROWS) == 250_000
    telemetry.forget_pool("p")
    for name in ("lavad_pool_lifetime_groups", "lavad_pool_lifetime_groups_bound"):
        assert telemetry.registry.get_sample_value(name, labels) is None


def test_the_groups_past_the_bound_and_those_reclaimed_are_exported() -> None:
    """LAS bounded at 7 groups. Three tenants of one shape make the 7 groups of the test
    above; a fourth tenant's own group finds no row (1 lookup past the bound). The
    first two VMs leave, and at the refit an hour on the model reclaims what it can:
    the rows of tenants t0 and t1 (1 observation each, below the bar of 30, no VM
    running), not t2's (v2 runs), nor the shared groups (v2 and v3 run in them).
    Lookups of groups without a row since the start: 7 new + 1 past the bound = 8,
    more than the 2 reclaimable, so 2 go. A fifth tenant, two hours on, takes both:
    one for its own group, one for its shape at that hour."""
    settings = load_settings(CONFIG)
    las = {**settings.policies.get("las", {}), "max_groups": 7}
    settings = settings.model_copy(update={"policies": {**settings.policies, "las": las}})
    engine = _las_engine_with_tenants(settings, 4)
    telemetry = Telemetry()
    labels = {"pool": "p"}

    def gauge(name: str) -> float | None:
        return telemetry.registry.get_sample_value(name, labels)

    telemetry.refresh_pool(engine.pools["p"])
    assert gauge("lavad_pool_lifetime_lookups_past_bound") == 1.0
    assert gauge("lavad_pool_lifetime_groups_reclaimed") == 0.0
    for i in range(2):
        engine.handle(VmExit(time=10.0 + i, pool="p", vm_id=f"v{i}"), 10.0 + i)
    late = 2 * 3_600.0
    engine.handle(
        VmRequest(time=late, pool="p", vm_id="v4", cores=1.0, memory_gib=4.0, tenant="t4"), late
    )
    telemetry.refresh_pool(engine.pools["p"])
    assert gauge("lavad_pool_lifetime_groups_reclaimed") == 2.0
    # t4's two new groups took the reclaimed rows: nothing more past the bound,
    # 7 - 2 + 2 groups.
    assert gauge("lavad_pool_lifetime_lookups_past_bound") == 1.0
    assert gauge("lavad_pool_lifetime_groups") == 7.0
    telemetry.forget_pool("p")
    for name in ("lavad_pool_lifetime_lookups_past_bound", "lavad_pool_lifetime_groups_reclaimed"):
        assert gauge(name) is None


def test_a_pool_without_a_lifetime_model_exports_no_groups() -> None:
    engine = _engine()  # GPA: no lifetime model
    telemetry = Telemetry()
    telemetry.refresh_pool(engine.pools["p"])
    value = telemetry.registry.get_sample_value("lavad_pool_lifetime_groups", {"pool": "p"})
    assert value is None
