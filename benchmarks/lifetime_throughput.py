"""Replay throughput of the lifetime policies (LAS, LAVA) next to Best Fit's, as a ratio.

The issue's goal is LAS and LAVA within 2x of Best Fit's events/s on the
full Azure V1 dev split; every policy here replays the same trace with the
configuration's pool and writes its decisions, as ``replay_throughput`` does.
"""

from __future__ import annotations

import io
from pathlib import Path

from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("bestfit", "las", "lava")


def lifetime_throughput(path: Path) -> None:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    rates: dict[str, float] = {}
    for name in POLICIES:
        trace = open_trace(path, seed=0)
        result = replay(
            trace.events(),
            settings.engine_config(name, trace_has_hosts=trace.has_hosts),
            end_time=trace.end_time,
            decisions_out=io.BytesIO(),
        )
        rates[name] = result.events_per_second
    print(f"lifetime policies' replay throughput on {path.name}")
    for name, rate in rates.items():
        ratio = rates["bestfit"] / rate
        print(f"  {name:<30}{rate:>12,.0f} events/s   Best Fit / it {ratio:>6.2f}x")
