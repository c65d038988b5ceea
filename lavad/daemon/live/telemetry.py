"""Prometheus metrics of one live daemon, on its own registry (no process globals).

Names follow Prometheus conventions: counters end in ``_total``, ratios are
0..1, durations are seconds. The cluster gauges are refreshed from the
engine's pools every ``live.cluster_gauges_s`` of wall time, not per event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

from lavad.core.engine import PoolRuntime
from lavad.core.metrics.limits import eviction_counts
from lavad.core.metrics.pool import CORES, MEMORY
from lavad.core.placement.gpa import UsageHooks
from lavad.core.placement.lifetime import LifetimeTracker
from lavad.daemon.live.batch_histogram import BatchHistogram
from lavad.daemon.live.lag_watch import LagReading

# Decision latency = input record timestamp -> decision acknowledged by the
# broker; the buckets straddle the 50 ms goal.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class _Positions(Protocol):
    @property
    def positions(self) -> dict[str, int]: ...


class Telemetry:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.events = self.counter("lavad_events", "Input records decoded, by event type", "type")
        self.decisions = self.counter("lavad_decisions", "Decisions published, by kind", "kind")
        self.dead_letters = self.counter(
            "lavad_dead_letters",
            "Input records sent to the dead-letter topic, by stage that refused them",
            "stage",
        )
        self.decision_latency = BatchHistogram(
            "lavad_decision_latency_seconds",
            "Input record timestamp to decision acknowledged by the broker",
            LATENCY_BUCKETS,
            registry,
        )
        self.consumer_lag = self.gauge(
            "lavad_consumer_lag_records",
            "High watermark minus the next offset to process",
            "topic",
            "partition",
        )
        self.publish_retries = self.counter(
            "lavad_publish_retries", "Batches re-sent after a failed publish"
        )
        self.records_skipped = self.counter(
            "lavad_records_skipped",
            "Fetched records below the partition's known position (already in the state)",
        )
        self.commit_failures = self.counter(
            "lavad_commit_failures", "Offset commits that failed (retried)"
        )
        self.snapshots = self.counter("lavad_snapshots", "Partition snapshots written")
        self.snapshot_failures = self.counter(
            "lavad_snapshot_failures",
            "Periodic partition snapshots the filesystem refused (retried next interval)",
        )
        self.snapshots_rebuilt = self.counter(
            "lavad_snapshots_rebuilt",
            "Partition snapshots that did not load, moved aside; the partition was re-read"
            " from the earliest retained offset (live.on_bad_snapshot = rebuild)",
        )
        self.broker_reachable = self.gauge(
            "lavad_broker_reachable", "1 when the broker answered the last probe"
        )
        self.ready = self.gauge("lavad_ready", "1 when /readyz answers 200")
        self.falling_behind = self.gauge(
            "lavad_falling_behind",
            "1 while ready but the consumer lag grew at each of the last"
            " live.falling_behind_samples refreshes (lag_watch.py)",
        )
        self.watermark = self.gauge(
            "lavad_watermark_seconds", "Event-time watermark over the partitions"
        )
        self.pools = self.gauge(
            "lavad_pools",
            "Pools this instance holds (pools.max_pools bounds it; more are dead-lettered)",
        )
        self.quarantined = self.gauge(
            "lavad_pools_quarantined",
            "Pools a defect stopped (live.on_defect = quarantine): their records are"
            " dead-lettered at stage 'quarantined' until their state is rebuilt",
        )
        self.assigned_partitions = self.gauge(
            "lavad_assigned_partitions", "Input partitions assigned"
        )
        # For watching a long run for leaks: tasks here, and the process's
        # resident memory and open file descriptors (process_*) beside them.
        self.tasks = self.gauge("lavad_asyncio_tasks", "asyncio tasks alive in the daemon's loop")
        ProcessCollector(registry=registry)
        self.empty_hosts = self.gauge(
            "lavad_pool_empty_hosts_ratio", "Hosts up with no VM / hosts up", "pool"
        )
        self.hosts_up = self.gauge("lavad_pool_hosts_up", "Hosts up", "pool")
        self.hosts_held = self.gauge(
            "lavad_pool_hosts",
            "Hosts the pool holds, up, draining or down (a host keeps its place while the"
            " pool lives): at hosts.max_hosts it grows no host and dead-letters a new host.up",
            "pool",
        )
        self.hosts_full = self.gauge(
            "lavad_pool_hosts_full",
            "Hosts at hosts.max_vms VMs (up or draining): they take no VM until one leaves",
            "pool",
        )
        self.vms = self.gauge("lavad_pool_vms", "VMs placed and running", "pool")
        self.lifetime_groups = self.gauge(
            "lavad_pool_lifetime_groups",
            "Feature groups the pool's lifetime model holds (LAS, LAVA, LA-Binary)",
            "pool",
        )
        self.lifetime_groups_bound = self.gauge(
            "lavad_pool_lifetime_groups_bound",
            "The policy's max_groups: past it a new group takes the row of a group that no"
            " longer counts (model 'tables'), or its VMs are predicted from their coarser groups",
            "pool",
        )
        # Gauges set from the model's own totals, which a snapshot carries
        # across restarts (a Prometheus counter cannot be set).
        self.lifetime_lookups_past_bound = self.gauge(
            "lavad_pool_lifetime_lookups_past_bound",
            "Lookups of a feature group with no row of its own (past max_groups, nothing to"
            " reclaim): its VMs are predicted from their coarser groups only",
            "pool",
        )
        self.lifetime_groups_reclaimed = self.gauge(
            "lavad_pool_lifetime_groups_reclaimed",
            "Feature groups whose rows went to new groups past max_groups (no running VM,"
            " fewer observations than min_observations)",
            "pool",
        )
        self.utilisation = self.gauge(
            "lavad_pool_utilisation_ratio", "Booked / capacity over hosts up", "pool", "resource"
        )
        self.stranded = self.gauge(
            "lavad_pool_stranded_ratio",
            "Free capacity no request of the recent mix can use (latest inflation sample)",
            "pool",
            "resource",
        )

        self.cpu_overflow = self.gauge(
            "lavad_pool_cpu_overflow_ratio",
            "Realised CPU overflow frequency: host 5-minute windows whose measured usage"
            " exceeded capacity / host windows measured (usage-aware policies only)",
            "pool",
        )
        self.evictions = EvictionMetrics(registry)

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        """A gauge on this daemon's registry (subclasses add theirs the same way)."""
        return Gauge(name, documentation, labels, registry=self.registry)

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        """A counter on this daemon's registry."""
        return Counter(name, documentation, labels, registry=self.registry)

    def refresh_pool(self, pool: PoolRuntime) -> None:
        cluster = pool.cluster
        name = pool.name
        up = cluster.hosts_up
        self.hosts_up.labels(name).set(up)
        n = cluster.n_hosts
        self.hosts_held.labels(name).set(n)
        # Down hosts run no VM, so every host at the limit is up or draining.
        full = np.count_nonzero(cluster.vm_count[:n] >= cluster.max_vms)
        self.hosts_full.labels(name).set(int(full))
        self.vms.labels(name).set(len(cluster.vms))
        self.empty_hosts.labels(name).set(cluster.hosts_empty / up if up else 0.0)
        used, capacity = cluster.used_total, cluster.capacity_total
        for resource, index in (("cpu", CORES), ("memory", MEMORY)):
            share = used[index] / capacity[index] if capacity[index] else 0.0
            self.utilisation.labels(name, resource).set(share)
        hooks = pool.policy.hooks
        if isinstance(hooks, UsageHooks):
            self.cpu_overflow.labels(name).set(hooks.realised_overflow)
        tracker = hooks.lifetime_tracker()
        if isinstance(tracker, LifetimeTracker):
            self.lifetime_groups.labels(name).set(tracker.model.groups)
            self.lifetime_groups_bound.labels(name).set(tracker.settings.max_groups)
            self.lifetime_lookups_past_bound.labels(name).set(tracker.model.lookups_past_bound)
            self.lifetime_groups_reclaimed.labels(name).set(tracker.model.groups_reclaimed)
        if pool.metrics.stranding:
            latest = pool.metrics.stranding[-1]
            self.stranded.labels(name, "cpu").set(latest.cpu_pct / 100.0)
            self.stranded.labels(name, "memory").set(latest.memory_pct / 100.0)
        self.evictions.refresh(pool)

    def refresh(
        self,
        pools: Iterable[PoolRuntime],
        consumer: Any,
        positions: Mapping[int, _Positions],
        quarantined: int,
    ) -> LagReading | None:
        """The cluster gauges of every pool, and the consumer lag of every assigned partition.

        ``positions`` maps a partition number to what this instance holds of
        it (``positions``: input topic -> next offset to process); ``quarantined``
        counts the pools a defect stopped, opened or not. Returns the lags set
        (None without a consumer), for the falling-behind watch.
        """
        pools = list(pools)
        self.pools.set(len(pools))
        for pool in pools:
            # A quarantined pool is a husk: its gauges keep their last values.
            if pool.quarantine is None:
                self.refresh_pool(pool)
        self.quarantined.set(quarantined)
        if consumer is None:
            return None
        lags: dict[tuple[str, int], int] = {}
        for tp in consumer.assignment():
            owned = positions.get(tp.partition)
            highwater = consumer.highwater(tp)
            if owned is None or highwater is None:
                continue
            position = owned.positions.get(tp.topic, 0)
            lag = max(0, highwater - position)
            lags[(tp.topic, tp.partition)] = lag
            self.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
        return LagReading(lags)

    def forget_pool(self, name: str) -> None:
        """A pool moved to another instance: stop exporting its gauges here."""
        for gauge in (
            self.hosts_up,
            self.hosts_held,
            self.hosts_full,
            self.vms,
            self.empty_hosts,
            self.cpu_overflow,
            self.lifetime_groups,
            self.lifetime_groups_bound,
            self.lifetime_lookups_past_bound,
            self.lifetime_groups_reclaimed,
        ):
            _remove(gauge, name)
        for gauge in (self.utilisation, self.stranded):
            for resource in ("cpu", "memory"):
                _remove(gauge, name, resource)
        self.evictions.forget_pool(name)


