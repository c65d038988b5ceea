"""What the stranding cost adds to the lifetime scan, on the same states, in one process.

``lifetime_throughput`` times whole replays, one policy after another, so a
neighbour's load during one replay moves that policy's figure alone; on a
shared two-core box two runs of it differ by more than most changes to the
scan are worth. This benchmark replays the trace once with LAS (host
quantiles, the default) and keeps a copy of every ``--every``-th scan's
inputs, the hosts' quantiles brought up to date first (as the scan would).
Then it times the compiled scan on each kept state twice, interleaved: with
the stranding cost, and with the paper's LAS (no stranded time counted), in
CPU time, best of ``--rounds``. The ratio of the two is the scan's own cost
of the stranding score, on the same hosts and VMs; it also prints the share
of kept scans whose decision the stranding cost changed.

It wraps the scan's entry point (``lifetime_scan.ScanDirect.refreshed``)
for the one replay and restores it after; the product is not changed.

    .venv/bin/python -m benchmarks.stranding_scan [--every 43] [--keep 4000]
"""

from __future__ import annotations

import argparse
import copy
import io
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lifetime_throughput import ROOT
from lavad.core.placement import kernels, lifetime_policy, lifetime_scan
from lavad.core.placement.registry import validate_policy_args
from lavad.core.placement.strand_kernels import Stranding, no_stranding
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace

SHARED = ROOT.parent / "shared" / "data" / "azure-v1-vms"
BUNDLED = ROOT / "data" / "azure-v1-vms-slice"

# The name under which the lifetime policies resolve the kernels' entry points.
WARM_UP = "warm_up_lifetime_scan"
# The scan's arguments for a kept state: pool, request, preference, LAS input,
# ties, probe, floors, stranding; and the decision the replay took there.
Kept = tuple[Any, ...]


def keep_scans(path: Path, every: int, keep: int) -> list[Kept]:
    """Replay ``path`` with LAS, keeping every ``every``-th scan's inputs (at most ``keep``)."""
    kept: list[Kept] = []
    scans = 0

    def capturing(original: Callable[..., Any]) -> Callable[..., Any]:
        def scan(*args: Any) -> Any:
            nonlocal scans
            scans += 1
            pool, scanned, preferred, thresholds, ties, probe, floor, marks, epoch = args[:9]
            tracker, model = args[9:11]
            strand: Stranding = args[11]
            state = None
            if scans % every == 0 and len(kept) < keep and strand[6] > 0.0:
                n = scanned[0]
                # The scan refreshes stale hosts itself; the copy is taken after
                # the same refresh, so the timed scans need none.
                kernels.Direct.refresh_host_quantiles(n, tracker, model)
                host_q = tracker[4][:n].copy()
                las = (
                    tracker[2][kernels.HOST_EXIT][:n].copy(), thresholds, True, thresholds,
                    host_q, True,
                )  # fmt: skip
                floors = (
                    floor[0].copy(), marks[0].copy(), marks[1].copy(),
                    tracker[3][kernels.QUANTILES_STAMP][:n].copy(), epoch, True, floor[1].copy(),
                )  # fmt: skip
                state = (
                    copy.deepcopy(pool), scanned, (preferred[0].copy(), *preferred[1:]), las,
                    np.zeros(len(ties), dtype=np.int64), probe, floors,
                    (*strand[:4], host_q, *strand[5:]),
                )  # fmt: skip
            result = original(*args)
            if state is not None:
                kept.append((*state, tuple(result), int(ties[0])))
            return result

        return scan

    def wrap() -> None:
        # The dispatcher, not the entry point: an entry point puts the compiled
        # code in the holder's place after its first call, over this wrapper.
        lifetime_scan.ScanDirect.refreshed = capturing(lifetime_scan._refreshed_lifetime_scan)

    # No cost tolerance: without the stranded count the same scan is then
    # the paper's LAS, the baseline the timing compares against.
    replay_wrapping(path, {"stranding_cost": True, "cost_tolerance": 0.0}, WARM_UP, wrap)
    return kept


