"""Limit decisions: emitted when a job's recommended limit changes, with their explanation.

``LimitDecision`` is what goes on the limits output; the engine maps it onto
``streams/schema.py``. ``LimitTracker`` feeds observations to one recommender
per (job, resource) and emits a decision only when the recommendation moves
by more than ``tolerance`` (relative), so the output is not a copy of the
usage stream.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import orjson

from lavad.models.argument_checks import require_at_least
from lavad.models.limits.histogram import Observation
from lavad.models.limits.window import LimitRecommender
from lavad.models.recency import touch

Resource = Literal["cpu", "memory"]


@dataclass(frozen=True, slots=True)
class LimitDecision:
    """A new limit for one job's one resource, and why."""

    decision_id: str
    time: float
    job_id: str
    resource: Resource
    limit: float
    previous: float | None
    recommender: str
    statistic: str
    window_s: float | None
    half_life_s: float | None
    margin: float | None
    model: str | None

    def explanation(self) -> str:
        """One line a person can read."""
        was = "first" if self.previous is None else f"was {self.previous:.4g}"
        parts = [f"{self.resource} limit {self.limit:.4g} ({was}) by {self.recommender}"]
        parts[0] += f": {self.statistic}"
        if self.half_life_s is not None:
            parts.append(f"half-life {self.half_life_s / 3600:g} h")
        if self.window_s is not None:
            parts.append(f"window {self.window_s / 3600:g} h")
        if self.margin is not None:
            parts.append(f"margin {self.margin:g}")
        if self.model is not None:
            parts.append(f"model {self.model}")
        return ", ".join(parts)


def _float_or_none(value: str | float | None) -> float | None:
    return None if value is None or isinstance(value, str) else float(value)


def decision_id(job_id: str, resource: str, time: float, limit: float) -> str:
    """Deterministic: the same inputs give the same id on every replay."""
    # A JSON array, not a joined string: a job id holding the separator
    # cannot make two tuples hash alike.
    key = orjson.dumps(["limit", job_id, resource, time, limit])
    return hashlib.blake2b(key, digest_size=12).hexdigest()


class LimitTracker:
    """One recommender per (job, resource); a decision whenever a limit changes.

    Jobs are named by the usage stream, so a flood of new names must not
    grow the state without bound: at most ``max_jobs`` jobs are kept, in
    least-recently-observed order, and a new job past that evicts the
    oldest (its recommenders and published limits; ``evicted`` counts them).
    An evicted job that comes back starts afresh, as a new one would.
    """

    def __init__(
        self,
        factory: Callable[[Resource], LimitRecommender],
        tolerance: float = 0.0,
        max_jobs: int = 10_000,
    ) -> None:
        if not (math.isfinite(tolerance) and tolerance >= 0):
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        require_at_least(1, max_jobs=max_jobs)
        self.factory = factory
        self.tolerance = tolerance
        self.max_jobs = max_jobs
        self.recommenders: dict[tuple[str, Resource], LimitRecommender] = {}
        self.published: dict[tuple[str, Resource], float] = {}
        # Jobs in least-recently-observed order (a dict keeps insertion order).
        self._jobs: dict[str, None] = {}
        self.evicted = 0

    def _touch(self, job_id: str) -> None:
        for oldest in touch(self._jobs, job_id, self.max_jobs):
            for resource in ("cpu", "memory"):
                self.recommenders.pop((oldest, resource), None)
                self.published.pop((oldest, resource), None)
            self.evicted += 1

    @property
    def jobs(self) -> int:
        return len(self._jobs)

    def observe(self, job_id: str, resource: Resource, obs: Observation) -> LimitDecision | None:
        """Learn from one window; a decision when the limit moved past the tolerance."""
        self._touch(job_id)
        key = (job_id, resource)
        rec = self.recommenders.get(key)
        if rec is None:
            rec = self.recommenders[key] = self.factory(resource)
        previous = self.published.get(key)
        if previous is not None and obs.peak > previous:
            rec.on_overrun(obs.end, previous)
        rec.observe(obs)
        limit = rec.limit
        if limit is None:
            return None
        if previous is not None and abs(limit - previous) <= self.tolerance * previous:
            return None
        self.published[key] = limit
        info = rec.explain()
        return LimitDecision(
            decision_id=decision_id(job_id, resource, obs.end, limit),
            time=obs.end,
            job_id=job_id,
            resource=resource,
            limit=limit,
            previous=previous,
            recommender=rec.name,
            statistic=str(info.get("statistic")),
            window_s=_float_or_none(info.get("window_s")),
            half_life_s=_float_or_none(info.get("half_life_s")),
            margin=_float_or_none(info.get("margin")),
            model=None if info.get("model") is None else str(info.get("model")),
        )
