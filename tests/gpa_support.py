"""Helpers of the GPA tests: a CPU usage sample, and a placement booked as the engine books it."""

from __future__ import annotations

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest, Policy
from lavad.streams.schema import UsageSample, UsageStats


def cpu_sample(vm_id: str, time: float, cpu: float) -> UsageSample:
    return UsageSample(
        time=time, pool="p", vm_id=vm_id, interval_s=300.0, cpu=UsageStats(mean=cpu, peak=cpu)
    )


def place_and_book(policy: Policy, cluster: ClusterState, vm_id: str, now: float) -> int | None:
    """Place a 4-core, 8 GiB VM; book it and tell the policy's hooks, as the engine does."""
    request = PlacementRequest(vm_id, (4.0, 8.0, 0.0, 0.0), "", None, now)
    result = policy.place(cluster, request)
    if not isinstance(result, Placed):
        return None
    record = cluster.book(vm_id, result.host, request.demand, "", now)
    policy.hooks.on_booked(cluster, record, now, None)
    return result.host
