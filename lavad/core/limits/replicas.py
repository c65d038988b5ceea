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
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from lavad.models.limits.histogram import HOUR_S, INTERVAL_S
from lavad.models.limits.horizontal import HorizontalConfig
from lavad.models.limits.replicas import DeploymentWindows, ReplicaDecision, ReplicaTracker
from lavad.streams.schema import UsageSample


@dataclass(frozen=True, slots=True)
class ScalerConfig:
    """The ``[limits.scaler]`` table: Autopilot's horizontal scaler (``HorizontalConfig``).

    The defaults are the paper's (and ``HorizontalConfig``'s); the settings
    check each key at start-up by the constraints below, and ``horizontal``
    checks the whole again where code builds one directly.
    """

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    target_utilization: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="r*: the deployment's usage statistic over this is the replica count",
        ),
    ] = 0.7
    horizon_s: Annotated[
        float,
        Field(gt=0, description="T: the usage statistic's look-back"),
    ] = 72 * HOUR_S
    statistic: Annotated[
        Literal["max", "p95"],
        Field(description="of the deployment's summed CPU usage over the horizon"),
    ] = "max"
    downscale_delay_s: Annotated[
        float,
        Field(
            ge=0,
            description="T_d: a lower count waits until it has been the need this long",
        ),
    ] = 48 * HOUR_S
    halving_s: Annotated[
        float,
        Field(gt=0, description="surplus replicas halve over this time"),
    ] = HOUR_S
    small_change: Annotated[
        float,
        Field(
            ge=0,
            lt=1,
            description="a change below this fraction of the current count is deferred",
        ),
    ] = 0.1
    max_initializing: Annotated[
        float,
        Field(
            gt=0,
            description="at most this times the current count may be initialising (growth)",
        ),
    ] = 0.5
    init_s: Annotated[
        float,
        Field(gt=0, description="how long an added replica initialises"),
    ] = INTERVAL_S
    min_replicas: Annotated[int, Field(ge=1, description="never fewer replicas than this")] = 1

    def horizontal(self) -> HorizontalConfig:
        """The scaler's configuration (validated again by ``HorizontalConfig``)."""
        return HorizontalConfig(
            target_utilization=self.target_utilization,
            horizon_s=self.horizon_s,
            statistic=self.statistic,
            downscale_delay_s=self.downscale_delay_s,
            halving_s=self.halving_s,
            small_change=self.small_change,
            max_initializing=self.max_initializing,
            init_s=self.init_s,
            min_replicas=self.min_replicas,
        )


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
