"""A river classifier over lifetime bins: the machine-learning alternative to the life tables.

The LAVA paper's model is a distribution over lifetimes; a classifier over
log-spaced lifetime classes gives one too (its class probabilities). This
one is river's Hoeffding Adaptive Tree: it learns one exit at a time, and
its ADWIN drift detectors replace branches whose error grows, which keeps it
fresh as the workload changes.

Its class probabilities are spread over the life tables' fine bins (each
class uniformly over the bins it covers), so the same E[T_r | T_u] and
P(T > t | T_u) code answers for both models and they are compared on equal
terms (``models/lifetime/evaluation.py``).

What it cannot do, by construction, is learn from censored VMs: a
classifier needs a label, and a running VM has none. It learns only from
exits, so a fleet of long-running VMs pulls it no higher until they end; the
life tables count them as censored at every refit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lavad.models.arrays import FloatArray
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import USED_FEATURES


def river_module(name: str) -> Any:
    """``river.<name>``, imported on first use: river is an install extra (``evaluation``),
    since only offline studies use it, and every non-live command imports this module."""
    try:
        from importlib import import_module  # noqa: PLC0415

        return import_module(f"river.{name}")
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] != "river":
            raise
        raise ModuleNotFoundError(
            "this study needs river: pip install 'lavad[evaluation]' (make installs it)",
            name="river",
        ) from None


def river_features(
    cores: float, memory_gib: float, flavor: str, features: Mapping[str, object]
) -> dict[str, float | str]:
    """What the classifier sees: the shape (numeric and as a name) and the named features."""
    row: dict[str, float | str] = {
        "cores": float(cores),
        "memory_gib": float(memory_gib),
        "shape": flavor or f"{cores:g}c{memory_gib:g}g",
    }
    for name in USED_FEATURES:
        value = features.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            row[name] = float(value)
    return row


class RiverLifetimeClassifier:
    """Lifetime classes of ``fine_per_class`` adjacent fine bins; probabilities back on the bins."""

    def __init__(self, bins: LifetimeBins, *, fine_per_class: int = 4, seed: int = 0) -> None:
        if fine_per_class < 1:
            raise ValueError(f"fine_per_class must be >= 1, got {fine_per_class}")
        self.bins = bins
        self.fine_per_class = fine_per_class
        self.classes = -(-bins.count // fine_per_class)
        # river's trees are not annotated: Any.
        self.model: Any = river_module("tree").HoeffdingAdaptiveTreeClassifier(seed=seed)
        self.learned = 0
        # Fine bins -> class, and the share of its class's mass each fine bin gets.
        self._class_of = np.arange(bins.count) // fine_per_class
        width = np.bincount(self._class_of, minlength=self.classes).astype(float)
        self._share = 1.0 / width[self._class_of]

    def learn(self, x: dict[str, float | str], lifetime_s: float) -> None:
        fine = int(self.bins.index(np.array([lifetime_s]))[0])
        self.model.learn_one(x, int(self._class_of[fine]))
        self.learned += 1

    def distribution(self, x: dict[str, float | str]) -> FloatArray:
        """Probability mass over the fine bins (uniform before the first exit)."""
        proba = self.model.predict_proba_one(x) if self.learned else {}
        per_class = np.zeros(self.classes)
        for label, p in proba.items():
            per_class[int(label)] = p
        total = per_class.sum()
        if total <= 0:
            uniform: FloatArray = np.full(self.bins.count, 1.0 / self.bins.count)
            return uniform
        mass: FloatArray = per_class[self._class_of] * self._share / total
        return mass
