"""``python -m benchmarks``: print lavad's performance figures (not a test).

* replay throughput (events/s, end to end: adapter -> engine -> encoded
  decisions) with Best Fit on the Azure V1 trace, next to the adapter alone
  in the same process, so the ratio shows what the core costs; then LAS and
  LAVA's, as a ratio to Best Fit's;
* placement latency p50/p99 at 1,000 and 10,000 hosts for Best Fit and First
  Fit, next to a recompute-per-request numpy Best Fit baseline;
* reprediction E[T_r | T_u] per VM, one and many VMs per call;
* admission decision latency with 500 deployments (needs ../shared/data);
* usage replay throughput under each limits recommender, as a ratio to the
  limits off (the Google 2011 trace's first 60,000 events, else the slice);
* snapshot save/load time and size, data codec against pickle;
* peak resident memory of this process.

``--live`` runs only the live-shell figures instead (``benchmarks/live_kafka.py``,
about a minute): sustained Kafka ingest next to the in-process replay, and
decision latency at 1,000 records/s, against the embedded broker.

Uses ../shared/data/azure-v1-vms when present, else the slice in data/.
"""

from __future__ import annotations

import argparse
import io
import resource
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.admission_latency import SHARED_DLRM
from benchmarks.admission_latency import measure as measure_admission
from benchmarks.lifetime_throughput import lifetime_throughput
from benchmarks.migration_cost import migration_cost
from benchmarks.placement_latency import measure, measure_recompute_baseline
from benchmarks.reprediction_latency import reprediction_latency
from benchmarks.snapshot_codec import snapshot_codec
from benchmarks.usage_throughput import main as usage_throughput
from lavad.daemon import heap
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.schema import VmRequest

ROOT = Path(__file__).resolve().parents[1]
SHARED_AZURE = ROOT.parent / "shared" / "data" / "azure-v1-vms"
SLICE_AZURE = ROOT / "data" / "azure-v1-vms-slice"


def _azure_path() -> Path:
    if SHARED_AZURE.is_dir():
        return SHARED_AZURE
    print(f"note: {SHARED_AZURE} absent; using the bundled slice {SLICE_AZURE}")
    return SLICE_AZURE


def replay_throughput(path: Path) -> None:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    trace = open_trace(path, seed=0)
    began = time.perf_counter()
    adapter_events = sum(1 for _ in trace.events())
    adapter_seconds = time.perf_counter() - began

    trace = open_trace(path, seed=0)
    sink = io.BytesIO()
    result = replay(
        trace.events(),
        settings.engine_config("bestfit", trace_has_hosts=trace.has_hosts),
        end_time=trace.end_time,
        decisions_out=sink,
    )
    no_metrics = settings.model_copy(update={"metrics": replace(settings.metrics, stranding=False)})
    trace = open_trace(path, seed=0)
    quiet = replay(
        trace.events(),
        no_metrics.engine_config("bestfit", trace_has_hosts=trace.has_hosts),
        end_time=trace.end_time,
        decisions_out=io.BytesIO(),
    )
    pool = next(iter(result.pools.values()))
    print(f"replay throughput on {path.name} (bestfit)")
    print(f"  events                         {result.events:>12,}")
    print(f"  adapter alone                  {adapter_events / adapter_seconds:>12,.0f} events/s")
    print(f"  end to end, with metrics       {result.events_per_second:>12,.0f} events/s")
    print(f"  end to end, no stranding       {quiet.events_per_second:>12,.0f} events/s")
    adapter_rate = adapter_events / adapter_seconds
    print(f"  adapter rate / end-to-end rate {adapter_rate / result.events_per_second:>12.2f}x")
    print(f"  hosts used (peak)              {pool['hosts_used_peak']:>12,}")
    print(f"  decisions bytes                {sink.tell():>12,}")


def _shapes(path: Path) -> tuple[list[tuple[float, float]], np.ndarray]:
    counts: Counter[tuple[float, float]] = Counter()
    for event in open_trace(path, seed=0).events():
        if isinstance(event, VmRequest):
            counts[(event.cores, event.memory_gib)] += 1
    shapes = sorted(counts)
    weights = np.array([counts[s] for s in shapes], dtype=np.float64)
    return shapes, weights / weights.sum()


def placement_latency(path: Path, sizes: list[int]) -> None:
    shapes, weights = _shapes(path)
    print("placement latency (one request, steady 70% occupancy, real Azure V1 shapes)")
    print(f"  {'policy':<30}{'hosts':>8}{'p50 us':>10}{'p99 us':>10}{'occupancy':>11}")
    for hosts in sizes:
        rows = [
            measure("bestfit", hosts, shapes, weights),
            measure("firstfit", hosts, shapes, weights),
            measure_recompute_baseline(hosts, shapes, weights),
        ]
        for row in rows:
            print(
                f"  {row.policy:<30}{row.hosts:>8,}{row.p50_us:>10.1f}{row.p99_us:>10.1f}"
                f"{row.occupancy_pct:>10.1f}%"
            )
        speedup = rows[2].p99_us / rows[0].p99_us
        print(f"  bestfit p99 vs recompute baseline p99: {speedup:.2f}x faster")


def admission_latency() -> None:
    """Admission decisions with 500 deployments of real alibaba-dlrm histories (paper's grid)."""
    print("admission decision latency (500 deployments, 5 horizons x 600 look-ahead times)")
    if not SHARED_DLRM.exists():
        print(f"  skipped: alibaba-dlrm not found at {SHARED_DLRM}")
        return
    for name in ("zeroth", "first", "second"):
        fig = measure_admission(name, 500, horizons_s=None, steps=600, path=SHARED_DLRM)
        print(
            f"  {fig.policy:<8} p50 {fig.p50_ms:8.3f} ms   p99 {fig.p99_ms:8.3f} ms"
            f"   (full refresh of all rows {fig.refresh_ms:.1f} ms)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument("--sizes", default="1000,10000", help="host counts for latency")
    parser.add_argument(
        "--live",
        action="store_true",
        help="only the live shell against the embedded Kafka broker: ingest and latency",
    )
    parser.add_argument(
        "--federation",
        action="store_true",
        help="only the federation's requests/s for 1, 2 and 4 global schedulers "
        "(simulated, then live over the embedded broker)",
    )
    args = parser.parse_args(argv)
    if args.federation:
        from benchmarks.federation import main as federation  # noqa: PLC0415 - opt-in
        from benchmarks.federation_live import main as federation_live  # noqa: PLC0415

        federation()
        federation_live()
        return 0
    # The collector schedule `lavad replay` and `lavad run` set for themselves.
    heap.tune_collector()
    if args.live:
        from benchmarks.live_kafka import live_benchmark  # noqa: PLC0415 - opt-in, heavier imports

        live_benchmark()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"peak resident memory of this process: {peak_kib / 1024:.0f} MiB")
        return 0
    path = _azure_path()
    if not args.skip_replay:
        replay_throughput(path)
        lifetime_throughput(path)
    placement_latency(path, [int(s) for s in args.sizes.split(",")])
    reprediction_latency(SLICE_AZURE)
    migration_cost(SLICE_AZURE)
    snapshot_codec(SLICE_AZURE)
    admission_latency()
    usage_throughput([])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak resident memory of this process: {peak_kib / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
