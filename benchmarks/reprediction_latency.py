"""Reprediction latency: E[T_r | T_u] per VM, one VM per call and in batches.

Life tables are fitted on the real Azure slice's lifetimes (exits as deaths,
VMs alive at the end censored), replicated over 200 feature groups so rows
are scattered as in a pool. The goal is a median <= 20 us per VM
(the LAVA paper's embedded model: 9 us).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.survival import Tables, expected_remaining, life_table, suffix_sums
from lavad.streams.adapters import open_trace
from lavad.streams.schema import VmExit, VmRequest


def _fitted(path: Path, bins: LifetimeBins, groups: int) -> tuple[np.ndarray, ...]:
    trace = open_trace(path, seed=0)
    started: dict[str, float] = {}
    lived: list[float] = []
    for event in trace.events():
        if isinstance(event, VmRequest):
            started[event.vm_id] = event.time
        elif isinstance(event, VmExit) and event.vm_id in started:
            lived.append(event.time - started.pop(event.vm_id))
    ages = np.array([trace.end_time - start for start in started.values()])
    deaths = np.bincount(bins.index(np.array(lived)), minlength=bins.count).astype(float)
    censored = np.bincount(bins.index(ages), minlength=bins.count).astype(float)
    mass = life_table(np.tile(deaths, (groups, 1)), np.tile(censored, (groups, 1)))
    m0, m1 = suffix_sums(mass, bins)
    return mass, m0, m1


def reprediction_latency(path: Path) -> None:
    bins = LifetimeBins.log_spaced()
    mass, m0, m1 = _fitted(path, bins, groups=200)
    tables = Tables(bins, mass, m0, m1)
    rng = np.random.default_rng(0)
    print("reprediction E[T_r | T_u] (life tables of the real Azure lifetimes, 200 groups)")
    for count in (1, 10, 100, 1_000, 10_000):
        rows = rng.integers(0, 200, count)
        uptimes = rng.uniform(0.0, 30 * 86_400.0, count)
        repeats = max(50, 20_000 // count)
        samples = []
        for _ in range(repeats):
            began = time.perf_counter_ns()
            expected_remaining(tables, rows, uptimes)
            samples.append((time.perf_counter_ns() - began) / count / 1e3)
        print(
            f"  {count:>6,} VMs per call   median {np.median(samples):8.2f} us per VM"
            f"   p99 {np.percentile(samples, 99):8.2f}"
        )
