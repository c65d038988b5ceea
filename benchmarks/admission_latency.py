"""Admission decision latency with N active deployments (goal: <= 5 ms at 500).

``python -m benchmarks.admission_latency``. Not a test: it prints figures.

The cluster holds N deployments with real histories: the alibaba-dlrm apps'
VM requests and exits up to the fitting window's end (``../shared/data``),
recycled to reach N when the trace has fewer apps, with priors fitted on them.
Each measured step is what the replay does per arrival (after one untimed
decision per arrival size, whose prior row is then cached): one other deployment
has had an event since the last decision (its moment row is dirty), then the
policy decides for a candidate. Figures for the paper's grid (5 horizons x 600
look-ahead times) and for a lighter one, and the cost of a full refresh of all
rows (the periodic timer, outside the decision path).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lavad.core.admission import ClusterModel, build_admission_policy
from lavad.evaluation.admission import fit_samples, load_vm_events
from lavad.models.deployments import DeploymentState
from lavad.models.deployments.fit import fit_priors

ROOT = Path(__file__).resolve().parents[1]
SHARED_DLRM = ROOT.parent / "shared" / "data" / "alibaba-dlrm"


@dataclass(frozen=True, slots=True)
class AdmissionLatency:
    policy: str
    deployments: int
    lookaheads: int
    p50_ms: float
    p99_ms: float
    refresh_ms: float


def _cluster(
    deployments: int, horizons_s: tuple[float, ...] | None, steps: int, path: Path
) -> tuple[ClusterModel, list[DeploymentState], float]:
    events = load_vm_events(path, "alibaba-dlrm")
    until = events[0].time + 0.3 * (events[-1].time - events[0].time)
    samples = fit_samples(events, until, arrived_only=False)
    priors = fit_priors(samples)
    args: dict[str, object] = {"steps": steps}
    if horizons_s is not None:
        args["horizons_s"] = horizons_s
    grid = build_admission_policy("second", args).grid
    if grid is None:
        raise RuntimeError("a moment policy must have a grid")
    live = [s.state for s in samples if s.state.cores > 0]
    cluster = ClusterModel(priors, grid, capacity=1e6)
    states: list[DeploymentState] = []
    for k in range(deployments):
        source = live[k % len(live)]
        state = DeploymentState(
            f"d{k}",
            source.arrived,
            source.cores,
            source.last_time,
            source.core_exposure,
            source.alive_time,
            source.core_deaths,
            source.scale_outs,
            source.excess_size,
        )
        cluster.states[state.deployment_id] = state
        cluster.active_cores += state.cores
        states.append(state)
    cluster.refresh(until)
    return cluster, states, until


def measure(
    policy_name: str,
    deployments: int = 500,
    *,
    horizons_s: tuple[float, ...] | None = None,
    steps: int = 600,
    decisions: int = 400,
    seed: int = 0,
    path: Path = SHARED_DLRM,
) -> AdmissionLatency:
    cluster, states, now = _cluster(deployments, horizons_s, steps, path)
    args: dict[str, object] = {"threshold": 0.5}
    if policy_name != "zeroth":
        args["steps"] = steps
        if horizons_s is not None:
            args["horizons_s"] = horizons_s
    policy = build_admission_policy(policy_name, args)
    rng = np.random.default_rng(seed)
    sizes = [8.0, 12.0, 48.0, 64.0, 96.0]
    began = time.perf_counter()
    cluster.refresh(now)
    refresh_ms = (time.perf_counter() - began) * 1e3
    for cores in sizes:
        # Arrival sizes repeat in a daemon: their prior rows are cached after the first one.
        policy.decide(cluster, "warm", cores, now)
    times: list[float] = []
    for k in range(decisions):
        now += 60.0
        victim = states[int(rng.integers(len(states)))]
        cluster.scale_out(victim.deployment_id, now, 8.0)  # one event since the last decision
        cores = sizes[k % len(sizes)]
        began = time.perf_counter()
        policy.decide(cluster, f"c{k}", cores, now)
        times.append(time.perf_counter() - began)
    values = np.asarray(times) * 1e3
    return AdmissionLatency(
        policy_name,
        deployments,
        len(cluster.taus),
        float(np.median(values)),
        float(np.percentile(values, 99)),
        refresh_ms,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--deployments", type=int, default=500)
    parser.add_argument("--path", type=Path, default=SHARED_DLRM)
    ns = parser.parse_args()
    if not ns.path.exists():
        raise SystemExit(f"alibaba-dlrm not found at {ns.path}")
    for steps, horizons in ((600, None), (100, (86400.0, 21600.0, 3600.0))):
        for name in ("zeroth", "first", "second"):
            fig = measure(name, ns.deployments, horizons_s=horizons, steps=steps, path=ns.path)
            print(
                f"{fig.policy:7s} deployments={fig.deployments} look-aheads={fig.lookaheads:5d} "
                f"p50={fig.p50_ms:.3f} ms p99={fig.p99_ms:.3f} ms "
                f"(full refresh {fig.refresh_ms:.1f} ms)"
            )


if __name__ == "__main__":
    main()
