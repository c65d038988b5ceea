"""Replica recommendations per deployment from the usage stream (Autopilot 3.3, live).

``horizontal.py`` holds the scaler of one job; this module feeds it from a
stream of per-VM usage samples, as the daemon receives them:

- ``DeploymentWindows`` files each VM's CPU usage under its deployment's
  5-minute window (the window ends at ``ceil(time / 300) * 300``, as the
  vertical recommenders' ``JobAggregator`` does). When the window closes,
  the deployment's total usage is the sum over its VMs of each VM's mean CPU
  in the window, and the VMs that reported are its observed replica count.
- ``ReplicaTracker`` keeps one ``HorizontalScaler`` per deployment and emits
  a ``ReplicaDecision`` when the recommended count changes (and the first
  time a deployment is seen), with what the scaler computed on the way.

Units: usage samples are fractions of each VM's request, so the sum is in
units of one VM of the deployment, which is the scaler's unit (one task's
limit) exactly when the deployment's VMs share a size, as Autopilot's tasks
of a job do (and as the DLRM apps' instances do).

The scaler runs closed-loop, as in the offline evaluation
(``evaluation/limits_horizontal.py``): it starts from the replicas observed
in the deployment's first window and then follows its own recommendation
(growth limited by initialising replicas, slow decay), because nothing on
the stream says whether an operator applied it; the observed count is
reported alongside in every decision.

Deployments are named by the input, so a flood of new names must not grow
the state without bound: at most ``max_deployments`` scalers are kept, the
least recently observed is evicted past that (counted in ``evicted``), and
an evicted deployment that comes back starts afresh.

Time is always an argument (the window's end in event time), never a clock.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Literal

import orjson

from lavad.models.argument_checks import require_at_least
from lavad.models.limits.histogram import INTERVAL_S
from lavad.models.limits.horizontal import HorizontalConfig, HorizontalScaler
from lavad.models.limits.open_windows import OpenWindows
from lavad.models.recency import touch

# Why the published count is what it is, relative to the stabilised target.
Step = Literal["first", "at-target", "growth-limited", "decaying"]


@dataclass(frozen=True, slots=True)
class ReplicaDecision:
    """A new replica count for one deployment, and the scaler's arithmetic behind it."""

    digest: str
    time: float
    deployment: str
    replicas: int
    previous: int | None
    observed_replicas: int
    window_usage: float
    usage_statistic: float
    raw: int
    stabilized: int
    step: Step
    statistic: str
    target_utilization: float
    horizon_s: float
    downscale_delay_s: float

    def explanation(self) -> str:
        """One line a person can read."""
        was = "first" if self.previous is None else f"was {self.previous}"
        return (
            f"{self.replicas} replicas ({was}; {self.observed_replicas} reporting): "
            f"{self.statistic} of total CPU over {self.horizon_s / 3600:g} h "
            f"{self.usage_statistic:.4g} / target {self.target_utilization:g} -> {self.raw}, "
            f"held {self.downscale_delay_s / 3600:g} h -> {self.stabilized}, {self.step}"
        )


def replica_digest(deployment: str, time: float, replicas: int) -> str:
    """Deterministic: the same inputs give the same digest on every replay."""
    # A JSON array, not a joined string: a name holding a separator cannot
    # make two tuples hash alike.
    key = orjson.dumps(["replicas", deployment, time, replicas])
    return hashlib.blake2b(key, digest_size=12).hexdigest()


@dataclass(slots=True)
class _Members:
    # Per VM: the sum and count of its CPU means in the window.
    usage: dict[str, list[float]] = field(default_factory=dict)


class DeploymentWindows:
    """Per-deployment 5-minute windows of per-VM CPU usage."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be a finite number > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self._open: OpenWindows[_Members] = OpenWindows()

    def add(self, deployment: str, vm_id: str, time: float, cpu_mean: float) -> None:
        """File a VM's mean CPU over ``[time - interval, time)`` (a fraction of its request)."""
        if not (math.isfinite(cpu_mean) and cpu_mean >= 0):
            raise ValueError(f"cpu_mean must be finite and >= 0, got {cpu_mean!r}")
        end = math.ceil(time / self.interval_s) * self.interval_s
        members = self._open.get(end, deployment, _Members)
        acc = members.usage.setdefault(vm_id, [0.0, 0.0])
        acc[0] += cpu_mean
        acc[1] += 1.0

    def close(self, now: float) -> list[tuple[float, str, float, int]]:
        """(end, deployment, total usage, VMs reporting) of every window ended by ``now``."""
        result = []
        for end, deployment, members in self._open.close(now):
            total = math.fsum(s / n for s, n in members.usage.values())
            result.append((end, deployment, total, len(members.usage)))
        return result


class ReplicaTracker:
    """One ``HorizontalScaler`` per deployment; a decision whenever its count changes."""

    def __init__(self, config: HorizontalConfig, max_deployments: int = 10_000) -> None:
        require_at_least(1, max_deployments=max_deployments)
        self.config = config
        self.max_deployments = max_deployments
        self.scalers: dict[str, HorizontalScaler] = {}
        # Deployments in least-recently-observed order (a dict keeps insertion order).
        self._order: dict[str, None] = {}
        self.evicted = 0

    @property
    def deployments(self) -> int:
        return len(self.scalers)

    def _touch(self, deployment: str) -> None:
        for oldest in touch(self._order, deployment, self.max_deployments):
            self.scalers.pop(oldest, None)
            self.evicted += 1

    def observe(
        self, time: float, deployment: str, total_usage: float, observed: int
    ) -> ReplicaDecision | None:
        """Learn one closed window; a decision when the recommended count changed."""
        self._touch(deployment)
        cfg = self.config
        scaler = self.scalers.get(deployment)
        first = scaler is None
        if scaler is None:
            scaler = self.scalers[deployment] = HorizontalScaler(
                cfg, replicas=max(cfg.min_replicas, observed)
            )
        previous = scaler.replicas
        replicas = scaler.observe(time, total_usage)
        if not first and replicas == previous:
            return None
        step: Step
        if first:
            step = "first"
        elif replicas < scaler.stabilized:
            step = "growth-limited"
        elif replicas > scaler.stabilized:
            step = "decaying"
        else:
            step = "at-target"
        return ReplicaDecision(
            digest=replica_digest(deployment, time, replicas),
            time=time,
            deployment=deployment,
            replicas=replicas,
            previous=None if first else previous,
            observed_replicas=observed,
            window_usage=total_usage,
            usage_statistic=scaler.usage_statistic,
            raw=scaler.raw,
            stabilized=scaler.stabilized,
            step=step,
            statistic=cfg.statistic,
            target_utilization=cfg.target_utilization,
            horizon_s=cfg.horizon_s,
            downscale_delay_s=cfg.downscale_delay_s,
        )
