"""The default LAS scan on runs of consecutive real scans, floors carried from scan to scan.

Whole replays move by 10-15% from one run to the next on a shared box, more
than a change to the scan is worth, and the scan's floors only pay across
consecutive scans (an epoch: the same thresholds array, time going on), so
``stranding_scan``'s kept states, one every few dozen scans, cannot show
them. This benchmark replays the Azure dev split once with the default LAS
(``core/placement/lifetime_scan.py``) and keeps runs of
``--length`` consecutive scans, one run every ``--every`` scans: each scan's
pool, request and host quantiles (brought up to date first, as the scan
would) and the floor set it used (``floor_sets``), and the policy's floor
sets as the run began. Then it times the
compiled scan over each run in order, the floors evolving as in the replay,
in two ways interleaved, in CPU time, best of ``--rounds``:

* as the product runs it: a kept floor that is still its host's exact cost
  is taken without a search (``kernels._costed``);
* the baseline: the same scan with every floor's exact-until reset before
  each scan (outside the timing), so a kept host is searched again, as a
  scan whose floors are only lower bounds would.

Both must decide as the replay did. The calls go through numba's dispatcher,
so each includes its dispatch (a few microseconds the product's entry point
does not pay); the difference between the two is the floors' own effect.

It wraps the scan's entry point (``ScanDirect.refreshed``) for the one
replay and restores it after; the product is not changed.

    .venv/bin/python -m benchmarks.scan_sequence [--every 10000] [--length 300]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stranding_scan import azure_trace, replay_wrapping
from lavad.core.placement import kernels, lifetime_scan
from lavad.core.placement.floor_sets import FloorSets

# The name under which the lifetime policies resolve the scan's entry points.
WARM_UP = "warm_up_lifetime_scan"


class Run:
    """Consecutive scans of one replay: the policy's floor sets as the first began, then
    each scan."""

    def __init__(self, sets: FloorSets) -> None:
        self.floors = sets.floors.copy()
        self.marks = sets.marks.copy()
        # Per scan: pool, request, preference, LAS input, quantile stamps,
        # probe, floor set, epoch, stranding; then the replay's result and
        # first tie (an earlier scan's when none fits).
        self.scans: list[tuple[Any, ...]] = []


def keep_runs(path: Path, every: int, length: int) -> list[Run]:
    """Replay ``path`` with the default LAS, keeping ``length`` consecutive scans every
    ``every`` scans."""
    runs: list[Run] = []
    scans = 0
    # The floor sets the scan about to run uses, and its set (``FloorSets.for_scan``).
    chosen: list[tuple[FloorSets, int]] = []
    for_scan = FloorSets.for_scan

    def choosing(sets: FloorSets, thresholds: Any, now: float, n_hosts: int) -> tuple[int, int]:
        index, epoch = for_scan(sets, thresholds, now, n_hosts)
        chosen[:] = [(sets, index)]
        return index, epoch

    def capturing(original: Callable[..., Any]) -> Callable[..., Any]:
        def scan(*args: Any) -> Any:
            nonlocal scans
            pool, scanned, preferred, thresholds, ties, probe = args[:6]
            epoch, tracker, model, strand = args[8:12]
            position = scans % every
            scans += 1
            if position >= length:
                return original(*args)
            sets, index = chosen[0]
            if position == 0:
                runs.append(Run(sets))
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
            state = (kept_pool, scanned, (preferred[0][:n].copy(), *preferred[1:]), las, stamps)
            result = original(*args)
            kept = (*state, probe, index, epoch, strand, tuple(result), int(ties[0]))
            runs[-1].scans.append(kept)
            return result

        return scan

    def wrap() -> None:
        # The dispatcher, not the entry point: an entry point puts the compiled
        # code in the holder's place after its first call, over this wrapper.
        lifetime_scan.ScanDirect.refreshed = capturing(lifetime_scan._refreshed_lifetime_scan)

    FloorSets.for_scan = choosing  # type: ignore[method-assign]
    try:
        replay_wrapping(path, {}, WARM_UP, wrap)
    finally:
        FloorSets.for_scan = for_scan  # type: ignore[method-assign]
    return [run for run in runs if run.scans]


def time_runs(runs: list[Run], reuse: bool) -> tuple[float, int, int]:
    """CPU seconds over every kept scan, how many decided as the replay did, and how many."""
    _, no_tracker, no_model = kernels.no_floors_nor_refresh()
    scan = lifetime_scan._lifetime_scan
    total = 0.0
    agree = 0
    count = 0
    for run in runs:
        width = run.floors.shape[2]
        size = max(width, *(kept[1][0] for kept in run.scans))
        floors = np.zeros((run.floors.shape[0], 2, size))
        floors[:, 1] = -np.inf
        marks = np.full((run.floors.shape[0], 2, size), -1, dtype=np.int64)
        floors[:, :, :width] = run.floors
        marks[:, :, :width] = run.marks
        stamps = np.zeros(size, dtype=np.int64)
        for pool, scanned, preferred, las, kept_stamps, probe, index, epoch, *rest in run.scans:
            strand, result, first = rest
            n = scanned[0]
            stamps[:n] = kept_stamps
            ties = np.zeros(n + 1, dtype=np.int64)
            floor, until = floors[index]
            if not reuse:
                until.fill(-np.inf)
            kept_floors = (floor, marks[index, 0], marks[index, 1], stamps, epoch, True, until)
            began = time.process_time()
            got = scan(
                pool, scanned, preferred, las, ties, probe, kept_floors, False, no_tracker,
                no_model, strand,
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
    runs = keep_runs(azure_trace(), args.every, args.length)
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
