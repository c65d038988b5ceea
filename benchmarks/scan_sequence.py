"""The default LAS scan on runs of consecutive real scans, floors carried from scan to scan.

Whole replays move by 10-15% from one run to the next on a shared box, more
than a change to the scan is worth, and the scan's floors only pay across
consecutive scans (an epoch: the same thresholds array, time going on), so
``stranding_scan``'s kept states, one every few dozen scans, cannot show
them. This benchmark replays the Azure dev split once with the default LAS
(the tolerant scan, ``core/placement/tolerant_scan.py``) and keeps runs of
``--length`` consecutive scans, one run every ``--every`` scans: each scan's
pool, request and host quantiles (brought up to date first, as the scan
would), and the policy's floors as the run began. Then it times the
compiled scan over each run in order, the floors evolving as in the replay,
in two ways interleaved, in CPU time, best of ``--rounds``:

* as the product runs it: a kept floor that is still its host's exact cost
  is taken without a search (``kernels._costed``);
* the baseline: the same scan with every floor's exact-until reset before
  each scan (outside the timing), so a kept host is searched again, as it
  was before floors kept their exact-until.

Both must decide as the replay did. The calls go through numba's dispatcher,
so each includes its dispatch (a few microseconds the product's entry point
does not pay); the difference between the two is the floors' own effect.

It wraps the scan's entry point (``TolerantDirect.refreshed``) for the one
replay and restores it after; the product is not changed.

    .venv/bin/python -m benchmarks.scan_sequence [--every 10000] [--length 300]
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lifetime_throughput import ROOT
from benchmarks.stranding_scan import BUNDLED, SHARED
from lavad.core.placement import kernels, lifetime_policy, tolerant_scan
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace

# The name under which the lifetime policies resolve the tolerant scan's entry points.
WARM_UP = "warm_up_tolerant"


class Run:
    """Consecutive scans of one replay: the floors as the first began, then each scan."""

    def __init__(self, floor: np.ndarray, marks: np.ndarray) -> None:
        self.floor = floor.copy()
        self.marks = marks.copy()
        # Per scan: pool, request, preference, LAS input, quantile stamps,
        # probe, epoch, stranding; then the replay's result and first tie
        # (an earlier scan's when none fits).
        self.scans: list[tuple[Any, ...]] = []


def keep_runs(path: Path, every: int, length: int) -> list[Run]:
    """Replay ``path`` with the default LAS, keeping ``length`` consecutive scans every
    ``every`` scans."""
    settings = load_settings(ROOT / "config" / "lavad.toml")
    runs: list[Run] = []
    scans = 0

    def capturing(original: Callable[..., Any]) -> Callable[..., Any]:
        def scan(*args: Any) -> Any:
            nonlocal scans
            pool, scanned, preferred, thresholds, ties, probe, floor, marks, epoch = args[:9]
            tracker, model, strand = args[9:12]
            position = scans % every
            scans += 1
            if position >= length:
                return original(*args)
            if position == 0:
                runs.append(Run(floor, marks))
            n = scanned[0]
            # The scan refreshes stale hosts itself; the copy is taken after the
            # same refresh, so the timed scans need none.
            kernels.Direct.refresh_host_quantiles(n, tracker, model)
            free, inv_capacity, unschedulable, present, weights = pool
            kept_pool = (
                np.ascontiguousarray(free[:, :n]), np.ascontiguousarray(inv_capacity[:, :n]),
                unschedulable[:n].copy(), present.copy(), weights.copy(),
            )  # fmt: skip
            las = (
                tracker[2][kernels.HOST_EXIT][:n].copy(), thresholds, True, thresholds,
                tracker[4][:n].copy(), True,
            )  # fmt: skip
            stamps = tracker[3][kernels.QUANTILES_STAMP][:n].copy()
            state = (kept_pool, scanned, (preferred[0][:n].copy(), preferred[1]), las, stamps)
            result = original(*args)
            runs[-1].scans.append((*state, probe, epoch, strand, tuple(result), int(ties[0])))
            return result

        return scan

    warm_up: Callable[[], None] = getattr(lifetime_policy, WARM_UP)

    def warm_up_and_keep() -> None:
        warm_up()
        tolerant_scan.TolerantDirect.refreshed = capturing(tolerant_scan.TolerantDirect.refreshed)

    setattr(lifetime_policy, WARM_UP, warm_up_and_keep)
    try:
        trace = open_trace(path, seed=0)
        config = settings.engine_config("las", trace_has_hosts=trace.has_hosts)
        replay(trace.events(), config, end_time=trace.end_time, decisions_out=io.BytesIO())
    finally:
        setattr(lifetime_policy, WARM_UP, warm_up)
        warm_up()
    return [run for run in runs if run.scans]


def time_runs(runs: list[Run], reuse: bool) -> tuple[float, int, int]:
    """CPU seconds over every kept scan, how many decided as the replay did, and how many."""
    no_tracker, no_model = kernels.no_refresh()
    scan = tolerant_scan._tolerant_scan
    total = 0.0
    agree = 0
    count = 0
    for run in runs:
        size = max(run.floor.shape[1], *(kept[1][0] for kept in run.scans))
        floor = np.zeros(size)
        until = np.full(size, -np.inf)
        marks = np.full((2, size), -1, dtype=np.int64)
        width = run.floor.shape[1]
        floor[:width], until[:width] = run.floor
        marks[:, :width] = run.marks
        stamps = np.zeros(size, dtype=np.int64)
        for (
            pool,
            scanned,
            preferred,
            las,
            kept_stamps,
            probe,
            epoch,
            strand,
            result,
            first,
        ) in run.scans:
            n = scanned[0]
            stamps[:n] = kept_stamps
            ties = np.zeros(n + 1, dtype=np.int64)
            if not reuse:
                until.fill(-np.inf)
            floors = (floor, marks[0], marks[1], stamps, epoch, True, until)
            began = time.process_time()
            got = scan(
                pool, scanned, preferred, las, ties, probe, floors, False, no_tracker, no_model,
                strand,
            )  # fmt: skip
            total += time.process_time() - began
            # With no host that fits, the tie buffer holds an earlier scan's hosts.
            agree += tuple(got) == result and (result[0] == 0 or int(ties[0]) == first)
            count += 1
    return total, agree, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=10_000, help="a run every this many scans")
    parser.add_argument("--length", type=int, default=300, help="consecutive scans a run")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.every < 1 or args.length < 1 or args.rounds < 1 or args.length > args.every:
        parser.error("--every, --length and --rounds must be >= 1, --length at most --every")
    path = SHARED if SHARED.exists() else BUNDLED
    if path == BUNDLED:
        print(f"{SHARED} not found: the bundled slice ({BUNDLED.name}) is used")
    runs = keep_runs(path, args.every, args.length)
    if not runs:
        raise SystemExit("no scan by host quantiles was kept: nothing to time")
    time_runs(runs, True)  # compile the dispatcher's path before timing
    best = {True: float("inf"), False: float("inf")}
    agreed = {True: 0, False: 0}
    count = 0
    for _ in range(args.rounds):
        for reuse in (True, False):
            seconds, agree, count = time_runs(runs, reuse)
            best[reuse] = min(best[reuse], seconds)
            agreed[reuse] = agree
    print(
        f"default LAS scan on {count:,} consecutive scans in {len(runs)} runs"
        f" (best of {args.rounds} rounds, CPU time, dispatch included)"
    )
    print(f"  exact floors taken without a search  {best[True] / count * 1e6:8.2f} us a scan")
    print(f"  every kept host searched again       {best[False] / count * 1e6:8.2f} us a scan")
    print(f"  ratio                                {best[True] / best[False]:8.2f}x")
    both = f"{agreed[True]:,} and {agreed[False]:,}"
    print(f"  decisions as in the replay           {both} of {count:,}")


if __name__ == "__main__":
    main()
