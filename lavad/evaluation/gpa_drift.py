"""river's drift detectors against the hand-written CUSUM, on the usage traces.

``python -m lavad.evaluation.gpa_drift ../shared/data/bitbrains-rnd ...``

Per trace, each VM's CPU readings on the aligned grid (``gpa_aligned``),
at most ``--vms`` VMs (the first in the trace's order), each half of the
trace apart. Each detector sees one reading per window, in time order:

* ``cusum``: ``models/usage/drift.py`` (the daemon's), given the reading
  and the VM's running mean and sigma before it;
* ``page-hinkley``: ``river.drift.PageHinkley`` on the reading standardised
  by the same running mean and sigma (and clipped as the CUSUM clips it),
  with delta = the CUSUM's allowance and threshold = its threshold (the
  nearest river has to it);
* ``adwin``: ``river.drift.ADWIN`` (delta 0.002) on the raw reading;
* ``kswin``: ``river.drift.KSWIN`` (alpha 0.005, window 100, seeded) on the
  raw reading.

Every detector is asked only once the running moments have the CUSUM's
warm-up of readings; after an alarm the moments restart from nothing (all
detectors alike) and river's detectors keep their own state (they reset
themselves).

Two figures per detector and part: **alarms per VM-day** on the recorded
series (every alarm there is either a real change or a false one; the
daemon pays a reset for each), and, on the same series with a step of
``k`` sigmas (the VM's own sigma over the part, floored at the CUSUM's
``min_sigma``) added from the middle of its readings on,
**the delay** in windows from the step to the first alarm after it, and the
share of VMs never alarmed after the step (missed). Plus the CPU cost per
reading (microseconds, this machine). Offline only: river stays out of the
daemon unless this shows it earns its place.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lavad.core.cluster import FloatArray
from lavad.daemon.console import out
from lavad.evaluation.gpa_aligned import DAY_STEPS, _windows
from lavad.evaluation.river_lifetime import river_module
from lavad.models.usage.drift import CusumDrift, DriftConfig

Detector = Callable[[float, float, float], bool]
DETECTORS = ("cusum", "page-hinkley", "adwin", "kswin")


def _make(name: str, config: DriftConfig, seed: int) -> Detector:
    """A fresh detector: called with (reading, running mean, running sigma); True on alarm."""
    if name == "cusum":
        cusum = CusumDrift(config, 1)

        def step_cusum(raw: float, mean: float, sigma: float) -> bool:
            # Warm-up is counted by the caller (it gates the call): always testing here.
            return cusum.update_one(0, raw, mean, sigma, config.warmup)

        return step_cusum
    drift = river_module("drift")
    if name == "page-hinkley":
        detector: Any = drift.PageHinkley(
            min_instances=1, delta=config.allowance, threshold=config.threshold
        )
        use_z = True
    elif name == "adwin":
        detector, use_z = drift.ADWIN(delta=0.002), False
    elif name == "kswin":
        detector, use_z = drift.KSWIN(alpha=0.005, window_size=100, stat_size=30, seed=seed), False
    else:
        raise ValueError(f"unknown detector {name!r}")

    clip = config.clip

    def step_river(raw: float, mean: float, sigma: float) -> bool:
        z = max(-clip, min(clip, (raw - mean) / max(sigma, config.min_sigma)))
        detector.update(z if use_z else raw)
        return bool(detector.drift_detected)

    return step_river


def run_series(series: FloatArray, name: str, config: DriftConfig, seed: int) -> list[int]:
    """Indices of the readings that raised an alarm (NaN readings skipped)."""
    detect = _make(name, config, seed)
    count = 0
    mean = spread = 0.0
    alarms: list[int] = []
    for index, raw in enumerate(series.tolist()):
        if not math.isfinite(raw):
            continue
        sigma = math.sqrt(spread / (count - 1)) if count > 1 else 0.0
        # The warm-up gates every detector the same way: none is asked before
        # the moments it is compared with have ``warmup`` readings.
        if count >= config.warmup and detect(raw, mean, sigma):
            alarms.append(index)
            count = 0
            mean = spread = 0.0
        count += 1
        delta = raw - mean
        mean += delta / count
        spread += delta * (raw - mean)
    return alarms


def update_cost(name: str, config: DriftConfig, readings: int = 20_000) -> float:
    """Microseconds per update of the detector alone, on a seeded series (no moments,
    no trace): the figure the daemon pays per usage sample, best of three runs."""
    rng = np.random.default_rng(0)
    series = rng.normal(0.2, 0.02, readings).tolist()
    best = math.inf
    for _ in range(3):
        detect = _make(name, config, 0)
        start = time.perf_counter()
        for value in series:
            detect(value, 0.2, 0.02)
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / readings


def _parts(path: Path, vms: int) -> Iterator[tuple[str, str, FloatArray]]:
    for part in ("first", "second"):
        trace, _, full, _, _ = _windows(path, None, None, part)
        yield trace, part, full[:vms]


def study(
    paths: list[Path], vms: int, step_sigmas: float, seed: int, config: DriftConfig
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        for trace, part, matrix in _parts(path, vms):
            rng = np.random.default_rng(seed)
            for name in DETECTORS:
                alarms = readings = 0
                delays: list[int] = []
                missed = 0
                spent = 0.0
                for row in matrix:
                    seen = np.isfinite(row)
                    if seen.sum() < 2 * config.warmup:
                        continue
                    start = time.perf_counter()
                    alarms += len(run_series(row, name, config, int(rng.integers(1 << 31))))
                    spent += time.perf_counter() - start
                    readings += int(seen.sum())
                    # The middle of the VM's own readings (a Google job reads one day).
                    finite = np.flatnonzero(seen)
                    middle = int(finite[len(finite) // 2])
                    stepped = row.copy()
                    # sigma floored as the CUSUM floors it: a smaller step is no
                    # change worth a reset for any detector (under 5% of the request).
                    sigma = max(float(np.nanstd(row)), config.min_sigma)
                    stepped[middle:] += step_sigmas * sigma
                    after = [
                        index
                        for index in run_series(stepped, name, config, int(rng.integers(1 << 31)))
                        if index >= middle
                    ]
                    if after:
                        delays.append(after[0] - middle + 1)
                    else:
                        missed += 1
                vm_days = readings / DAY_STEPS
                rows.append(
                    {
                        "trace": trace,
                        "part": part,
                        "detector": name,
                        "vms": len(delays) + missed,
                        "alarms_per_vm_day": alarms / vm_days if vm_days else 0.0,
                        "delay_median": float(np.median(delays)) if delays else None,
                        "delay_p90": float(np.percentile(delays, 90)) if delays else None,
                        "missed": missed / max(1, len(delays) + missed),
                        "us_per_reading": 1e6 * spent / readings if readings else 0.0,
                    }
                )
                out.print(_line(rows[-1]), markup=False)
    return rows


def _line(row: dict[str, Any]) -> str:
    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    return (
        f"| {row['trace']} | {row['part']} | {row['detector']} | {row['vms']} "
        f"| {row['alarms_per_vm_day']:.3f} | {number(row['delay_median'])} "
        f"| {number(row['delay_p90'])} | {row['missed']:.2f} | {row['us_per_reading']:.1f} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--vms", type=int, default=40, help="VMs per trace at most")
    parser.add_argument("--step", type=float, default=5.0, help="injected step in sigmas")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--persistence", type=int, default=DriftConfig().persistence)
    parser.add_argument(
        "--cost-only", action="store_true", help="only each detector's cost per update"
    )
    args = parser.parse_args(argv)
    config = DriftConfig(detector="cusum", persistence=args.persistence)
    if args.cost_only:
        for name in DETECTORS:
            out.print(f"{name}: {update_cost(name, config):.2f} us per update", markup=False)
        return
    if args.vms < 1:
        parser.error("--vms must be >= 1")
    if not (math.isfinite(args.step) and args.step > 0):
        parser.error("--step must be > 0")
    out.print(
        "| trace | part | detector | VMs | alarms / VM-day | delay median | delay p90 "
        "| missed | us / reading |\n|---|---|---|---|---|---|---|---|---|",
        markup=False,
    )
    study(args.paths, args.vms, args.step, args.seed, config)


if __name__ == "__main__":
    main()
