"""The falling-behind watch: consumer lag growing while ready (lavad/daemon/live/lag_watch.py).

No broker: the detector reads numbers, the telemetry a small fake consumer
(its assignment and high watermarks), the health endpoint a real aiohttp server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from live_support import live_settings
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from lavad.daemon.live.http import serve_http
from lavad.daemon.live.lag_watch import Change, FallingBehind, LagReading, LagWatch
from lavad.daemon.live.partitions import OwnedPartition
from lavad.daemon.live.shell import LiveDaemon, live_engine_config
from lavad.daemon.live.telemetry import Telemetry

ON, OFF, RESET = Change.FALLING_BEHIND, Change.STOPPED_GROWING, Change.RESET
TOPIC = "lavad.vm-events"

# A sample: (total lag, ready, assignment). Assignment "A" holds partition 0
# only, "B" partitions 0 and 1 (a rebalance gave this instance one more).
Sample = tuple[int, bool, str]


def reading(lag: int, assignment: str) -> LagReading:
    if assignment == "A":
        return LagReading({(TOPIC, 0): lag})
    return LagReading({(TOPIC, 0): lag // 2, (TOPIC, 1): lag - lag // 2})


def ready(*lags: int) -> list[Sample]:
    return [(lag, True, "A") for lag in lags]


# With samples = 3 and min_growth = 100: (samples fed in order, the change
# each one makes, worked by hand).
DETECTOR_CASES: list[tuple[str, list[Sample], list[Change | None]]] = [
    (
        # 0 starts the watch; 50, 100, 150 are three growths in a row, and
        # 150 - 0 = 150 >= 100: on at the fourth sample.
        "steady growth",
        ready(0, 50, 100, 150),
        [None, None, None, ON],
    ),
    (
        # Grows at every sample, but by 30 over the first three growths and
        # 40 over four: < 100, never on.
        "growth below the minimum",
        ready(0, 10, 20, 30, 40),
        [None, None, None, None, None],
    ),
    (
        # 0 -> 60 -> 120 is two growths; 110 breaks the run (it starts again
        # at 110); 170, 230 are two; 290 is the third, 290 - 110 = 180: on.
        "a dip restarts the count",
        ready(0, 60, 120, 110, 170, 230, 290),
        [None, None, None, None, None, None, ON],
    ),
    (
        # On at 300 (growths 100, 200, 300); then 300 (equal: no growth),
        # 250, 250: three samples without growth, off at the third.
        "three samples without growth clear it",
        ready(0, 100, 200, 300, 300, 250, 250),
        [None, None, None, ON, None, None, OFF],
    ),
    (
        # On at 300; 250 is one sample without growth, 260 grows (the count
        # of samples without growth starts again), then 240, 230, 220 are
        # three without growth: off at 220, not at 230.
        "a growth among the flat samples delays clearing",
        ready(0, 100, 200, 300, 250, 260, 240, 230, 220),
        [None, None, None, ON, None, None, None, None, OFF],
    ),
    (
        # On at 300; 400 while not ready resets (gauge off, one RESET); 500
        # ready starts the watch again; 600, 700, 800 are three growths,
        # 800 - 500 = 300: on again. The 400 never counts as growth.
        "readiness lost resets the watch",
        [*ready(0, 100, 200, 300), (400, False, "A"), *ready(500, 600, 700, 800)],
        [None, None, None, ON, RESET, None, None, None, ON],
    ),
    (
        # On at 300; the rebalance to B (lag now over two partitions) resets:
        # the jump to 350 is the new partition's backlog, not falling behind.
        # 350 starts the watch; 360, 370 are two growths, 380 the third but
        # 380 - 350 = 30 < 100: stays off.
        "a rebalance resets the watch",
        [*ready(0, 100, 200, 300), *[(lag, True, "B") for lag in (350, 360, 370, 380)]],
        [None, None, None, ON, RESET, None, None, None],
    ),
    (
        # Not ready from the start: nothing counts until ready.
        "never ready",
        [(0, False, "A"), (500, False, "A"), (1000, False, "A"), (1500, False, "A")],
        [None, None, None, None],
    ),
]


@pytest.mark.parametrize(
    ("samples", "changes"),
    [(samples, changes) for _name, samples, changes in DETECTOR_CASES],
    ids=[name for name, _samples, _changes in DETECTOR_CASES],
)
def test_falling_behind_detector(samples: list[Sample], changes: list[Change | None]) -> None:
    detector = FallingBehind(samples=3, min_growth=100)
    seen = [detector.observe(reading(lag, assignment), ready=up) for lag, up, assignment in samples]
    assert seen == changes
    # The verdict is the last change that turned it on or off.
    turned = [change for change in seen if change is not None]
    assert detector.on == (bool(turned) and turned[-1] is ON)


def test_samples_zero_turns_the_watch_off() -> None:
    detector = FallingBehind(samples=0, min_growth=1)
    assert [detector.observe(reading(lag, "A"), ready=True) for lag in range(0, 10_000, 1000)] == [
        None
    ] * 10
    assert not detector.on


@pytest.mark.parametrize(("samples", "min_growth"), [(-1, 100), (3, 0)])
def test_detector_refuses_bad_bounds(samples: int, min_growth: int) -> None:
    with pytest.raises(ValueError, match="samples must be >= 0 and min_growth >= 1"):
        FallingBehind(samples, min_growth)


@dataclass
class FakeGauge:
    values: list[float] = field(default_factory=list)

    def set(self, value: float) -> None:
        self.values.append(value)


def test_lag_watch_logs_one_warning_per_episode_and_sets_the_gauge() -> None:
    gauge = FakeGauge()
    watch = LagWatch(FallingBehind(samples=3, min_growth=100), gauge, interval_s=10.0)
    # On at 300, still growing at 400 and 500 (no second warning), off
    # after 500, 500, 500 (three samples without growth).
    lags = [0, 100, 200, 300, 400, 500, 500, 500, 500]
    with capture_logs() as logs:
        for lag in lags:
            watch.observe(reading(lag, "A"), ready=True)
        assert watch.observe(None, ready=True) is None  # no consumer yet: nothing sampled
    assert gauge.values == [0, 0, 0, 1, 1, 1, 1, 1, 0]
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warnings == [
        {
            "event": "falling behind",
            "log_level": "warning",
            "lag_records": 300,
            "grew_by_records": 300,
            "samples": 3,
            "over_s": 30.0,
            "partitions": 1,
        }
    ]
    cleared = [entry for entry in logs if entry["event"] == "no longer falling behind"]
    assert cleared == [
        {
            "event": "no longer falling behind",
            "log_level": "info",
            "reason": "stopped_growing",
            "lag_records": 500,
        }
    ]


@dataclass(frozen=True)
class Partition:
    topic: str
    partition: int


@dataclass
class FakeConsumer:
    """What Telemetry.refresh reads of an aiokafka consumer: assignment and high watermarks."""

    highwaters: dict[Partition, int | None]

    def assignment(self) -> set[Partition]:
        return set(self.highwaters)

    def highwater(self, tp: Partition) -> int | None:
        return self.highwaters[tp]


@dataclass
class Held:
    positions: dict[str, int]


def test_telemetry_refresh_reads_the_lag_the_watch_needs_and_exports_the_flag() -> None:
    telemetry = Telemetry()
    consumer = FakeConsumer(
        {
            Partition(TOPIC, 0): 1_500,  # held at 1_000: lag 500
            Partition("lavad.usage", 0): 90,  # held at 100 (ahead): lag 0, never negative
            Partition(TOPIC, 1): None,  # not fetched yet: left out
            Partition(TOPIC, 2): 40,  # not restored yet: left out
        }
    )
    positions = {0: Held({TOPIC: 1_000, "lavad.usage": 100}), 1: Held({TOPIC: 0})}
    lags = telemetry.refresh([], consumer, positions, 0)
    assert lags == LagReading({(TOPIC, 0): 500, ("lavad.usage", 0): 0})
    assert lags.total == 500
    assert telemetry.refresh([], None, positions, 0) is None
    watch = LagWatch(FallingBehind(1, 100), telemetry.falling_behind, 10.0)
    watch.observe(lags, ready=True)
    consumer.highwaters[Partition(TOPIC, 0)] = 1_700  # grew by 200 >= 100 in one sample
    watch.observe(telemetry.refresh([], consumer, positions, 0), ready=True)
    assert b"lavad_falling_behind 1.0" in generate_latest(telemetry.registry)


async def test_healthz_reports_degraded_while_falling_behind_and_stays_200() -> None:
    degraded = {"falling_behind": False}
    handle = await serve_http("127.0.0.1", 0, Telemetry().registry, dict, lambda: degraded)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(handle.url + "/healthz") as response:
                assert response.status == 200
                assert await response.json() == {
                    "alive": True,
                    "degraded": False,
                    "checks": {"falling_behind": False},
                }
            degraded["falling_behind"] = True
            async with session.get(handle.url + "/healthz") as response:
                assert response.status == 200
                body = await response.json()
    finally:
        await handle.close()
    assert body == {"alive": True, "degraded": True, "checks": {"falling_behind": True}}


async def test_the_daemon_watches_its_lag_only_while_ready(tmp_path: Path) -> None:
    """LiveDaemon.refresh_gauges feeds the watch with its readiness (no broker: a fake
    consumer stands for aiokafka's, the daemon is never run)."""
    settings = live_settings(
        "unused:9092", tmp_path, falling_behind_samples=2, falling_behind_records=10
    )
    daemon = LiveDaemon(settings, live_engine_config(settings))
    consumer = FakeConsumer({Partition(TOPIC, 0): 100})
    daemon._consumer = consumer
    daemon.partitions.owned = {0: OwnedPartition(0, positions={TOPIC: 100})}
    daemon.partitions.snapshots_loaded = True

    def sample(highwater: int) -> bool:
        consumer.highwaters[Partition(TOPIC, 0)] = highwater
        daemon.refresh_gauges()
        return daemon.health()["falling_behind"]

    # Not ready (the broker probe has not answered): lags 0, 50, 100 grow
    # twice by 100 >= 10, but nothing counts.
    assert [sample(hw) for hw in (100, 150, 200)] == [False, False, False]
    daemon.broker_reachable = True
    # Ready: 100 starts the watch, 150 and 200 are two growths (by 100): on.
    assert [sample(hw) for hw in (200, 250, 300)] == [False, False, True]
    assert b"lavad_falling_behind 1.0" in generate_latest(daemon.telemetry.registry)
