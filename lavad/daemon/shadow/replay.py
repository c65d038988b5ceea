"""Shadow mode in replay: an existing scheduler's stream through both sides, measured alike."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lavad.core.engine import Engine, EngineConfig
from lavad.daemon.replay import (
    BinarySink,
    ProgressCallback,
    ReplayResult,
    metrics_series,
    on_common_pool,
    replay,
)
from lavad.daemon.shadow.compare import empty_hosts_difference
from lavad.daemon.shadow.engine import ACTUAL_POLICY, Shadow, ShadowPool
from lavad.streams.codec import BadRecord
from lavad.streams.schema import Event

ACTUAL: str = "actual"
LAVAD: str = "lavad"


@dataclass(slots=True)
class ShadowResult:
    """Both sides of a shadow replay, as replay results, with agreement and the difference."""

    actual: ReplayResult
    lavad: ReplayResult
    agreement: dict[str, dict[str, Any]]
    difference: dict[str, dict[str, Any]]

    @property
    def sides(self) -> list[ReplayResult]:
        return [self.actual, self.lavad]

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": "shadow",
            "sides": {
                ACTUAL: {**self.actual.as_dict(), "series": self.actual.series},
                LAVAD: {**self.lavad.as_dict(), "series": self.lavad.series},
            },
            "agreement": self.agreement,
            "empty_hosts_difference": self.difference,
        }


def shadow_replay(
    events: Iterable[Event | BadRecord],
    config: EngineConfig,
    *,
    end_time: float | None = None,
    decisions_out: BinarySink | None = None,
    progress: ProgressCallback | None = None,
    common_pool: bool = True,
) -> ShadowResult:
    """Replay the stream through an engine in shadow mode; ``decisions_out`` gets lavad's advice.

    ``common_pool``: restate both sides' empty hosts against one pool size
    when a side grew on demand (as ``lavad replay --compare`` does).
    """
    shadow = Shadow(config)
    engine = Engine(config, shadow)
    lavad = replay(
        events,
        config,
        end_time=end_time,
        decisions_out=decisions_out,
        progress=progress,
        engine=engine,
    )
    end = lavad.end_time
    sides = shadow.sides(engine, end)
    lavad.policy = f"{LAVAD} ({config.policy})"
    dropped: Counter[str] = Counter()
    for name, both in sides.items():
        dropped[name] = both["agreement"]["actual_decisions_dropped"]
    actual = ReplayResult(
        policy=f"{ACTUAL} (vm.placed)",
        pools={name: both["actual"] for name, both in sides.items()},
        events=lavad.events,
        decisions=Counter(),
        dead_letters=Counter(lavad.dead_letters),
        end_time=end,
        wall_seconds=lavad.wall_seconds,
        series=metrics_series(shadow.follower.pools),
    )
    difference: dict[str, dict[str, Any]] = {}
    for name, pool in engine.pools.items():
        assert isinstance(pool, ShadowPool) and pool.actual is not None
        summary = sides[name][LAVAD]
        difference[name] = empty_hosts_difference(
            pool.actual.metrics.series,
            pool.metrics.series,
            summary["measured_from_s"],
            summary["measured_until_s"],
        )
    if common_pool:
        on_common_pool([actual, lavad])
    return ShadowResult(
        actual=actual,
        lavad=lavad,
        agreement={name: both["agreement"] for name, both in sides.items()},
        difference=difference,
    )


__all__ = ["ACTUAL", "ACTUAL_POLICY", "LAVAD", "ShadowResult", "shadow_replay"]
