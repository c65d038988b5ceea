"""Autopilot's ML recommender (section 3.2.3, equations 4-9).

An ensemble of arg-min models, one per (decay rate ``d_m``, safety margin
``M_m``). Each model keeps, for every candidate limit ``L = b[i]``, exponentially
smoothed overrun and underrun counts (equations 4, 5), picks
``L'_m = argmin w_o o(L) + w_u u(L) + w_dL [L != L'_m(prev)]`` (6) and adds its
margin (7). Each model's historical cost ``c_m`` is smoothed with rate ``d`` (8),
and the recommender follows the model with the least
``c_m + w_dm [m != m(prev)] + w_dL [L_m != L(prev)]`` (9).

Where we differ from the paper, and why:

- Equation 8 charges a model for ``L_m[t]`` against ``s[t]``, a limit that was
  chosen after seeing ``s[t]``. We charge the limit each model had *in force*
  during the window (chosen at ``t - 1``), so the model choice rewards
  prediction, which is what the limits are for.
- Equation 9's change penalty compares with ``L[t]``, the value being chosen;
  we compare with the previous final limit ``L[t-1]``.
- The margin ``M_m`` is additive as in equation 7, in the signal's unit (here
  a fraction of the request), and is included in the charged limit.
- Overruns and underruns are counted as *fractions* of the window's samples
  rather than sample counts, so the weights mean the same whether a window
  holds 300 one-second samples (Borg) or one 5-minute reading (our traces).
- ``underrun="slack"`` (an option; ``"count"``, the paper's, is the default)
  weighs each sample below the limit by its relative slack ``(L - v) / L``
  instead of 1. With one reading per 5-minute window, as in our traces, a
  count cannot tell a limit 2 % above usage from one 50 % above (both count
  1), so the model choice (equation 8) would only ever see overruns and
  drift to the largest margin; Borg's windows hold ~300 samples, where the
  count does measure how far the limit sits above most of them.
- ``margin_mode="mul"`` (an option; ``"add"``, equation 7, is the default)
  makes the margin a fraction of the limit, ``L'_m (1 + M_m)``, as the
  moving-window and VPA margins are: one grid then fits jobs of any size.
- Ties go to the smaller limit, then to the earlier model in the grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from lavad.models.limits.histogram import BucketScheme, FloatArray, Observation
from lavad.models.limits.window import HeldLimit


def _check_weight(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class MlConfig:
    """The ensemble's grid and its five hyperparameters (``d, w_o, w_u, w_dL, w_dm``).

    The bare defaults are the paper's equations as written (count underruns,
    additive margins). ``for_resource`` gives the configurations tuned with
    ``lavad.evaluation.limits.sweep_ml`` on 8 Google 2011 jobs held
    out of the evaluation sample; the paper does not publish its values.
    """

    decays: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)
    margins: tuple[float, ...] = (0.0, 0.02, 0.05, 0.1, 0.2)
    w_o: float = 1.0
    w_u: float = 0.05
    w_delta_l: float = 0.5
    w_delta_m: float = 0.5
    d: float = 0.05
    underrun: Literal["count", "slack"] = "count"
    margin_mode: Literal["add", "mul"] = "add"

    @classmethod
    def for_resource(cls, resource: Literal["cpu", "memory"]) -> MlConfig:
        """The swept configuration: slack underruns, multiplicative margins.

        Penalties sit at the scale of the costs they compete with (a cost is a
        smoothed per-window fraction, ~0.01), or the first model is never left.
        """
        # The resources differ in the margins offered and the three penalties.
        margins: tuple[float, ...]
        if resource == "cpu":
            margins, w_u, w_delta_l, w_delta_m = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5), 0.1, 0.005, 0.005
        elif resource == "memory":
            margins = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75)
            w_u, w_delta_l, w_delta_m = 0.003, 0.002, 0.002
        else:
            raise ValueError(f"resource must be 'cpu' or 'memory', got {resource!r}")
        return cls(
            decays=(0.003, 0.01, 0.03, 0.1, 0.3),
            margins=margins,
            w_u=w_u,
            w_delta_l=w_delta_l,
            w_delta_m=w_delta_m,
            d=0.01,
            underrun="slack",
            margin_mode="mul",
        )

    def __post_init__(self) -> None:
        if self.margin_mode not in ("add", "mul"):
            raise ValueError(f"margin_mode must be 'add' or 'mul', got {self.margin_mode!r}")
        if self.underrun not in ("count", "slack"):
            raise ValueError(f"underrun must be 'count' or 'slack', got {self.underrun!r}")
        if not self.decays or not self.margins:
            raise ValueError("decays and margins must each hold at least one value")
        for value in self.decays:
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ValueError(f"decays must be in (0, 1], got {value!r}")
        for value in self.margins:
            _check_weight("margins", value)
        for name in ("w_o", "w_u", "w_delta_l", "w_delta_m"):
            _check_weight(name, getattr(self, name))
        if not (math.isfinite(self.d) and 0 < self.d <= 1):
            raise ValueError(f"d must be in (0, 1], got {self.d!r}")


@dataclass(frozen=True, slots=True)
class Model:
    """One arg-min model: its decay rate and margin."""

    decay: float
    margin: float

    def label(self) -> str:
        return f"d={self.decay:g},M={self.margin:g}"


class MlRecommender(HeldLimit):
    """The ensemble for one job's one resource."""

    def __init__(self, config: MlConfig | None = None, scheme: BucketScheme | None = None) -> None:
        self.config = config if config is not None else MlConfig()
        self.scheme = scheme if scheme is not None else BucketScheme.default()
        self.name = "ml"
        cfg = self.config
        self.models: tuple[Model, ...] = tuple(Model(d, m) for d in cfg.decays for m in cfg.margins)
        k = len(self.scheme)
        self._decay_of = np.repeat(np.arange(len(cfg.decays)), len(cfg.margins))
        self._margin_of = np.tile(np.asarray(cfg.margins, dtype=np.float64), len(cfg.decays))
        self._over = np.zeros((len(cfg.decays), k))
        self._under = np.zeros((len(cfg.decays), k))
        self._d = np.asarray(cfg.decays, dtype=np.float64)[:, None]
        self._choice: NDArray[np.intp] | None = None  # L'_m as a bucket index, per decay rate
        self.cost = np.zeros(len(self.models))  # c_m
        # Whether each model's limit in force changed at its last step (for eq. 8).
        self._changed = np.zeros(len(self.models))
        self._chosen: int | None = None
        self._limit: float | None = None

    def model_limits(self) -> FloatArray:
        """``L_m`` per model: ``b[L'_m] + M_m`` (or ``b[L'_m] (1 + M_m)``); empty before data."""
        if self._choice is None:
            return np.zeros(0)
        base = self.scheme.b[self._choice[self._decay_of]]
        if self.config.margin_mode == "mul":
            result: FloatArray = base * (1.0 + self._margin_of)
            return result
        return base + self._margin_of

    @property
    def chosen(self) -> Model | None:
        return None if self._chosen is None else self.models[self._chosen]

    def observe(self, obs: Observation) -> None:
        cfg = self.config
        counts = self.scheme.counts(obs.values) / len(obs.values)
        # above[i]: samples in buckets j > i, i.e. over the limit b[i];
        # below[i]: samples in buckets j < i (equations 4, 5).
        cum = np.cumsum(counts)
        total = cum[-1]
        above = total - cum
        below = cum - counts
        b = self.scheme.b
        if cfg.underrun == "slack":
            # sum_{j<i} s[j] (b[i] - b[j]) / b[i]
            below_load = np.cumsum(counts * b) - counts * b
            below = below - below_load / b
        values = np.asarray(obs.values, dtype=np.float64)

        # Equation 8, on the limits in force during this window.
        limits = self.model_limits()
        if limits.size:
            over_m = (values[None, :] > limits[:, None]).mean(axis=1)
            if cfg.underrun == "slack":
                gap = np.maximum(limits[:, None] - values[None, :], 0.0)
                under_m = (gap / np.maximum(limits[:, None], 1e-12)).mean(axis=1)
            else:
                under_m = (values[None, :] < limits[:, None]).mean(axis=1)
            step = cfg.w_o * over_m + cfg.w_u * under_m + cfg.w_delta_l * self._changed
            self.cost = cfg.d * step + (1.0 - cfg.d) * self.cost

        # Equations 4-5 for every decay rate, then 6 per decay rate: models that
        # share a decay rate differ only by the margin added after the arg min
        # (equation 7), so they share L'_m and its change penalty.
        self._over = (1.0 - self._d) * self._over + self._d * above[None, :]
        self._under = (1.0 - self._d) * self._under + self._d * below[None, :]
        base = cfg.w_o * self._over + cfg.w_u * self._under
        if self._choice is not None:
            base += cfg.w_delta_l
            base[np.arange(len(cfg.decays)), self._choice] -= cfg.w_delta_l
        new_choice = np.argmin(base, axis=1).astype(np.intp)
        if self._choice is None:
            self._changed = np.zeros(len(self.models))
        else:
            self._changed = (new_choice != self._choice)[self._decay_of].astype(np.float64)
        self._choice = new_choice
        self._select()

    def _select(self) -> None:
        """Equation 9: the model with the least penalised decayed cost."""
        cfg = self.config
        limits = self.model_limits()
        score = self.cost.copy()
        if self._chosen is not None:
            score += cfg.w_delta_m * (np.arange(len(self.models)) != self._chosen)
        if self._limit is not None:
            score += cfg.w_delta_l * (np.abs(limits - self._limit) > 1e-12)
        best = float(score.min())
        tied = np.flatnonzero(score <= best + 1e-12)
        pick = int(tied[np.argmin(limits[tied])])
        self._chosen = pick
        self._limit = float(limits[pick])

    def explain(self) -> dict[str, str | float | None]:
        model = self.chosen
        return {
            "recommender": self.name,
            "statistic": "argmin w_o*overrun + w_u*underrun + w_dL*change",
            "half_life_s": None,
            "window_s": None,
            "margin": None if model is None else model.margin,
            "model": None if model is None else model.label(),
            "model_cost": None if self._chosen is None else float(self.cost[self._chosen]),
        }

    def on_overrun(self, time: float, limit: float) -> None:
        """Overruns are already in the cost; the paper's ML recommender has no OOM bump."""
