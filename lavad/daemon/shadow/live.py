"""Shadow mode in the live shell: what changes at construction, and nothing after.

With ``[shadow] enabled`` the shell passes the ``Shadow`` strategy to its
engine (``shadow/engine.py``) and takes from here a telemetry with the
per-side gauges and topic names that send every decision kind to the shadow
topic, so lavad's side's decisions are published there as advice and never
on the placements (or any other decision) topic. Dead letters stay where
they are.
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import Gauge
from pydantic import Field

from lavad.core.engine import PoolRuntime
from lavad.core.metrics.pool import CORES, MEMORY
from lavad.daemon.live.telemetry import Telemetry
from lavad.daemon.settings import Settings
from lavad.daemon.shadow.compare import empty_hosts_difference
from lavad.daemon.shadow.engine import ShadowPool
from lavad.streams.kafka.topics import TopicNames
from lavad.streams.schema import DecisionKind

SIDES: Final = ("actual", "lavad")


class ShadowTopicNames(TopicNames):
    """The configured topics, but every decision goes to ``shadow`` (the advice topic)."""

    shadow: str = Field(default="lavad.shadow", min_length=1, max_length=249)

    def for_decision(self, kind: DecisionKind) -> str:
        return self.shadow

    def named(self) -> dict[str, str]:
        return {
            "vm_events": self.vm_events,
            "deployments": self.deployments,
            "usage": self.usage,
            "shadow": self.shadow,
            "dead_letters": self.dead_letters,
        }

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.shadow, self.dead_letters)

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.inputs, *self.outputs)


def topic_names(settings: Settings) -> TopicNames:
    """The topics the daemon reads and writes (``lavad topics create`` makes these)."""
    base = settings.topics.model_dump()
    if settings.shadow.enabled:
        return ShadowTopicNames(**base, shadow=settings.shadow.topic)
    return TopicNames(**base)


class ShadowTelemetry(Telemetry):
    """The usual gauges describe the actual cluster; ``lavad_shadow_*`` both sides.

    ``side`` is "actual" (the cluster as the existing scheduler runs it) or
    "lavad" (the counterfactual pool lavad's policy runs).
    """

    def __init__(self) -> None:
        super().__init__()
        self.side_empty_hosts = self.gauge(
            "lavad_shadow_pool_empty_hosts_ratio",
            "Hosts up with no VM / hosts up, per side (actual, lavad)",
            "pool",
            "side",
        )
        self.side_hosts_used = self.gauge(
            "lavad_shadow_pool_hosts_used",
            "Hosts up holding at least one VM, per side",
            "pool",
            "side",
        )
        self.side_utilisation = self.gauge(
            "lavad_shadow_pool_utilisation_ratio",
            "Booked / capacity over hosts up, per side",
            "pool",
            "side",
            "resource",
        )
        self.side_stranded = self.gauge(
            "lavad_shadow_pool_stranded_ratio",
            "Free capacity no request of the recent mix can use (latest sample), per side",
            "pool",
            "side",
            "resource",
        )
        self.side_failures = self.gauge(
            "lavad_shadow_pool_placement_failures",
            "Requests not placed (actual: no vm.placed yet or ever; lavad: refused), per side",
            "pool",
            "side",
        )
        self.agreement = self.gauge(
            "lavad_shadow_agreement_ratio",
            "VMs both sides placed on the same host (match=host) or on hosts of the same"
            " LAVA class in lavad's pool (match=class), over VMs both placed",
            "pool",
            "match",
        )
        self.difference = self.gauge(
            "lavad_shadow_empty_hosts_difference_ratio",
            "Lavad minus actual empty hosts over the measured window (sampled), with the"
            " bounds of its 95% batch-means interval (bound=mean, low, high)",
            "pool",
            "bound",
        )

    def refresh_pool(self, pool: PoolRuntime) -> None:
        if not isinstance(pool, ShadowPool) or pool.actual is None:
            super().refresh_pool(pool)
            return
        super().refresh_pool(pool.actual)
        for side, runtime in (("actual", pool.actual), ("lavad", pool)):
            self._refresh_side(pool.name, side, runtime)
        agreement = pool.agreement
        if agreement.compared:
            self.agreement.labels(pool.name, "host").set(agreement.same_host / agreement.compared)
        if agreement.class_compared:
            self.agreement.labels(pool.name, "class").set(
                agreement.same_class / agreement.class_compared
            )
        metrics = pool.metrics
        until = metrics.last if metrics.last is not None else float("-inf")
        diff = empty_hosts_difference(
            pool.actual.metrics.series, metrics.series, metrics.measure_from, until
        )
        if diff["mean_pp"] is not None:
            self.difference.labels(pool.name, "mean").set(diff["mean_pp"] / 100.0)
        if diff["ci95_pp"] is not None:
            low, high = diff["ci95_pp"]
            self.difference.labels(pool.name, "low").set(low / 100.0)
            self.difference.labels(pool.name, "high").set(high / 100.0)

    def _refresh_side(self, name: str, side: str, pool: PoolRuntime) -> None:
        cluster = pool.cluster
        up = cluster.hosts_up
        self.side_empty_hosts.labels(name, side).set(cluster.hosts_empty / up if up else 0.0)
        self.side_hosts_used.labels(name, side).set(up - cluster.hosts_empty)
        used, capacity = cluster.used_total, cluster.capacity_total
        for resource, index in (("cpu", CORES), ("memory", MEMORY)):
            share = used[index] / capacity[index] if capacity[index] else 0.0
            self.side_utilisation.labels(name, side, resource).set(share)
        if pool.metrics.stranding:
            latest = pool.metrics.stranding[-1]
            self.side_stranded.labels(name, side, "cpu").set(latest.cpu_pct / 100.0)
            self.side_stranded.labels(name, side, "memory").set(latest.memory_pct / 100.0)
        metrics = pool.metrics
        self.side_failures.labels(name, side).set(metrics.unfit_retryable + metrics.unfit_final)

    def forget_pool(self, name: str) -> None:
        super().forget_pool(name)
        for side in SIDES:
            for gauge in (self.side_empty_hosts, self.side_hosts_used, self.side_failures):
                _remove(gauge, name, side)
            for resource in ("cpu", "memory"):
                _remove(self.side_utilisation, name, side, resource)
                _remove(self.side_stranded, name, side, resource)
        for match in ("host", "class"):
            _remove(self.agreement, name, match)
        for bound in ("mean", "low", "high"):
            _remove(self.difference, name, bound)


def _remove(gauge: Gauge, *labels: Any) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        return
