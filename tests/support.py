"""Helpers shared by test modules (imported as ``support``; not a fixture module)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from lavad.core.cluster import FIT_TOLERANCE, ClusterState, FloatArray
from lavad.core.placement.framework import PlacementRequest, PlacementResult
from lavad.core.placement.registry import build_policy, validate_policy_args
from lavad.core.placement.waste import NO_MEMORY, RequestMix, waste_costs
from lavad.daemon.replay import ReplayResult, replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def replay_trace(path: Path, policy: str, seed: int) -> tuple[bytes, ReplayResult]:
    """Replay ``path`` with the default configuration (and LAVAD_* overrides).

    Returns the decisions file's bytes and the replay's result.
    """
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml").model_copy(
        update={"seed": seed}
    )
    trace = open_trace(path, seed=seed)
    sink = io.BytesIO()
    result = replay(
        trace.events(),
        settings.engine_config(policy, trace_has_hosts=trace.has_hosts),
        end_time=trace.end_time,
        decisions_out=sink,
    )
    return sink.getvalue(), result


def added_waste(
    cluster: ClusterState,
    demand: tuple[float, ...],
    shapes: list[tuple[float, float, float, float]],
) -> tuple[float, FloatArray]:
    """Each host's added waste for ``demand`` (cores and memory weighed 1) against the
    mix of ``shapes``, as a guarded policy with ``mix_refresh = 1`` measures it; and
    the least (inf when no host fits)."""
    mix = RequestMix(window=100, max_shapes=8, refresh_every=1)
    for shape in shapes:
        mix.add(shape)
    costs = np.zeros(cluster.n_hosts)
    least = waste_costs(
        cluster.free,
        cluster.inv_capacity,
        cluster.unschedulable,
        cluster.n_hosts,
        np.array(demand),
        (np.array([1.0, 1.0, 0.0, 0.0]), mix.directions, mix.minimal, FIT_TOLERANCE),
        costs,
        NO_MEMORY,
    )
    return least, costs


def guarded_choice(
    cluster: ClusterState,
    policy: str,
    tolerance: float,
    demand: tuple[float, float],
    deployment: str,
    mix: list[tuple[float, float, float, float]],
) -> tuple[PlacementResult, float, FloatArray]:
    """``policy`` under the waste guard at ``tolerance`` (its mix refreshed at every
    request), warmed up on ``mix``, places one request of ``demand`` (cores, memory)
    of ``deployment``. Returns the result, and ``added_waste`` of that request
    against the mix the policy then holds (the warm-up's and the request's)."""
    args = validate_policy_args(policy, {"waste_tolerance": tolerance, "mix_refresh": 1})
    built = build_policy(policy, args, np.random.default_rng(7))
    for i, shape in enumerate(mix):
        built.place(cluster, PlacementRequest(f"warm{i}", shape, "", None, float(i)))
    request = PlacementRequest("v", (*demand, 0.0, 0.0), deployment, None, 10.0)
    result = built.place(cluster, request)
    least, costs = added_waste(cluster, request.demand, [*mix, request.demand])
    return result, least, costs


def pool_with_free(
    free: list[tuple[float, float]], capacity: tuple[float, float, float, float]
) -> ClusterState:
    """Hosts of ``capacity`` with ``free`` cores and GiB left, each used by one VM."""
    cluster = ClusterState()
    for h, (cores, memory) in enumerate(free):
        cluster.add_host(f"h{h}", capacity)
        used = (capacity[0] - cores, capacity[1] - memory, 0.0, 0.0)
        if used[0] or used[1]:
            cluster.book(f"resident{h}", h, used, "", 0.0)
    return cluster
