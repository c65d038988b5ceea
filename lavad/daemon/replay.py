"""The replay shell: a recorded trace through the core as fast as the CPU allows.

It is the live shell's twin without Kafka: events come from a trace adapter,
decisions go to a JSON-lines file, and anything that cannot become a decision
(a malformed trace row, an event the engine rejects) goes to a dead-letter
file with the reason and the original bytes, and is counted.

Its clock (its watermark: the latest event time it took) moves by the rule
every pool's clock follows (``InputBounds.time_refusal``), and the engine's
timers run up to it before each event that moves it; the live shell's
watermark moves only by the times the engine did not refuse.
"""

from __future__ import annotations

import base64
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from lavad.core.engine import Engine, EngineConfig
from lavad.core.input_bounds import NEVER
from lavad.streams.codec import BadRecord, encode
from lavad.streams.schema import Decision, Event

ProgressCallback = Callable[[int, float], None]


class BinarySink(Protocol):
    """Where JSON lines go: a file, a BytesIO, or a lazily created file."""

    def write(self, data: bytes, /) -> int: ...


PROGRESS_EVERY = 20_000


@dataclass(slots=True)
class ReplayResult:
    policy: str
    pools: dict[str, dict[str, Any]]
    events: int
    decisions: Counter[str]
    dead_letters: Counter[str]
    end_time: float
    wall_seconds: float
    series: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.wall_seconds if self.wall_seconds else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "events": self.events,
            "decisions": dict(self.decisions),
            "dead_letters": dict(self.dead_letters),
            "end_time": self.end_time,
            "wall_seconds": self.wall_seconds,
            "events_per_second": self.events_per_second,
            "pools": self.pools,
        }


def dead_letter_record(source: str, position: str, raw: bytes, reason: str) -> bytes:
    return orjson.dumps(
        {
            "reason": reason,
            "source": source,
            "position": position,
            "raw_base64": base64.b64encode(raw).decode("ascii"),
            "raw_preview": raw[:500].decode("utf-8", "replace"),
        }
    )


def replay(
    events: Iterable[Event | BadRecord],
    config: EngineConfig,
    *,
    end_time: float | None = None,
    decisions_out: BinarySink | None = None,
    dead_letters_out: BinarySink | None = None,
    progress: ProgressCallback | None = None,
    engine: Engine | None = None,
) -> ReplayResult:
    """Feed ``events`` through a fresh engine; return the metrics summary and counts.

    ``end_time`` is where the trace's observation window closes (its
    censoring time); metrics are integrated up to it, or to the last event.
    ``engine``: a fresh engine built from ``config`` by the caller, when it
    is another kind of core with the same interface (shadow mode's).
    """
    engine = Engine(config) if engine is None else engine
    engine.warm_up()
    decision_counts: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    write = decisions_out.write if decisions_out is not None else None
    clock = NEVER
    bounds = config.input
    count = 0
    started = time.perf_counter()

    def emit(decisions: list[Decision]) -> None:
        for decision in decisions:
            decision_counts[decision.kind] += 1
            if write is not None:
                write(encode(decision) + b"\n")

    for item in events:
        count += 1
        if progress is not None and count % PROGRESS_EVERY == 0:
            progress(count, clock)
        if isinstance(item, BadRecord):
            dead["malformed"] += 1
            if dead_letters_out is not None:
                dead_letters_out.write(
                    dead_letter_record(item.source, item.position, item.raw, item.reason) + b"\n"
                )
            continue
        now = item.time
        # Timers run before the event: one absurd time must not drag every
        # pool's timers forward first, so only a plausible one moves the clock.
        if now > clock and bounds.time_refusal(now, clock, item.pool) is None:
            clock = now
            emit(engine.advance(now))
        handled = engine.handle(item, now)
        if handled.decisions:
            emit(handled.decisions)
        rejection = handled.rejection
        if rejection is not None:
            dead["rejected"] += 1
            if dead_letters_out is not None:
                dead_letters_out.write(
                    dead_letter_record(
                        rejection.stage, f"event {count}", encode(item), rejection.reason
                    )
                    + b"\n"
                )
    end = end_time if end_time is not None and end_time >= clock else clock
    if end == NEVER:
        end = 0.0
    elif end > clock:
        # Timers due between the last event and the end of the recording
        # (VMs outliving their predictions, LAVA deadlines) still fire.
        emit(engine.advance(end))
    pools = engine.summary(end)
    elapsed = time.perf_counter() - started
    series = metrics_series(engine.pools)
    if progress is not None:
        progress(count, clock)
    return ReplayResult(
        policy=config.policy,
        pools=pools,
        events=count,
        decisions=decision_counts,
        dead_letters=dead,
        end_time=end,
        wall_seconds=elapsed,
        series=series,
    )


def metrics_series(pools: Mapping[str, Any]) -> dict[str, list[dict[str, float]]]:
    """Each pool's sampled metrics as the points a result carries."""
    return {
        name: [
            {
                "time": p.time,
                "empty_hosts_pct": p.empty_hosts_pct,
                "cpu_util_pct": p.cpu_util_pct,
                "memory_util_pct": p.memory_util_pct,
            }
            for p in pool.metrics.series
        ]
        for name, pool in pools.items()
    }


def on_common_pool(results: list[ReplayResult]) -> None:
    """Restate empty hosts against one pool size when pools grew on demand.

    A pool that grows on demand ends as large as its policy's peak need, so
    a worse packer gets a larger pool, and its later empty hosts would flatter
    it. Empty hosts are a share of a *fixed* pool (LAVA, section 2.3): here
    the pool all compared policies would have needed, N = the largest final
    size, with every host present from the start. Then
    empty % = 100 * (1 - mean non-empty hosts / N). The own-pool figure is
    kept as ``empty_hosts_pct_own_pool``. Pools that never grew are left as
    measured (hosts up).
    """
    pools = {name for result in results for name in result.pools}
    for name in pools:
        runs = [r.pools[name] for r in results if name in r.pools]
        if not any(run["hosts_added_on_demand"] for run in runs):
            for run in runs:
                run["empty_hosts_basis"] = "hosts up"
            continue
        size = max(run["hosts_up_end"] for run in runs)
        for run in runs:
            run["empty_hosts_pct_own_pool"] = run["empty_hosts_pct"]
            used = run["hosts_used_mean"]
            run["empty_hosts_pct"] = None if used is None else 100.0 * (1.0 - used / size)
            run["empty_hosts_basis"] = f"common pool of {size} hosts"
