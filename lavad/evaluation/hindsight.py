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

Those tables hold more than the features: a VM's finest group is its owner's
(its tenant, or in Azure V1 its batch, with its shape), fitted on the exits
of that very VM and of its siblings, which end together more often than not.
Online, a batch's siblings all arrive before any of them exits, so that
group has nothing to say at a placement; frozen, it tells the VM its own
batch's lifetimes. ``NAME+hindsight-features`` is the bound without that
leak: the same frozen tables, but a VM is predicted from its finest group
*below* its owner's (shape, hour and batch size, and coarser) with enough
observations, as the model's own rule picks among them.
"""

from __future__ import annotations

from typing import Any

from lavad.core.engine import Engine
from lavad.core.placement.lifetime import LifetimeTracker
from lavad.core.placement.lifetime_policy import LifetimePolicy
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.models.lifetime.protocol import GroupRows, LifetimeModel, RunningVMs

SUFFIX = "+hindsight"
# The bound from the features alone: never the VM's owner group (module docstring).
FEATURES_SUFFIX = "+hindsight-features"

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


class FrozenFeatureTables(FrozenTables):
    """``FrozenTables`` that never predict a VM from its owner's group (level 0).

    Only for the life tables' own back-off (``GroupedLifeTables.choose``: the
    first group of the tuple with enough observations, else the last), where
    the tuple without its first row is the same rule over the coarser groups.
    """

    def __init__(self, fitted: LifetimeModel) -> None:
        if not isinstance(fitted, GroupedLifeTables):
            raise ValueError(
                f"{FEATURES_SUFFIX} needs the life tables' back-off, not {type(fitted).__name__}"
            )
        super().__init__(fitted)

    def choose(self, rows: GroupRows) -> int:
        return self._fitted.choose(rows[1:])


# Each variant's suffix and how it freezes the tables.
_FROZEN: dict[str, type[FrozenTables]] = {
    SUFFIX: FrozenTables,
    FEATURES_SUFFIX: FrozenFeatureTables,
}


def split(spec: str) -> tuple[str, str | None]:
    """``NAME+hindsight`` -> (NAME, SUFFIX), ``NAME+hindsight-features`` -> (NAME,
    FEATURES_SUFFIX); any other spec -> (spec, None)."""
    for suffix in _FROZEN:
        if spec.endswith(suffix):
            return spec.removesuffix(suffix), suffix
    return spec, None


def wanted(spec: str, specs: list[str]) -> bool:
    """Whether a hindsight variant of the plain ``spec`` is among ``specs`` (its run's
    tables must then be kept)."""
    return any(spec + suffix in specs for suffix in _FROZEN)


def check_order(specs: list[str]) -> None:
    """Refuse a hindsight variant whose plain run does not come before it."""
    for i, spec in enumerate(specs):
        base, hindsight = split(spec)
        if hindsight is not None and base not in specs[:i]:
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


def install(engine: Engine, models: FittedModels, suffix: str = SUFFIX) -> list[FrozenTables]:
    """Open each pool of ``models`` in a fresh ``engine`` with its fitted tables, frozen
    (``suffix`` says how: ``SUFFIX`` or ``FEATURES_SUFFIX``)."""
    frozen = []
    for name, model in models.items():
        tracker = _tracker(engine, name)
        if tracker is None:
            raise ValueError(f"pool {name!r}: the policy keeps no lifetimes to freeze")
        tables = _FROZEN[suffix](model)
        tracker.model = tables  # type: ignore[assignment]
        frozen.append(tables)
    return frozen
