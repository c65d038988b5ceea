"""Admission control in the engine: deployment events in, admission decisions out.

A pool with an admission policy keeps a ``ClusterModel`` of its admitted
deployments. An arrival is decided by the policy (and refused, whatever
the policy says, if it would not fit in the capacity now); the decision is
published. A scale-out of an admitted deployment is granted while the
capacity allows; a refused one is the SLA failure the policies trade
utilisation against, and it is published too, so the failure rate can be
counted downstream. Scale-ins give cores back and feed the posteriors.
Events of deployments that were refused (or never arrived) are counted and
dropped. The moment rows are recomputed from scratch every
``refresh_s`` of event time, as the offline replay does.

Priors cannot be guessed: a moment policy needs them from configuration
(``lavad evaluate admission`` prints the ones it fits on a trace).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from lavad.core.admission.cluster import PAPER_HORIZONS_S, ClusterModel, LookaheadGrid
from lavad.core.admission.policies import AdmissionDecision, AdmissionPolicy
from lavad.core.admission.registry import build_admission_policy
from lavad.models.deployments.process import DeploymentPriors
from lavad.streams.schema import DeploymentArrival, DeploymentScaleIn, DeploymentScaleOut


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    policy: str
    args: dict[str, Any]
    capacity_cores: float
    priors: DeploymentPriors
    refresh_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the engine publishes: a decision on an arrival or a scale-out."""

    request: Literal["arrival", "scale_out"]
    deployment_id: str
    time: float
    admitted: bool
    policy: str
    reason: str
    cores: float
    explanation: dict[str, Any]


class PoolAdmission:
    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.policy: AdmissionPolicy = build_admission_policy(config.policy, config.args)
        # The zeroth moment policy reads no moments; one look-ahead keeps the model cheap.
        grid = self.policy.grid or LookaheadGrid((PAPER_HORIZONS_S[-1],), 1)
        self.cluster = ClusterModel(config.priors, grid, config.capacity_cores)
        self.admitted: set[str] = set()
        self.counters: Counter[str] = Counter()
        self._next_refresh = float("-inf")

    def _refresh(self, now: float) -> None:
        if now >= self._next_refresh:
            self.cluster.refresh(now)
            self._next_refresh = now + self.config.refresh_s

    def on_arrival(self, event: DeploymentArrival, now: float) -> Verdict:
        self._refresh(now)
        deployment = event.deployment_id
        if deployment in self.cluster.states:
            self.counters["arrival_of_an_admitted_deployment"] += 1
            return self._verdict("arrival", event.deployment_id, now, event.cores, None)
        decision = self.policy.decide(self.cluster, deployment, event.cores, now)
        fits = self.cluster.active_cores + event.cores <= self.cluster.capacity
        admitted = decision.admitted and fits
        if admitted:
            self.cluster.add(deployment, now, event.cores)
        self.counters["admitted" if admitted else "refused"] += 1
        return self._verdict("arrival", deployment, now, event.cores, decision, fits=fits)

    def on_scale_out(self, event: DeploymentScaleOut, now: float) -> Verdict | None:
        self._refresh(now)
        deployment = event.deployment_id
        if deployment not in self.cluster.states:
            self.counters["scale_out_of_an_unknown_deployment"] += 1
            return None
        fits = self.cluster.active_cores + event.cores <= self.cluster.capacity
        self.counters["scale_outs"] += 1
        if fits:
            self.cluster.scale_out(deployment, now, event.cores)
        else:
            self.counters["scale_outs_refused"] += 1
        active = self.cluster.active_cores
        reason = (
            f"granted: {active:g} of {self.cluster.capacity:g} cores active"
            if fits
            else f"refused: {event.cores:g} more cores do not fit"
            f" ({active:g} of {self.cluster.capacity:g} active)"
        )
        return Verdict(
            "scale_out",
            deployment,
            now,
            fits,
            self.policy.name,
            reason,
            event.cores,
            {"active_cores": active, "capacity": self.cluster.capacity},
        )

    def on_scale_in(self, event: DeploymentScaleIn, now: float) -> None:
        self._refresh(now)
        if event.deployment_id not in self.cluster.states:
            self.counters["scale_in_of_an_unknown_deployment"] += 1
            return
        if self.cluster.scale_in(event.deployment_id, now, event.cores):
            self.counters["deployments_ended"] += 1

    @property
    def scale_out_failure_rate(self) -> float:
        total = self.counters["scale_outs"]
        return self.counters["scale_outs_refused"] / total if total else 0.0

    def _verdict(
        self,
        request: Literal["arrival", "scale_out"],
        deployment: str,
        now: float,
        cores: float,
        decision: AdmissionDecision | None,
        *,
        fits: bool = True,
    ) -> Verdict:
        if decision is None:
            return Verdict(
                request, deployment, now, True, self.policy.name, "already admitted", cores, {}
            )
        reason = decision.reason if fits else f"{decision.reason}; does not fit now"
        return Verdict(
            request,
            deployment,
            now,
            decision.admitted and fits,
            decision.policy,
            reason,
            cores,
            {
                "threshold": decision.threshold,
                "binding_horizon_s": decision.binding_horizon_s,
                "binding_lookahead_s": decision.binding_lookahead_s,
                "failure_probability": decision.failure_probability,
                "active_cores": self.cluster.active_cores,
                "capacity": self.cluster.capacity,
            },
        )
