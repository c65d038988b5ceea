"""Configuration of the migration planner (validated by the settings at start-up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OrderName = Literal["lars", "arrival", "shortest", "random"]
LifetimeSource = Literal["policy", "model", "oracle"]


@dataclass(frozen=True, slots=True)
class DefragConfig:
    """When lavad drains hosts on its own: empty hosts below ``empty_below`` of the pool.

    ``empty_below`` 0 turns defragmentation off (maintenance drains still run).
    """

    empty_below: float = 0.0
    check_interval_s: float = 300.0
    max_draining_hosts: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.empty_below < 1.0:
            raise ValueError(f"empty_below must be in [0, 1), got {self.empty_below}")
        if self.check_interval_s <= 0:
            raise ValueError(f"check_interval_s must be > 0, got {self.check_interval_s}")
        if self.max_draining_hosts < 1:
            raise ValueError(f"max_draining_hosts must be >= 1, got {self.max_draining_hosts}")


@dataclass(frozen=True, slots=True)
class RollingConfig:
    """Rolling maintenance driven by lavad: ``batch`` hosts drain every ``every_s``.

    Hosts go in column order from ``start_s`` on, wrapping around; each is
    back in service once empty (the maintenance itself takes no time here).
    Empty or already closed hosts are passed over.
    """

    batch: int
    every_s: float
    start_s: float = 0.0

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {self.every_s}")


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
    """

    order: OrderName = "lars"
    lifetimes: LifetimeSource = "policy"
    max_concurrent: int = 3
    duration_s: float = 1200.0
    retry_s: float = 300.0
    defrag: DefragConfig = DefragConfig()
    drain_schedule: tuple[tuple[float, str], ...] | None = None
    rolling: RollingConfig | None = None
    # Orders counted beside the acting one on the same drains (``shadow.py``).
    compare: tuple[tuple[OrderName, LifetimeSource], ...] = ()

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {self.duration_s}")
        if self.retry_s <= 0:
            raise ValueError(f"retry_s must be > 0, got {self.retry_s}")


def drains_by_itself(config: MigrationsConfig) -> bool:
    """Whether the pool drains hosts without host.drain events."""
    return (
        config.defrag.empty_below > 0
        or config.rolling is not None
        or config.drain_schedule is not None
    )
