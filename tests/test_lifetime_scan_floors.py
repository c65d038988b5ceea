"""The LAS floors kept between scans change no decision.

``LifetimePolicy`` keeps, per host, a lower bound of its LAS cost from
earlier scans while the VMs placed score with the same thresholds and time
goes forward (``lifetime_scan``). Batches of one tenant's
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
from lavad.core.placement.kernels import _costed, _kept_floor
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
    return results, policy._floors.epoch


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


def test_a_reused_exact_cost_is_the_cost_a_search_gives_as_time_crosses_thresholds() -> None:
    """A kept floor is taken without a search while ``now`` is at most the time it
    stays exact until (``kernels._exact_until``). Time here steps onto, just
    before and just after the very instants where a host quantile's remaining
    life reaches a threshold (the floating-point edge the margin guards), and
    every cost ``_costed`` returns is the one numpy's search gives afresh."""
    rng = np.random.default_rng(11)
    hosts, quantiles = 30, 8
    # Thresholds below 0 (never reached), at 0 and above; quantile exits in
    # the past, ahead, NaN (a stale host) and infinite.
    thresholds = np.sort(np.concatenate([rng.uniform(-80.0, 900.0, 61), [0.0]]))
    host_q = np.sort(rng.uniform(-100.0, 1_200.0, (hosts, quantiles)), axis=1)
    host_q[3] = np.nan
    host_q[4, -2:] = np.inf
    host_exit = host_q[:, -1].copy()
    stamp = np.zeros(hosts, dtype=np.int64)
    floor = np.zeros(hosts)
    until = np.full(hosts, -np.inf)
    marks = np.full((2, hosts), -1, dtype=np.int64)
    floors = (floor, marks[0], marks[1], stamp, 1, True, until)
    las = (host_exit, thresholds, True, thresholds, host_q, True)
    # The instants a remaining life reaches a threshold, and their neighbours.
    edges = (host_q[:, :, None] - thresholds[None, None, :]).ravel()
    edges = np.sort(rng.choice(edges[np.isfinite(edges) & (edges > 0.0)], 120, replace=False))
    times = np.sort(
        np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf)])
    )
    reused = changed = 0
    previous = np.full(hosts, np.nan)
    for now in times:
        remaining = np.maximum(host_q, now) - now
        # numpy's search per quantile; a NaN remaining life counts every threshold.
        above = len(thresholds) - np.searchsorted(thresholds, remaining, side="left")
        expected = np.where(np.isnan(remaining), len(thresholds), above).sum(axis=1)
        for h in range(hosts):
            kept = bool(_kept_floor(h, *floors[1:6]))
            reused += kept and now <= until[h]
            got = _costed(h, las, float(now), float(now), floors, np.inf, kept)
            assert got == expected[h], (h, now)
        changed += int((expected != previous)[~np.isnan(previous)].sum())
        previous = expected.astype(float)
    # Not vacuous: most costs were reused, and time did move costs on.
    assert reused > len(times) * hosts // 2
    assert changed > 50