def azure_trace() -> Path:
    """The full Azure V1 dev split, or the bundled slice (saying so) where it is not held."""
    if SHARED.exists():
        return SHARED
    print(f"{SHARED} not found: the bundled slice ({BUNDLED.name}) is used")
    return BUNDLED


def replay_wrapping(
    path: Path, policy_args: dict[str, Any], warm_up_name: str, wrap: Callable[[], None]
) -> None:
    """Replay ``path`` once with LAS, ``policy_args`` over the configuration's, ``wrap``
    run after each lifetime policy's warm-up (``lifetime_policy.<warm_up_name>``, which
    resolves the kernels' entry points anew), and the warm-up restored after."""
    settings = load_settings(ROOT / "config" / "lavad.toml")
    warm_up: Callable[[], None] = getattr(lifetime_policy, warm_up_name)

    def warm_up_and_wrap() -> None:
        warm_up()
        wrap()

    setattr(lifetime_policy, warm_up_name, warm_up_and_wrap)
    try:
        trace = open_trace(path, seed=0)
        config = settings.engine_config("las", trace_has_hosts=trace.has_hosts)
        las_args = {**settings.policies.get("las", {}), **policy_args}
        config = replace(config, policy_args=validate_policy_args("las", las_args))
        replay(trace.events(), config, end_time=trace.end_time, decisions_out=io.BytesIO())
    finally:
        setattr(lifetime_policy, warm_up_name, warm_up)
        warm_up()


def time_scans(kept: list[Kept], rounds: int) -> None:
    _, no_tracker, no_model = kernels.no_floors_nor_refresh()
    paper = no_stranding()
    scan = lifetime_scan._lifetime_scan

    def one_round(counting: bool) -> tuple[float, int, int]:
        """CPU seconds over all kept states; how many decided as the replay did; and
        how many chose another first host than the paper's LAS."""
        total = 0.0
        agree = 0
        moved = 0
        for state in kept:
            pool, scanned, preferred, las, ties, probe, floors, strand, result, first = state
            fresh = (
                floors[0].copy(), floors[1].copy(), floors[2].copy(), *floors[3:6],
                floors[6].copy(),
            )  # fmt: skip
            began = time.process_time()
            got = scan(
                pool, scanned, preferred, las, ties, probe, fresh, False, no_tracker, no_model,
                strand if counting else paper,
            )  # fmt: skip
            total += time.process_time() - began
            if counting:
                agree += tuple(got) == result
            else:
                moved += int(ties[0]) != first
        return total, agree, moved

    one_round(True)  # compile the dispatcher's paths before timing
    one_round(False)
    best = {True: float("inf"), False: float("inf")}
    agree = moved = 0
    for _ in range(rounds):
        for counting in (True, False):
            seconds, agreed, differed = one_round(counting)
            best[counting] = min(best[counting], seconds)
            if counting:
                agree = agreed
            else:
                moved = differed
    n = len(kept)
    print(f"lifetime scan on {n:,} kept states (best of {rounds} rounds, CPU time)")
    print(f"  LAS with the stranding cost   {best[True] / n * 1e6:8.1f} us a scan")
    print(f"  the paper's LAS               {best[False] / n * 1e6:8.1f} us a scan")
    print(f"  ratio                         {best[True] / best[False]:8.2f}x")
    print(f"  decisions as in the replay    {agree:,} of {n:,}")
    print(f"  first host not the paper's    {moved:,} of {n:,} ({moved / max(n, 1):.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=43, help="keep every this many scans")
    parser.add_argument("--keep", type=int, default=4000, help="keep at most this many")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.every < 1 or args.keep < 1 or args.rounds < 1:
        parser.error("--every, --keep and --rounds must be >= 1")
    kept = keep_scans(azure_trace(), args.every, args.keep)
    if not kept:
        raise SystemExit("no scan counted stranded time: nothing to time")
    time_scans(kept, args.rounds)


if __name__ == "__main__":
    main()