class EvictionMetrics:
    """``lavad_state_evicted_total{pool, state}``: entries a capped store forgot."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.evicted = Counter(
            "lavad_state_evicted",
            "Entries a capped per-pool store evicted (least recently seen first): state ="
            " usage_histories (GPA's histories of VMs not placed), limit_jobs ([limits]"
            " max_jobs), replica_deployments ([limits] max_deployments), refused_vms"
            " ([pools] max_refused), awaited_requests (shadow mode, the same bound)",
            ["pool", "state"],
            registry=registry,
        )
        # The count each (pool, state) had at the last refresh.
        self._exported: dict[tuple[str, str], int] = {}

    def refresh(self, pool: PoolRuntime) -> None:
        """Add to each counter what its store evicted since the last refresh."""
        for state, count in eviction_counts(pool).items():
            key = (pool.name, state)
            # A pool reopened from an older snapshot counts from less than
            # was exported: a counter never goes down, so it waits for the
            # count to pass what it showed.
            grown = count - self._exported.get(key, 0)
            if grown > 0:
                self.evicted.labels(pool.name, state).inc(grown)
                self._exported[key] = count
            elif key not in self._exported:
                self.evicted.labels(pool.name, state)
                self._exported[key] = count

    def forget_pool(self, name: str) -> None:
        """A pool moved to another instance: stop exporting its counters here."""
        for pool, state in [key for key in self._exported if key[0] == name]:
            del self._exported[(pool, state)]
            try:
                self.evicted.remove(pool, state)
            except KeyError:
                continue


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        return
