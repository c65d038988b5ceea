"""Replay throughput of the usage stream under each limits recommender, as a ratio.

``python -m benchmarks.usage_throughput [--events N]``. Not a test: it prints figures.

Usage samples cost the engine what its limits recommender does with each job's
5-minute window. The same real samples (the Google 2011 trace's first ``N``
events from ``../shared/data``, else the bundled slice) replay with the
recommender off, the VPA's, one of Autopilot's moving windows and lavad's
default ``ml`` (the VPA, its rungs and three moving windows per job, for
CPU), each with Best Fit and its decisions written. The ratio is each one's
CPU time against the replay with the limits off, in this same process.

``--copies K`` files every usage sample K times, under K job names (the
sample's own, then ``#1``, ``#2``...), at its own time: a fleet of K times
the trace's jobs with the trace's own usage, for the cost of a sample as the
jobs holding a window open at once grow. Its other events come once.
"""

from __future__ import annotations

import argparse
import io
import itertools
import time
from dataclasses import replace
from pathlib import Path

from lavad.daemon import heap
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.schema import Event, UsageSample

ROOT = Path(__file__).resolve().parents[1]
SHARED_GOOGLE = ROOT.parent / "shared" / "data" / "google-2011-gcd"
SLICE_GOOGLE = ROOT / "data" / "google-2011-gcd-limits-slice"
RECOMMENDERS = ("off", "vpa", "window-p95", "ml")


def _events(path: Path, count: int, copies: int) -> tuple[list[Event | BadRecord], bool]:
    trace = open_trace(path, seed=0)
    events: list[Event | BadRecord] = []
    for event in itertools.islice(trace.events(), count):
        events.append(event)
        if isinstance(event, UsageSample):
            events.extend(replace(event, vm_id=f"{event.vm_id}#{k}") for k in range(1, copies))
    return events, trace.has_hosts


def usage_throughput(path: Path, count: int, copies: int = 1) -> None:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    events, has_hosts = _events(path, count, copies)
    base = settings.engine_config("bestfit", trace_has_hosts=has_hosts)
    fleet = f", each usage sample {copies} times" if copies > 1 else ""
    print(f"usage replay throughput on {path.name} ({len(events):,} events{fleet}, bestfit)")
    print(f"  {'limits':<14}{'events/s':>12}{'CPU s':>9}{'CPU vs off':>12}{'decisions':>11}")
    # Untimed: the first replay in a process loads and compiles what every
    # later one reuses, and would be charged to the baseline.
    replay(events, replace(base, limits=replace(base.limits, recommender="off")))
    baseline = None
    for name in RECOMMENDERS:
        config = replace(base, limits=replace(base.limits, recommender=name))
        heap.settle()
        cpu = time.process_time()
        result = replay(events, config, decisions_out=io.BytesIO())
        seconds = time.process_time() - cpu
        baseline = seconds if baseline is None else baseline
        print(
            f"  {name:<14}{result.events / seconds:>12,.0f}{seconds:>9.2f}"
            f"{seconds / baseline:>11.1f}x{sum(result.decisions.values()):>11,}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.usage_throughput")
    parser.add_argument("--events", type=int, default=60_000, help="usage events replayed")
    parser.add_argument(
        "--copies", type=int, default=1, help="each usage sample under this many job names"
    )
    args = parser.parse_args(argv)
    if args.copies < 1:
        parser.error("--copies must be >= 1")
    heap.tune_collector()
    path = SHARED_GOOGLE if SHARED_GOOGLE.is_dir() else SLICE_GOOGLE
    if path == SLICE_GOOGLE:
        print(f"note: {SHARED_GOOGLE} absent; using the bundled slice {SLICE_GOOGLE}")
    usage_throughput(path, args.events, args.copies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
