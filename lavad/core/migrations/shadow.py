"""Orders compared beside the acting one, on the same drains and the same exits.

This is the paper's LARS simulator (section 5.1): the drains are those that
really happened, at most ``max_concurrent`` migrations run at a time for
``duration_s`` each, VMs exit when they exit, and only the order changes.
A shadow moves nothing and publishes nothing; it assumes, as the paper's
simulator does, that every migration finds a target. It counts migrations
and the VMs that exited before their turn, so one replay compares any
number of orders without the noise of placements diverging between runs.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lavad.core.cluster import ClusterState
from lavad.core.migrations.lifetimes import RemainingLifetimes
from lavad.core.migrations.orders import MigrationOrder, Queued


@dataclass(eq=False)
class ShadowOrder:
    label: str
    order: MigrationOrder
    lifetimes: RemainingLifetimes
    max_concurrent: int = field(kw_only=True)
    duration_s: float = field(kw_only=True)
    # By sequence: a VM the acting order moved onto a host that drains
    # later is in the list twice, as in the paper's list of migrations.
    queue: dict[int, Queued] = field(init=False, default_factory=dict)
    _entries: dict[str, list[int]] = field(init=False, default_factory=dict)
    in_flight: list[float] = field(init=False, default_factory=list)
    _sequence: int = field(init=False, default=0)
    counters: Counter[str] = field(init=False, default_factory=Counter)

    @property
    def next_deadline(self) -> float:
        return self.in_flight[0] if self.in_flight else float("inf")

    def on_drain(self, cluster: ClusterState, host: int, vm_ids: list[str], now: float) -> None:
        for vm_id in vm_ids:
            self._sequence += 1
            self.queue[self._sequence] = Queued(vm_id, host, self._sequence)
            self._entries.setdefault(vm_id, []).append(self._sequence)
        self.counters["scheduled"] += len(vm_ids)
        self._dispatch(cluster, now)

    def on_released(self, vm_id: str, *, exited: bool) -> None:
        """Exited before its turn: one migration fewer. Evicted: it leaves uncounted."""
        for sequence in self._entries.pop(vm_id, ()):
            del self.queue[sequence]
            if exited:
                self.counters["exited_before_migration"] += 1

    def forget_host(self, host: int) -> None:
        for queued in [q for q in self.queue.values() if q.host == host]:
            self._forget(queued)

    def advance(self, cluster: ClusterState, now: float) -> None:
        while self.in_flight and self.in_flight[0] <= now:
            heapq.heappop(self.in_flight)
        self._dispatch(cluster, now)

    def _dispatch(self, cluster: ClusterState, now: float) -> None:
        free = self.max_concurrent - len(self.in_flight)
        if free <= 0 or not self.queue:
            return
        lifetimes = self.lifetimes
        remaining = {
            q.vm_id: lifetimes.remaining(cluster, q.vm_id, now) for q in self.queue.values()
        }
        for queued in self.order.rank(list(self.queue.values()), remaining.__getitem__)[:free]:
            self._forget(queued)
            self.counters["migrations"] += 1
            heapq.heappush(self.in_flight, now + self.duration_s)

    def _forget(self, queued: Queued) -> None:
        del self.queue[queued.sequence]
        entries = self._entries[queued.vm_id]
        entries.remove(queued.sequence)
        if not entries:
            del self._entries[queued.vm_id]

    def summary(self) -> dict[str, Any]:
        return {
            "order": self.order.name,
            "lifetimes": self.lifetimes.name,
            "scheduled": self.counters["scheduled"],
            "migrations": self.counters["migrations"],
            "exited_before_migration": self.counters["exited_before_migration"],
            "still_queued": len(self.queue),
        }
