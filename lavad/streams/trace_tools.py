"""Trace inspection and conversion, the functions behind the CLI's trace commands.

``trace_info`` streams a trace once and reports what a replay will see
(counts per event type, VMs, censored VMs, hosts, time span, bad records),
so a user can check a trace before replaying it. ``convert`` writes the
canonical events as JSON lines (the ``jsonl`` format reads them back through
the validating codec); bad records are counted and, if asked, written to a
separate dead-letter file, never mixed with events.
"""

from __future__ import annotations

import base64
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.schema import DeploymentArrival, HostUp, UsageSample, VmExit, VmRequest

# Bad records kept verbatim in a report; the rest are only counted.
_SAMPLE_BAD = 5


def trace_info(path: Path | str, seed: int = 0, **options: Any) -> dict[str, Any]:
    """Stream the trace once and summarise it.

    Returns format, path, end_time, ``events`` (total), ``counts`` per event
    type, ``vms`` (distinct requested VMs), ``censored_vms`` (requested, never
    exited), ``exits_without_request``, ``hosts``, ``deployments``,
    ``usage_series``, ``first_time``/``last_time``, ``bad_records`` with
    ``bad_reasons`` (count per reason, first word groups) and a few
    ``bad_examples``, and the adapter's static ``describe()`` facts.
    """
    trace = open_trace(path, seed=seed, **options)
    counts: Counter[str] = Counter()
    # Ids name a VM, host, deployment or series within its pool: the same id in
    # two pools is two of them, as the engine keeps them.
    requested: set[tuple[str, str]] = set()
    exited: set[tuple[str, str]] = set()
    hosts: set[tuple[str, str]] = set()
    deployments: set[tuple[str, str]] = set()
    series: set[tuple[str, str]] = set()
    bad = 0
    reasons: Counter[str] = Counter()
    examples: list[dict[str, str]] = []
    first: float | None = None
    last: float | None = None
    for item in trace.events():
        if isinstance(item, BadRecord):
            bad += 1
            reasons[_reason_kind(item.reason)] += 1
            if len(examples) < _SAMPLE_BAD:
                examples.append(
                    {"source": item.source, "position": item.position, "reason": item.reason}
                )
            continue
        counts[item.type] += 1
        if first is None:
            first = item.time
        last = item.time
        pool = item.pool
        if isinstance(item, VmRequest):
            requested.add((pool, item.vm_id))
            if item.deployment:
                deployments.add((pool, item.deployment))
        elif isinstance(item, VmExit):
            exited.add((pool, item.vm_id))
        elif isinstance(item, HostUp):
            hosts.add((pool, item.host_id))
        elif isinstance(item, UsageSample):
            series.add((pool, item.vm_id))
        elif isinstance(item, DeploymentArrival):
            deployments.add((pool, item.deployment_id))
    return {
        "format": trace.name,
        "path": str(trace.path),
        "end_time": trace.end_time,
        "events": sum(counts.values()),
        "counts": dict(sorted(counts.items())),
        "vms": len(requested),
        "censored_vms": len(requested - exited),
        "exits_without_request": len(exited - requested),
        "hosts": len(hosts),
        "deployments": len(deployments),
        "usage_series": len(series),
        "first_time": first,
        "last_time": last,
        "bad_records": bad,
        "bad_reasons": dict(reasons.most_common()),
        "bad_examples": examples,
        "describe": trace.describe(),
    }


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """What ``convert`` wrote: events to ``out_path``, bad records counted (and dead-lettered)."""

    out_path: Path
    events: int
    bad_records: int
    bad_path: Path | None = None
    bad_reasons: dict[str, int] = field(default_factory=dict)

    def __int__(self) -> int:
        return self.events

    def __str__(self) -> str:
        return f"{self.events:,} events ({self.bad_records:,} bad records)"


def convert(
    path: Path | str,
    out_path: Path | str,
    seed: int = 0,
    *,
    bad_path: Path | str | None = None,
    **options: Any,
) -> ConvertResult:
    """Write the trace's events to ``out_path``, one orjson line per event.

    BadRecords are not events: they are counted in the result and, when
    ``bad_path`` is given, written there as JSON lines (source, position,
    reason, raw bytes in base64) so nothing is lost. ``int(result)`` is the
    number of events written.
    """
    trace = open_trace(path, seed=seed, **options)
    out = Path(out_path)
    dead = Path(bad_path) if bad_path is not None else None
    written = 0
    bad = 0
    reasons: Counter[str] = Counter()
    dumps = orjson.dumps
    newline = orjson.OPT_APPEND_NEWLINE
    bad_handle = dead.open("wb") if dead is not None else None
    try:
        with out.open("wb", buffering=1 << 20) as handle:
            for item in trace.events():
                if isinstance(item, BadRecord):
                    bad += 1
                    reasons[_reason_kind(item.reason)] += 1
                    if bad_handle is not None:
                        record = {
                            "source": item.source,
                            "position": item.position,
                            "reason": item.reason,
                            "raw_b64": base64.b64encode(item.raw).decode("ascii"),
                        }
                        bad_handle.write(dumps(record, option=newline))
                    continue
                handle.write(dumps(item, option=newline))
                written += 1
    finally:
        if bad_handle is not None:
            bad_handle.close()
    return ConvertResult(
        out_path=out,
        events=written,
        bad_records=bad,
        bad_path=dead,
        bad_reasons=dict(reasons.most_common()),
    )


def _reason_kind(reason: str) -> str:
    """Group reasons for counting: the text before the first ':' (e.g. a column name)."""
    head = reason.split(":", 1)[0].strip()
    return head[:80] or "unknown"
