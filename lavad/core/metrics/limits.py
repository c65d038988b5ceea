"""Counts of the state a pool forgets to stay bounded.

Five stores keyed by names from the input are capped, each evicting its
least recently seen entry past the cap and counting it:

- GPA's usage histories of VMs the pool has not placed (``HostUsage``,
  ``MAX_UNPLACED``),
- the limit recommenders of jobs (``[limits] max_jobs``),
- the replica scalers of deployments (``[limits] max_deployments``),
- the refused VMs the pool remembers to absorb their exits and number their
  retries (``[pools] max_refused``),
- in shadow mode, the requests awaiting the existing scheduler's vm.placed
  (the same bound; the followed pool's ``awaited``).

An eviction is lost state (a usage entry starts again from its prior; a
forgotten refused VM's exit is dead-lettered as unknown and its retry takes
its first decision id again), so a counter that keeps rising says the cap is
too small for the stream, or that the stream names too many things. The stores keep plain running
counts in the pool's state (they survive snapshots); the live shell
exports them as Prometheus counters (``EvictionMetrics`` in
``live/telemetry.py``: the core imports no Prometheus).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from lavad.core.placement.gpa import UsageHooks

if TYPE_CHECKING:
    from lavad.core.engine import PoolRuntime

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
    # The refused VMs, and in shadow mode the awaited requests (``forgotten``).
    counts.update(pool.forgotten())
    return counts
