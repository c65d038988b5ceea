"""``python -m benchmarks.lifetime_ablation``: lifetime policies and their variants on one trace.

Each variant is a registered policy with argument overrides, written
``name`` or ``name:key=value;key=value`` (``categorical=declared`` names the
features the adapters declare; lists are ``a|b``). Every variant replays the
whole trace on the pool the configuration (and ``LAVAD_HOSTS__*``) sets up;
trace options (``--option hosts=false`` for OpenB on a pool of one shape)
go to the adapter. The table gives empty hosts in pp over the first
variant (Best Fit) and as a share of the gain of the oracle variant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from lavad.core.placement.registry import needs_true_lifetimes
from lavad.daemon.replay import ReplayResult, on_common_pool, replay
from lavad.daemon.settings import load_settings
from lavad.evaluation.variants import parse_value, parse_variant, with_variant
from lavad.streams.adapters import open_trace
from lavad.streams.oracle import exit_times, with_true_lifetimes

CONFIG = Path(__file__).resolve().parents[1] / "config" / "lavad.toml"


def run(
    trace_path: Path, variants: list[str], options: dict[str, object]
) -> list[tuple[str, ReplayResult]]:
    settings = load_settings(CONFIG)
    true_exits: dict[tuple[str, str], float] | None = None
    runs: list[tuple[str, ReplayResult]] = []
    for spec in variants:
        name, args = parse_variant(spec)
        variant = with_variant(settings, name, args)
        trace = open_trace(trace_path, seed=settings.seed, **options)
        events: Any = trace.events()
        if needs_true_lifetimes(name):
            if true_exits is None:
                true_exits = exit_times(
                    open_trace(trace_path, seed=settings.seed, **options).events()
                )
            end = trace.end_time if trace.end_time is not None else float("inf")
            events = with_true_lifetimes(events, true_exits, end)
        result = replay(
            events,
            variant.engine_config(name, trace_has_hosts=trace.has_hosts),
            end_time=trace.end_time,
        )
        runs.append((spec, result))
        pool = next(iter(result.as_dict()["pools"].values()))
        print(
            f"  {spec}: {_empty(result):.2f}% empty, {pool['placement_failure_pct']:.2f}% failed,"
            f" peak {pool['hosts_used_peak']} used, {result.events_per_second:,.0f} events/s",
            file=sys.stderr,
            flush=True,
        )
    on_common_pool([result for _, result in runs])
    return runs


def _empty(result: ReplayResult) -> float:
    pools = result.as_dict()["pools"]
    value = next(iter(pools.values()))["empty_hosts_pct"]
    return float("nan") if value is None else float(value)  # None: nothing measured


def table(runs: list[tuple[str, ReplayResult]], oracle: str | None) -> str:
    base = _empty(runs[0][1])
    gain = None
    for spec, result in runs:
        if spec == oracle:
            gain = _empty(result) - base
    lines = [
        "| variant | empty % | pp vs " + runs[0][0] + " | share of oracle gain | events/s |",
        "|---|---|---|---|---|",
    ]
    for spec, result in runs:
        pp = _empty(result) - base
        share = f"{100 * pp / gain:.0f}%" if gain else "-"
        lines.append(
            f"| {spec} | {_empty(result):.2f} | {pp:+.2f} | {share} |"
            f" {result.events_per_second:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--option", action="append", default=[], help="adapter option k=v")
    parser.add_argument("--oracle", help="the variant whose gain is 100%%")
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args(argv)
    options = {k: parse_value(k, v) for k, _, v in (o.partition("=") for o in ns.option)}
    runs = run(ns.trace, ns.variant, options)
    print(table(runs, ns.oracle))
    if ns.json is not None:
        ns.json.write_bytes(
            orjson.dumps(
                [{"variant": spec, **result.as_dict()} for spec, result in runs],
                option=orjson.OPT_INDENT_2,
            )
        )


if __name__ == "__main__":
    main()
