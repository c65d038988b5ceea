"""Lifetime tables fitted in hindsight: what a model on the trace's features could give at best.

A learned lifetime policy falls short of its oracle for two reasons: the
model has not yet seen what it predicts (it learns online, from exits as
they come), and a VM's features do not tell its lifetime (the oracle knows
each VM's own). This separates the two. The policy replays a window once,
learning as it goes; its model then holds the tables of the whole window
(every exit, the VMs still running censored at the last refit). Replayed
again from an empty pool with those tables frozen, the policy predicts every
VM from the distribution of its own feature group over the window, which no
online model of the same features can know better. What the hindsight run
still misses of the oracle's gain is the features' part.

A variant ``NAME+hindsight`` in ``lavad evaluate placement`` is ``NAME``
replayed with the tables that ``NAME``'s own run in the same cell ended with;
``NAME`` must come before it in the list of policies.
"""

from __future__ import annotations

from typing import Any

from lavad.core.engine import Engine
from lavad.core.placement.lifetime import LifetimeTracker
from lavad.core.placement.lifetime_policy import LifetimePolicy
from lavad.models.lifetime.protocol import LifetimeModel, RunningVMs

SUFFIX = "+hindsight"

# Per pool, the lifetime model a replay ended with.
FittedModels = dict[str, LifetimeModel]


class FrozenTables:
    """A fitted lifetime model that no longer refits: its tables stay the window's.

    Everything but ``refit`` is the fitted model's own (its group rows, its
    choice of row, its tables), so the tracker predicts through it as
    through the model it wraps.
    """

    def __init__(self, fitted: LifetimeModel) -> None:
        self._fitted = fitted
        self.refits_skipped = 0

    def refit(self, running: RunningVMs, *, now: float) -> None:
        self.refits_skipped += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fitted, name)


def split(spec: str) -> tuple[str, bool]:
    """``NAME+hindsight`` -> (NAME, True); any other spec -> (spec, False)."""
    if spec.endswith(SUFFIX):
        return spec.removesuffix(SUFFIX), True
    return spec, False


def check_order(specs: list[str]) -> None:
    """Refuse a hindsight variant whose plain run does not come before it."""
    for i, spec in enumerate(specs):
        base, hindsight = split(spec)
        if hindsight and base not in specs[:i]:
            raise ValueError(f"--policy {spec}: needs --policy {base} before it (its tables)")


def _tracker(engine: Engine, pool: str) -> LifetimeTracker | None:
    policy = engine.pool(pool).policy
    return policy.las.tracker if isinstance(policy, LifetimePolicy) else None


def fitted_models(engine: Engine) -> FittedModels:
    """Per pool of a replayed engine with a lifetime policy, the model it ended with."""
    models: FittedModels = {}
    for name in engine.pools:
        tracker = _tracker(engine, name)
        if tracker is not None:
            models[name] = tracker.model
    return models


def install(engine: Engine, models: FittedModels) -> list[FrozenTables]:
    """Open each pool of ``models`` in a fresh ``engine`` with its fitted tables, frozen."""
    frozen = []
    for name, model in models.items():
        tracker = _tracker(engine, name)
        if tracker is None:
            raise ValueError(f"pool {name!r}: the policy keeps no lifetimes to freeze")
        tables = FrozenTables(model)
        tracker.model = tables  # type: ignore[assignment]
        frozen.append(tables)
    return frozen
