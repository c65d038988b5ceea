"""Configuration of the migration planner: the ``[migrations]`` table.

The settings validate it at start-up by the constraints below (one
definition for the core and the shells); code that builds it directly (the
evaluations) is checked by ``__post_init__``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from lavad.core.input_bounds import MIN_CHECK_INTERVAL_S
from lavad.core.migrations.relief_rule import ReliefConfig
from lavad.models.argument_checks import require_at_least

OrderName = Literal["lars", "arrival", "shortest", "random"]
LifetimeSource = Literal["policy", "model", "oracle"]


@dataclass(frozen=True, slots=True)
class DefragConfig:
    """When lavad drains hosts on its own: empty hosts below ``empty_below`` of the pool.

    ``empty_below`` 0 turns defragmentation off (maintenance drains still run).
    """

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    empty_below: Annotated[
        float,
        Field(
            ge=0,
            lt=1,
            description="drain hosts when empty open hosts fall below this share of the pool"
            " (0: off)",
        ),
    ] = 0.0
    check_interval_s: Annotated[
        float,
        Field(
            ge=MIN_CHECK_INTERVAL_S,
            description="event time between looks at the empty-host share",
        ),
    ] = 300.0
    max_draining_hosts: Annotated[
        int, Field(ge=1, description="defragmentation drains in progress at most, per pool")
    ] = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.empty_below < 1.0:
            raise ValueError(f"empty_below must be in [0, 1), got {self.empty_below}")
        if not (
            math.isfinite(self.check_interval_s) and self.check_interval_s >= MIN_CHECK_INTERVAL_S
        ):
            raise ValueError(
                f"check_interval_s must be >= {MIN_CHECK_INTERVAL_S:g}, got {self.check_interval_s}"
            )
        require_at_least(1, max_draining_hosts=self.max_draining_hosts)


@dataclass(frozen=True, slots=True)
class RollingConfig:
    """Rolling maintenance driven by lavad: ``batch`` hosts drain every ``every_s``.

    Hosts go in column order from ``start_s`` on, wrapping around; each is
    back in service once empty (the maintenance itself takes no time here).
    Empty or already closed hosts are passed over.
    """

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    batch: Annotated[int, Field(ge=1)]
    every_s: Annotated[float, Field(ge=MIN_CHECK_INTERVAL_S)]
    start_s: Annotated[float, Field(ge=0)] = 0.0

    def __post_init__(self) -> None:
        require_at_least(1, batch=self.batch)
        if not self.every_s >= MIN_CHECK_INTERVAL_S:
            raise ValueError(f"every_s must be >= {MIN_CHECK_INTERVAL_S:g}, got {self.every_s}")


@dataclass(frozen=True, slots=True)
class MigrationsConfig:
    """How drains are carried out.

    ``max_concurrent`` live migrations run at once in a pool (the paper's
    batches of 3), each keeping its source and target busy ``duration_s``
    (the paper's conservative 20 minutes). ``lifetimes`` "policy" reads the
    placement policy's (re)predictions; under a policy that keeps none, a
    model of the planner's own when the pool drains by itself (defrag,
    rolling, schedule), else none: a host.drain's VMs then tie and go in
    arrival order, and the plans say so. "model" always keeps one (the
    policy's or the planner's own: Best Fit replays run ~4x slower with
    it). "oracle" reads true lifetimes (replays only).
    ``retry_s``: when no queued VM fits anywhere, look again this much later.
    ``drain_schedule``: (time, host id) pairs that replace the defragmentation
    trigger (evaluations); ``rolling`` replaces it with rolling maintenance.
    ``compare``: (order, lifetimes) pairs counted
    beside the acting order on the same drains and exits, moving nothing.
    ``relief``: GPA hosts whose realised overflows reject rho shed VMs
    (``relief_rule.py``, ``relief.py``); off unless enabled.
    """

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    order: Annotated[
        OrderName, Field(description="which queued VM goes next; lars: longest remaining first")
    ] = "lars"
    lifetimes: Annotated[
        LifetimeSource,
        Field(
            description="policy: the placement policy's predictions (see config/lavad.toml);"
            " model: always a model (the policy's or the planner's own); oracle: replays only"
        ),
    ] = "policy"
    max_concurrent: Annotated[int, Field(ge=1, description="live migrations at once, per pool")] = 3
    duration_s: Annotated[
        float, Field(ge=0, description="how long a migration keeps its source and target busy")
    ] = 1200.0
    retry_s: Annotated[
        float,
        Field(
            ge=MIN_CHECK_INTERVAL_S,
            description="when no queued VM fits anywhere, look again after",
        ),
    ] = 300.0
    defrag: DefragConfig = DefragConfig()
    relief: ReliefConfig = field(default_factory=ReliefConfig)
    drain_schedule: tuple[tuple[float, str], ...] | None = None
    rolling: RollingConfig | None = None
    # Orders counted beside the acting one on the same drains (``shadow.py``).
    compare: tuple[tuple[OrderName, LifetimeSource], ...] = ()

    def __post_init__(self) -> None:
        require_at_least(1, max_concurrent=self.max_concurrent)
        if self.duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {self.duration_s}")
        if not self.retry_s >= MIN_CHECK_INTERVAL_S:
            raise ValueError(f"retry_s must be >= {MIN_CHECK_INTERVAL_S:g}, got {self.retry_s}")


def drains_by_itself(config: MigrationsConfig) -> bool:
    """Whether the pool drains hosts without host.drain events."""
    return (
        config.defrag.empty_below > 0
        or config.rolling is not None
        or config.drain_schedule is not None
    )
