"""The live relief on a real usage trace, through the engine: relief off against on.

Usage traces (bitbrains-rnd, azure-v1-cpu...) carry samples, no requests.
This replays one time-aligned window through the live ``Engine`` as a pool
would live it: the history's samples first (the VMs are not placed yet;
the GPA hooks learn their moments, as for a sample that comes before its
request), then every usage series requests ``cores`` at the future's start
on hosts of ``capacity`` cores (one per VM, so no request is refused), then
the future's samples, with ``[migrations.relief]`` off and on. It reports
what the daemon itself measures from the requests on: the realised
overflow frequency of its host windows (``UsageHooks``), the hosts in use
(mean over samples) and the migrations published.

Run: ``python -m lavad.evaluation.gpa_live_relief ../shared/data/bitbrains-rnd
--window 7``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lavad.core.engine import Engine, EngineConfig, PoolSetup
from lavad.core.migrations.config import MigrationsConfig
from lavad.core.migrations.relief_rule import ReliefConfig
from lavad.core.placement.gpa import UsageHooks
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.console import out
from lavad.models.usage.drift import DriftConfig
from lavad.streams.adapters import open_trace
from lavad.streams.schema import HostUp, Migration, UsageSample, VmRequest

DAY_S = 86_400.0
POOL = "p"


@dataclass(frozen=True, slots=True)
class LiveReliefRun:
    rho: float
    relief: bool
    vms: int
    host_windows: int
    overflow: float
    hosts_mean: float
    migrations: int
    # Relief moves the planner found no host for (the pool's fit test refused all).
    without_target: int = 0

    @property
    def q_over_rho(self) -> float:
        return self.overflow / self.rho


def window_samples(
    path: Path, window: int, history_days: int, future_days: int
) -> tuple[list[UsageSample], list[str], float]:
    """The window's samples (pool ``p``, time order), the series in both parts, the split."""
    start = window * DAY_S
    split = start + history_days * DAY_S
    end = split + future_days * DAY_S
    in_window = [
        event
        for event in open_trace(path).events()
        if isinstance(event, UsageSample) and start < event.time <= end
    ]
    pools = sorted({event.pool for event in in_window})
    if len(pools) > 1:
        # One engine pool takes the samples: two pools' VMs of one id would merge.
        raise ValueError(
            f"{path}: the window holds {len(pools)} pools ({', '.join(pools[:5])}"
            f"{', ...' if len(pools) > 5 else ''}); the live relief replays one"
        )
    samples = [dataclasses.replace(event, pool=POOL) for event in in_window]
    samples.sort(key=lambda sample: (sample.time, sample.vm_id))
    before = {s.vm_id for s in samples if s.time <= split}
    after = {s.vm_id for s in samples if s.time > split}
    return samples, sorted(before & after), split


def _hooks(engine: Engine) -> UsageHooks:
    hooks = engine.pools[POOL].policy.hooks
    if not isinstance(hooks, UsageHooks):
        raise TypeError(f"the gpa pool's hooks are {type(hooks).__name__}, not UsageHooks")
    return hooks


def live_relief_run(
    samples: Sequence[UsageSample],
    vms: Sequence[str],
    split: float,
    rho: float,
    relief: bool,
    *,
    cores: float = 1.0,
    capacity: float = 1.0,
    drift: DriftConfig | None = None,
) -> LiveReliefRun:
    """One pass of the window through a fresh engine (see the module docstring); ``drift``:
    the relief's per-VM regime-change detection (``[migrations.relief.drift]``)."""
    config = ReliefConfig(enabled=relief, drift=drift or DriftConfig())
    engine = Engine(
        EngineConfig(
            policy="gpa",
            policy_args=validate_policy_args("gpa", {"rho": rho}),
            pools=PoolSetup(),
            migrations=MigrationsConfig(relief=config),
        )
    )
    first = samples[0].time if samples else split
    for index in range(len(vms)):
        host = HostUp(
            time=first, pool=POOL, host_id=f"h{index:03d}", cores=capacity, memory_gib=1e6
        )
        engine.handle(host, first)
    requested = False
    windows = overflows = migrations = 0
    in_use: list[int] = []
    for sample in samples:
        if not requested and sample.time > split:
            for vm_id in vms:
                request = VmRequest(time=split, pool=POOL, vm_id=vm_id, cores=cores, memory_gib=1.0)
                engine.handle(request, split)
            requested = True
            hooks = _hooks(engine)
            windows, overflows = -hooks.host_windows, -hooks.host_overflows
        decisions = engine.handle(sample, sample.time).decisions
        migrations += sum(
            1 for d in decisions if isinstance(d, Migration) and d.action == "migrate"
        )
        if requested:
            cluster = engine.pools[POOL].cluster
            in_use.append(int(np.count_nonzero(cluster.vm_count[: cluster.n_hosts])))
    hooks = _hooks(engine)
    windows += hooks.host_windows
    overflows += hooks.host_overflows
    return LiveReliefRun(
        rho,
        relief,
        len(vms),
        windows,
        overflows / windows if windows else 0.0,
        float(np.mean(in_use)) if in_use else 0.0,
        migrations,
        int(engine.pools[POOL].migrations.counters.get("relief_without_target", 0)),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--window", type=int, default=7, help="first history day")
    parser.add_argument("--history-days", type=int, default=14)
    parser.add_argument("--future-days", type=int, default=7)
    parser.add_argument("--rhos", default="0.1,0.05,0.01")
    parser.add_argument(
        "--drift", choices=("off", "cusum"), default="off", help="the relief's drift detector"
    )
    args = parser.parse_args(argv)
    drift = DriftConfig(detector=args.drift)
    try:
        samples, vms, split = window_samples(
            args.path, args.window, args.history_days, args.future_days
        )
    except ValueError as error:
        parser.error(str(error))
    for rho in (float(part) for part in args.rhos.split(",")):
        for relief in (False, True):
            run = live_relief_run(samples, vms, split, rho, relief, drift=drift)
            out.print(
                f"window {args.window} rho {rho:g} relief {'on' if relief else 'off'}:"
                f" {run.vms} VMs, {run.host_windows} host windows, overflow"
                f" {run.overflow:.4f} (q/rho {run.q_over_rho:.2f}), hosts in use"
                f" {run.hosts_mean:.2f}, {run.migrations} migrations,"
                f" {run.without_target} relief moves without a target",
            )


if __name__ == "__main__":
    main()
