"""Placement latency at a fixed pool size, against a recompute-per-request baseline.

The pool holds N hosts of the default shape (48 cores, 192 GiB), filled to a
steady occupancy with real Azure V1 VM shapes drawn by their frequency in the
trace. Each measured step places one request and releases one random resident
VM, so occupancy stays put. The baseline, timed in the same process on the
same state, is the plain numpy Best Fit the issue describes: it recomputes
every host's free capacity from the VM list on each request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest
from lavad.core.placement.registry import build_policy, validate_policy_args

HOST = (48.0, 192.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class LatencyFigures:
    policy: str
    hosts: int
    p50_us: float
    p99_us: float
    occupancy_pct: float


def _filled_pool(
    hosts: int,
    policy_name: str,
    shapes: Sequence[tuple[float, float]],
    weights: np.ndarray,
    rng: np.random.Generator,
    target: float,
) -> tuple[ClusterState, list[str]]:
    """``hosts`` default-shape hosts filled by ``policy_name`` to ``target`` CPU occupancy."""
    cluster = ClusterState()
    for h in range(hosts):
        cluster.add_host(f"h{h}", HOST)
    policy = build_policy(policy_name, validate_policy_args(policy_name, {}), rng)
    resident: list[str] = []
    capacity = cluster.capacity_total[0]
    i = 0
    while cluster.used_total[0] < target * capacity:
        cores, memory = shapes[int(rng.choice(len(shapes), p=weights))]
        request = PlacementRequest(f"fill{i}", (cores, memory, 0.0, 0.0), "", None, 0.0)
        i += 1
        result = policy.place(cluster, request)
        if not isinstance(result, Placed):
            break
        cluster.book(request.vm_id, result.host, request.demand, "", 0.0)
        resident.append(request.vm_id)
    return cluster, resident


def measure(
    policy_name: str,
    hosts: int,
    shapes: Sequence[tuple[float, float]],
    weights: np.ndarray,
    *,
    steps: int = 3_000,
    occupancy: float = 0.7,
    seed: int = 7,
) -> LatencyFigures:
    rng = np.random.default_rng(seed)
    cluster, resident = _filled_pool(hosts, policy_name, shapes, weights, rng, occupancy)
    policy = build_policy(policy_name, validate_policy_args(policy_name, {}), rng)
    samples = np.empty(steps)
    draws = rng.choice(len(shapes), p=weights, size=steps)
    for step in range(steps):
        cores, memory = shapes[int(draws[step])]
        request = PlacementRequest(f"m{step}", (cores, memory, 0.0, 0.0), "", None, 0.0)
        began = time.perf_counter_ns()
        result = policy.place(cluster, request)
        samples[step] = (time.perf_counter_ns() - began) / 1_000.0
        if isinstance(result, Placed):
            cluster.book(request.vm_id, result.host, request.demand, "", 0.0)
            resident.append(request.vm_id)
        victim = resident.pop(int(rng.integers(len(resident))))
        cluster.release(victim)
    return LatencyFigures(
        policy=policy_name,
        hosts=hosts,
        p50_us=float(np.percentile(samples, 50)),
        p99_us=float(np.percentile(samples, 99)),
        occupancy_pct=100.0 * cluster.used_total[0] / cluster.capacity_total[0],
    )


def measure_recompute_baseline(
    hosts: int,
    shapes: Sequence[tuple[float, float]],
    weights: np.ndarray,
    *,
    steps: int = 1_000,
    occupancy: float = 0.7,
    seed: int = 7,
) -> LatencyFigures:
    """Best Fit that rebuilds free capacity from the VM list on every request."""
    rng = np.random.default_rng(seed)
    cluster, resident = _filled_pool(hosts, "bestfit", shapes, weights, rng, occupancy)
    vm_host = np.array([cluster.vms[v].host for v in resident], dtype=np.int64)
    vm_cores = np.array([cluster.vms[v].demand[0] for v in resident])
    vm_memory = np.array([cluster.vms[v].demand[1] for v in resident])
    cap_cores = np.full(hosts, HOST[0])
    cap_memory = np.full(hosts, HOST[1])
    samples = np.empty(steps)
    draws = rng.choice(len(shapes), p=weights, size=steps)
    for step in range(steps):
        cores, memory = shapes[int(draws[step])]
        began = time.perf_counter_ns()
        free_cores = cap_cores - np.bincount(vm_host, weights=vm_cores, minlength=hosts)
        free_memory = cap_memory - np.bincount(vm_host, weights=vm_memory, minlength=hosts)
        fits = (free_cores >= cores) & (free_memory >= memory)
        score = (free_cores - cores) / cap_cores + (free_memory - memory) / cap_memory
        score[~fits] = np.inf
        host = int(np.argmin(score))
        samples[step] = (time.perf_counter_ns() - began) / 1_000.0
        victim = int(rng.integers(len(vm_host)))
        vm_host[victim] = host
        vm_cores[victim] = cores
        vm_memory[victim] = memory
    return LatencyFigures(
        policy="recompute-bestfit (baseline)",
        hosts=hosts,
        p50_us=float(np.percentile(samples, 50)),
        p99_us=float(np.percentile(samples, 99)),
        occupancy_pct=100.0 * float(vm_cores.sum()) / float(cap_cores.sum()),
    )
