"""A global scheduler's view of every pool: eventually consistent, built from summaries.

The view takes a summary only from the pool's registered owner and only if it is newer
than the one it holds; on top of it, the scheduler's own launches the owner had not yet
processed (``seq`` after the summary's ``seen_seq``) are applied again, so an in-flight
launch never looks free. A summary from anyone else is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from lavad.federation.matching import first_fit
from lavad.federation.messages import PoolSummary, RunningTask
from lavad.federation.topology import Topology


class GlobalView:
    def __init__(self, gm: int, topology: Topology, owners: dict[int, str], tenants: int) -> None:
        self.gm = gm
        self.topology = topology
        self.owners = dict(owners)
        self.free: list[npt.NDArray[np.int64]] = [p.capacity.copy() for p in topology.pools]
        self._own: list[bool] = [True] * len(topology.pools)  # free[p] is ours to write
        self.version = [0] * len(topology.pools)
        self.usage = np.zeros((len(topology.pools), tenants, len(topology.resources)), np.int64)
        # per pool, the tasks Algorithm 2 may pick victims from: a summary's, or the live
        # scheduler's read-through view of the verdicts (running_tasks.py)
        self.running: list[Iterable[RunningTask]] = [() for _ in topology.pools]
        # pool -> seq -> (host, demand): launches sent, not yet reflected by a summary
        self.pending: list[dict[int, tuple[int, npt.NDArray[np.int64]]]] = [
            {} for _ in topology.pools
        ]
        self.epoch = 0  # rises whenever the view changes: parked requests may retry
        # per pool: (partition kind, demand, constraints) -> Algorithm 1's answer, valid
        # until the pool's view changes (a cache: the answer is the same, just not recomputed)
        self._fits: list[dict[tuple[str, tuple[int, ...], int], tuple[int, int]]] = [
            {} for _ in topology.pools
        ]
        self.refused_summaries: list[str] = []

    def apply(self, summary: PoolSummary) -> str | None:
        """Take ``summary``; the reason it was refused, or None."""
        pool = summary.pool
        owner = self.owners.get(pool)
        if owner is None:
            return self._refuse(f"summary for unknown pool {pool} from {summary.owner!r}")
        if summary.owner != owner:
            return self._refuse(
                f"summary for pool {pool} from {summary.owner!r}, not its owner {owner!r}"
            )
        if summary.free.shape != self.free[pool].shape:
            return self._refuse(f"summary for pool {pool} has shape {summary.free.shape}")
        if summary.version <= self.version[pool]:
            return "older"  # not an error: a newer summary overtook it
        self.version[pool] = summary.version
        seen = summary.seen_seq[self.gm] if self.gm < len(summary.seen_seq) else 0
        pending = self.pending[pool]
        for seq in [s for s in pending if s <= seen]:
            del pending[seq]
        if pending:
            free = summary.free.copy()
            for host, demand in pending.values():
                free[host] -= demand
            self.free[pool] = free
            self._own[pool] = True
        else:
            self.free[pool] = summary.free  # read-only, shared: copied on first write
            self._own[pool] = False
        self._fits[pool].clear()
        self.usage[pool] = summary.tenant_usage
        if summary.running is not None:
            self.running[pool] = summary.running
        self.epoch += 1
        return None

    def reserve(self, pool: int, host: int, demand: npt.NDArray[np.int64], seq: int) -> None:
        """A launch sent: count it as used until a summary reflects it."""
        self._writable(pool)[host] -= demand
        self.pending[pool][seq] = (host, demand)

    def forget(self, pool: int, seq: int) -> None:
        """A refused launch: the owner's summary that came with it is the truth."""
        self.pending[pool].pop(seq, None)

    def release(self, pool: int, host: int, demand: npt.NDArray[np.int64]) -> None:
        """One of this scheduler's tasks ended (the notice carried no newer summary)."""
        self._writable(pool)[host] += demand
        self.epoch += 1

    def fit(
        self, pool: int, kind: str, demand: npt.NDArray[np.int64], constraints: int
    ) -> tuple[int, int]:
        """Algorithm 1 on ``pool``'s internal (``kind`` "internal") or external partitions:
        ``(host or -1, hosts scanned)``."""
        key = (kind, tuple(demand.tolist()), constraints)
        cache = self._fits[pool]
        found = cache.get(key)
        if found is None:
            p = self.topology.pools[pool]
            candidates = p.internal(self.gm) if kind == "internal" else p.external(self.gm)
            found = first_fit(self.free[pool], p.labels, candidates, demand, constraints)
            cache[key] = found
        return found

    def tenant_usage(self) -> npt.NDArray[np.int64]:
        """Each tenant's resources across the pools, as the view has them."""
        total: npt.NDArray[np.int64] = self.usage.sum(axis=0)
        return total

    def _writable(self, pool: int) -> npt.NDArray[np.int64]:
        self._fits[pool].clear()
        if not self._own[pool]:
            self.free[pool] = self.free[pool].copy()
            self._own[pool] = True
        return self.free[pool]

    def _refuse(self, reason: str) -> str:
        self.refused_summaries.append(reason)
        if len(self.refused_summaries) > 1000:
            del self.refused_summaries[:500]
        return reason
