"""Prometheus counters of the usage state a pool forgets to stay bounded.

Three stores keyed by names from the usage stream are capped, each
evicting its least recently seen entry past the cap and counting it:

- GPA's usage histories of VMs the pool has not placed (``HostUsage``,
  ``MAX_UNPLACED``),
- the limit recommenders of jobs (``[limits] max_jobs``),
- the replica scalers of deployments (``[limits] max_deployments``).

An eviction is lost state (the entry starts again from its prior), so a
counter that keeps rising says the cap is too small for the stream, or
that the stream names too many things. The stores keep plain running
counts in the pool's state (they survive snapshots); ``refresh`` turns
each pool's counts into Prometheus counters by adding what grew since the
last refresh, so a scrape between refreshes sees the last value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter

from lavad.daemon.placement.gpa import UsageHooks

if TYPE_CHECKING:
    from lavad.daemon.engine import PoolRuntime

# The capped stores, by the ``state`` label their counter carries.
USAGE_HISTORIES: Final = "usage_histories"
LIMIT_JOBS: Final = "limit_jobs"
REPLICA_DEPLOYMENTS: Final = "replica_deployments"


def eviction_counts(pool: PoolRuntime) -> dict[str, int]:
    """Entries each capped store of ``pool`` has evicted so far (only the stores it has)."""
    counts: dict[str, int] = {}
    hooks = pool.policy.hooks
    if isinstance(hooks, UsageHooks):
        counts[USAGE_HISTORIES] = hooks.usage.evicted
    if pool.limits is not None:
        counts[LIMIT_JOBS] = pool.limits.tracker.evicted
    if pool.replicas is not None:
        counts[REPLICA_DEPLOYMENTS] = pool.replicas.tracker.evicted
    return counts


class EvictionMetrics:
    """``lavad_state_evicted_total{pool, state}``: entries a capped store forgot."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.evicted = Counter(
            "lavad_state_evicted",
            "Entries a capped per-pool store evicted (least recently seen first): state ="
            " usage_histories (GPA's histories of VMs not placed), limit_jobs ([limits]"
            " max_jobs), replica_deployments ([limits] max_deployments)",
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
