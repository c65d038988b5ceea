"""Per-pool replica recommendations from the usage stream (``[limits] horizontal``).

The usage stream names VMs; a VM's deployment is what its request said
(``VmRecord.deployment``), so only usage of VMs the pool has placed (or
booked, in shadow mode) under a deployment reaches a scaler. The rest is
counted: ``unattributed`` samples, of VMs the pool does not hold or that
named no deployment. Windows close as the limits' do: once an event later
than a window's end arrives in the pool.

Off by default (``[limits] horizontal = false``), so that a replay or a
live daemon that was not asked for replicas publishes exactly what it did
before.
"""

from __future__ import annotations

import math

from lavad.models.limits.horizontal import HorizontalConfig
from lavad.models.limits.replicas import DeploymentWindows, ReplicaDecision, ReplicaTracker
from lavad.streams.schema import UsageSample


class PoolReplicas:
    """One pool's deployment windows and horizontal scalers."""

    def __init__(self, max_deployments: int, config: HorizontalConfig | None = None) -> None:
        self.windows = DeploymentWindows()
        self.tracker = ReplicaTracker(config or HorizontalConfig(), max_deployments)
        self.samples = 0
        self.unattributed = 0

    def on_usage(self, sample: UsageSample, deployment: str) -> None:
        """File a sample of a VM of ``deployment`` ("" when the pool knows none)."""
        if not deployment:
            self.unattributed += 1
            return
        self.windows.add(deployment, sample.vm_id, sample.time, sample.cpu.mean)
        self.samples += 1

    def close_before(self, now: float) -> list[ReplicaDecision]:
        """Decisions of every window that ended strictly before ``now``, in (end, name) order."""
        decisions = []
        for end, deployment, total, observed in self.windows.close(math.nextafter(now, -math.inf)):
            decision = self.tracker.observe(end, deployment, total, observed)
            if decision is not None:
                decisions.append(decision)
        return decisions

    def summary(self) -> dict[str, int]:
        """Counts for the replay summary: what was scaled, what was not, what was evicted."""
        return {
            "deployments": self.tracker.deployments,
            "samples": self.samples,
            "unattributed": self.unattributed,
            "evicted": self.tracker.evicted,
        }
