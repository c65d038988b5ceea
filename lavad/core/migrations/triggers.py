"""Which hosts lavad drains for defragmentation, and when.

``EmptyShareTrigger`` (the paper's defragmenter, section 4.4): every
``check_interval_s`` of event time, when the share of empty hosts open for
placement falls below ``empty_below``, drain enough hosts to bring it back,
at most ``max_draining_hosts`` at a time. The hosts chosen have the fewest
VMs, then the most excess resources (mean free fraction of CPU and memory):
the cheapest to empty. A host is only chosen when the other open hosts have,
in total, the free capacity its VMs need.

``RecordedDrains`` replays a schedule of (time, host) drains instead, so that
migration orders are compared on the same drains, as the paper does ("LARS
does not affect which hosts are picked"). ``RollingDrains`` is rolling
maintenance: a batch of hosts at a time, round the pool.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from lavad.core.cluster import ClusterState
from lavad.core.migrations.config import DefragConfig, RollingConfig


class DrainTrigger(Protocol):
    @property
    def next_check(self) -> float:
        """When the trigger next wants to look (inf: never)."""

    def due(self, cluster: ClusterState, now: float, draining: int) -> list[int]:
        """Hosts to start draining at ``now`` (``draining``: defrag drains in progress)."""


class NoTrigger:
    next_check = float("inf")

    def due(self, cluster: ClusterState, now: float, draining: int) -> list[int]:
        return []


class EmptyShareTrigger:
    def __init__(self, config: DefragConfig) -> None:
        self.config = config
        self.next_check = float("-inf")

    def due(self, cluster: ClusterState, now: float, draining: int) -> list[int]:
        config = self.config
        self.next_check = now + config.check_interval_s
        n = cluster.n_hosts
        in_service = cluster.hosts_up
        room = config.max_draining_hosts - draining
        if not in_service or room <= 0:
            return []
        open_hosts = cluster.schedulable[:n]
        empty_open = int(np.count_nonzero(open_hosts & (cluster.vm_count[:n] == 0)))
        wanted = math.ceil(config.empty_below * in_service) - empty_open - draining
        if wanted <= 0:
            return []
        return choose_hosts_to_drain(cluster, min(wanted, room))


def choose_hosts_to_drain(cluster: ClusterState, count: int) -> list[int]:
    """Up to ``count`` open, non-empty hosts: fewest VMs, then most excess, then column."""
    n = cluster.n_hosts
    candidates = np.flatnonzero(cluster.schedulable[:n] & (cluster.vm_count[:n] > 0))
    if not len(candidates):
        return []
    free_fraction = (cluster.free[:2, candidates] * cluster.inv_capacity[:2, candidates]).mean(
        axis=0
    )
    # lexsort: the last key is the primary one.
    ranked = candidates[np.lexsort((candidates, -free_fraction, cluster.vm_count[candidates]))]
    spare = cluster.free[:, :n][:, cluster.schedulable[:n]].sum(axis=1)
    chosen: list[int] = []
    for host in ranked.tolist():
        used = cluster.capacity[:, host] - cluster.free[:, host]
        # Its VMs must fit in what the other open hosts have free (theirs, not its own).
        rest = spare - cluster.free[:, host]
        if np.all(used <= rest):
            chosen.append(host)
            spare = rest - used
            if len(chosen) == count:
                break
    return chosen


class RecordedDrains:
    """Drains at recorded times; a host that is empty, draining or down then is skipped."""

    def __init__(self, schedule: tuple[tuple[float, str], ...]) -> None:
        self._schedule = sorted(schedule)
        self._next = 0
        self.skipped = 0

    @property
    def next_check(self) -> float:
        return self._schedule[self._next][0] if self._next < len(self._schedule) else float("inf")

    def due(self, cluster: ClusterState, now: float, draining: int) -> list[int]:
        hosts: list[int] = []
        schedule = self._schedule
        while self._next < len(schedule) and schedule[self._next][0] <= now:
            host = cluster.host_index.get(schedule[self._next][1])
            self._next += 1
            if host is None or not cluster.schedulable[host] or not cluster.vm_count[host]:
                self.skipped += 1
                continue
            hosts.append(host)
        return hosts


class RollingDrains:
    """Rolling maintenance: the next ``batch`` hosts, in column order, every ``every_s``."""

    def __init__(self, config: RollingConfig) -> None:
        self.config = config
        self.next_check = config.start_s
        self._cursor = 0
        self.skipped = 0

    def due(self, cluster: ClusterState, now: float, draining: int) -> list[int]:
        config = self.config
        self.next_check = now + config.every_s
        hosts: list[int] = []
        for _ in range(min(config.batch, cluster.n_hosts)):
            host = self._cursor % cluster.n_hosts
            self._cursor += 1
            if not cluster.schedulable[host] or not cluster.vm_count[host]:
                self.skipped += 1
                continue
            hosts.append(host)
        return hosts
