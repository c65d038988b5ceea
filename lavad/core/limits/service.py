"""Per-pool limit recommendations from the usage stream (Autopilot).

Each usage sample is filed into its VM's 5-minute window (``JobAggregator``);
when event time passes a window's end, the window becomes one observation
per resource for the configured recommender (``LimitTracker``), and a limit
decision is emitted when the recommended limit moves by more than the
tolerance.

A job here is one VM (or task): the usage stream names VMs, not the jobs
they belong to. A window closes once an event later than its end arrives
in the pool, so every sample of that window has been seen (events of a pool
are in time order).

The live daemon writes pools into snapshots as data (daemon/live/state_codec.py),
which saves lavad classes but no closures, so the recommender factory is a
class here, not a closure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Final

from pydantic import AfterValidator, ConfigDict, Field

from lavad.core.limits.replicas import ScalerConfig
from lavad.core.registry import Entry, NoArgs, Registry
from lavad.models.limits.choice import default_choice
from lavad.models.limits.decision import LimitDecision, LimitTracker, Resource
from lavad.models.limits.histogram import JobAggregator
from lavad.models.limits.ml import MlConfig, MlRecommender
from lavad.models.limits.vpa import VpaRecommender
from lavad.models.limits.window import (
    STATISTICS,
    LimitRecommender,
    MovingWindowRecommender,
    WindowConfig,
)
from lavad.streams.schema import UsageSample


def _moving_window(statistic: str) -> Callable[[NoArgs, Resource], LimitRecommender]:
    def build(_args: NoArgs, resource: Resource) -> LimitRecommender:
        half_life = WindowConfig.for_resource(resource).half_life_s
        return MovingWindowRecommender(WindowConfig(statistic, half_life))  # type: ignore[arg-type]

    return build


RECOMMENDER_REGISTRY: Registry[LimitRecommender] = Registry(
    "limit recommender",
    [
        Entry(
            "ml",
            "per job, the VPA estimator unless a lower rung of its own limit or (CPU) one of "
            "Autopilot's moving windows has left less slack at no more overruns on the job's "
            "own windows (models/limits/choice.py)",
            lambda _args, resource: default_choice(resource),
        ),
        Entry(
            "ml-ensemble",
            "Autopilot's ML recommender: arg-min models over (decay, margin), least cost chosen",
            lambda _args, resource: MlRecommender(MlConfig.for_resource(resource)),
        ),
        Entry(
            "vpa",
            "the Kubernetes VPA recommender (24 h half-life, p90, +15%, OOM bump)",
            lambda _args, resource: VpaRecommender(resource),
        ),
        *(
            Entry(
                f"window-{statistic}",
                f"Autopilot's moving window, {statistic} of load-adjusted usage, +10%",
                _moving_window(statistic),
            )
            for statistic in STATISTICS
        ),
    ],
)

# What [limits] recommender accepts: "off", or a recommender's name.
RECOMMENDERS: Final[tuple[str, ...]] = ("off", *RECOMMENDER_REGISTRY.names)


def _known_recommender(name: str) -> str:
    if name not in RECOMMENDERS:
        raise ValueError(f"unknown recommender; known: {', '.join(RECOMMENDERS)}")
    return name


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """The ``[limits]`` table: the settings validate it with these constraints."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    recommender: Annotated[
        str,
        AfterValidator(_known_recommender),
        Field(description="CPU and memory limits from usage: off, ml, vpa, window-<stat>"),
    ] = "ml"
    tolerance: Annotated[
        float,
        Field(
            ge=0,
            description="a limit within this fraction of the last is not news",
        ),
    ] = 0.05
    # State per job after a week of windows, pickled: ml ~35 KB for CPU (its moving
    # windows) and 4 KB for memory, vpa 3 KB each: ~0.4 GB at the cap under ml.
    max_jobs: Annotated[
        int,
        Field(
            ge=1,
            description="jobs whose recommenders are kept; past it the least recently "
            "observed is evicted (counted) so a flood of new job names stays bounded",
        ),
    ] = 10_000
    horizontal: Annotated[
        bool,
        Field(
            description="replica recommendations per deployment (Autopilot's horizontal "
            "scaling) on the limits topic; needs VM requests that name a deployment",
        ),
    ] = False
    # A scaler holds at most 72 h + 48 h of 5-minute windows: about 40 KB a
    # deployment whose usage moves, 100 KB for one whose usage only falls (each
    # window then stays a maximum for its horizon); 10,000 take 0.4 to 1 GB.
    max_deployments: Annotated[
        int,
        Field(
            ge=1,
            description="deployments whose horizontal scalers are kept; past it the least "
            "recently observed is evicted (counted)",
        ),
    ] = 10_000
    # The horizontal scaler's settings ([limits.scaler]); defaults are the paper's.
    scaler: ScalerConfig = field(default_factory=ScalerConfig)

    def __post_init__(self) -> None:
        if self.recommender not in RECOMMENDERS:
            raise ValueError(
                f"recommender must be one of {', '.join(RECOMMENDERS)}, got {self.recommender!r}"
            )
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance!r}")
        if self.max_deployments < 1:
            raise ValueError(f"limits.max_deployments must be >= 1, got {self.max_deployments!r}")
        # Direct construction (tests, evaluations) is checked as the settings are.
        self.scaler.horizontal()


class RecommenderFactory:
    """Builds the named recommender for one resource (picklable, unlike a closure)."""

    def __init__(self, name: str) -> None:
        if name not in RECOMMENDER_REGISTRY:
            raise ValueError(f"no recommender named {name!r}")
        self.name = name

    def __call__(self, resource: Resource) -> LimitRecommender:
        return RECOMMENDER_REGISTRY.build(self.name, None, resource)


class PoolLimits:
    """One pool's usage windows and recommenders."""

    def __init__(self, config: LimitsConfig) -> None:
        self.config = config
        self.windows = JobAggregator()
        self.tracker = LimitTracker(
            RecommenderFactory(config.recommender), config.tolerance, config.max_jobs
        )
        self.samples = 0

    def on_usage(self, sample: UsageSample) -> None:
        cpu = sample.cpu
        # Raw samples when the source has them; else the interval's mean and
        # peak stand for its distribution (as the offline evaluation does).
        values = cpu.samples or (cpu.mean, cpu.peak)
        memory = sample.memory.peak if sample.memory is not None else None
        self.windows.add(sample.vm_id, sample.vm_id, sample.time, values, memory)
        self.samples += 1

    def close_before(self, now: float) -> list[LimitDecision]:
        """Decisions of every window that ended strictly before ``now``, in time order."""
        decisions: list[LimitDecision] = []
        for job, cpu, memory in self.windows.close(math.nextafter(now, -math.inf)):
            for resource, observation in (("cpu", cpu), ("memory", memory)):
                if observation is None:
                    continue
                decision = self.tracker.observe(job, resource, observation)  # type: ignore[arg-type]
                if decision is not None:
                    decisions.append(decision)
        return decisions
