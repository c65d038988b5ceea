"""The LAS floors kept between scans change no decision.

``LifetimePolicy`` keeps, per host, a lower bound of its LAS cost from
earlier scans while the VMs placed score with the same thresholds and time
goes forward (``kernels._floored_lifetime_scan``). Batches of one tenant's
VMs of one shape, as the Azure trace has, keep one thresholds array for
many placements in a row; the compiled policy must still decide exactly as
the numpy pipeline does, with exits, refits and repredictions moving the
hosts' quantiles in between.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest, PlacementResult
from lavad.core.placement.lifetime_policy import LifetimePolicy
from lavad.core.placement.registry import build_policy, validate_policy_args
from lavad.streams.schema import VmRequest

SHAPES = [(1.0, 2.0), (2.0, 4.0), (4.0, 16.0), (8.0, 32.0)]


def _run(name: str, args: dict[str, Any], scan: bool) -> tuple[list[PlacementResult], int]:
    cluster = ClusterState()
    for h in range(20):
        cluster.add_host(f"h{h}", (32.0, 128.0, 0.0, 0.0))
    policy = build_policy(name, validate_policy_args(name, args), np.random.default_rng(4))
    assert isinstance(policy, LifetimePolicy)
    policy.scan = scan
    hooks = policy.hooks
    assert hooks is not None
    rng = np.random.default_rng(8)
    exits: list[tuple[float, str]] = []
    results: list[PlacementResult] = []
    now = 0.0
    i = 0
    for _ in range(90):  # batches
        tenant = f"t{rng.integers(4)}"
        cores, memory = SHAPES[int(rng.integers(len(SHAPES)))]
        typical = float(rng.choice([600.0, 5400.0, 40_000.0]))
        for _ in range(int(rng.integers(1, 12))):
            now += float(rng.exponential(20.0))
            for when, vm in sorted(exits):
                if when <= now and vm in cluster.vms:
                    if when >= hooks.next_deadline:
                        hooks.advance(cluster, when)
                    hooks.on_released(cluster, cluster.release(vm), when, exited=True)
            exits = [(w, v) for w, v in exits if v in cluster.vms]
            if now >= hooks.next_deadline:
                hooks.advance(cluster, now)
            vm_id = f"v{i}"
            i += 1
            event = VmRequest(
                time=now,
                pool="p",
                vm_id=vm_id,
                cores=cores,
                memory_gib=memory,
                tenant=tenant,
                features={"hour_of_day": int(now // 3600) % 24, "batch_size": 4},
            )
            demand = (cores, memory, 0.0, 0.0)
            result = policy.place(cluster, PlacementRequest(vm_id, demand, "", None, now, event))
            results.append(result)
            if isinstance(result, Placed):
                record = cluster.book(vm_id, result.host, demand, "", now)
                hooks.on_booked(cluster, record, now, event)
                exits.append((now + typical * float(rng.lognormal(0.0, 1.0)), vm_id))
        now += float(rng.exponential(900.0))
    return results, policy._epoch


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("las", {"refit_interval_s": 1800.0, "min_observations": 3}),
        ("lava", {"refit_interval_s": 1800.0, "min_observations": 3, "host_quantiles": 4}),
    ],
)
def test_floors_keep_the_pipelines_decisions(name: str, args: dict[str, Any]) -> None:
    compiled, epochs = _run(name, args, scan=True)
    pipeline, _ = _run(name, args, scan=False)
    assert compiled == pipeline
    placed = [r for r in compiled if isinstance(r, Placed)]
    # Not vacuous: floors were kept across placements (fewer epochs than
    # placements), the pool filled up at times, and ties were drawn.
    assert 0 < epochs < len(placed) // 2
    assert len(placed) < len(compiled)
    assert any(r.ties > 1 for r in placed)
