"""Admission policy registry: a name and arguments from configuration -> a validated policy.

As for placement (``core/placement/registry.py``), arguments are checked at
start-up: an unknown key or an out-of-range value raises ``AdmissionConfigError``
naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lavad.core.admission.cluster import PAPER_HORIZONS_S, PAPER_STEPS, LookaheadGrid
from lavad.core.admission.policies import (
    AdmissionPolicy,
    FirstMoment,
    SecondMoment,
    ZerothMoment,
)
from lavad.core.registry import Entry, Registry, RegistryError


class AdmissionArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ZerothArgs(AdmissionArgs):
    threshold: float = Field(
        default=0.8, gt=0, le=1, description="admit while active cores stay below this x capacity"
    )


class MomentArgs(AdmissionArgs):
    horizons_s: tuple[float, ...] = Field(
        default=PAPER_HORIZONS_S,
        min_length=1,
        description="sub-policy look-ahead horizons in seconds "
        "(paper: 3 y, 1 y, 1 month, 1 week, 24 h)",
    )
    steps: int = Field(
        default=PAPER_STEPS, ge=1, le=100_000, description="look-ahead times per sub-policy"
    )
    marginal_fraction: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="marginal heuristic: ignore look-aheads where the candidate's mean < this x "
        "capacity (0: off)",
    )

    def model_post_init(self, _context: Any) -> None:
        for k, horizon in enumerate(self.horizons_s):
            if horizon <= 0:
                raise ValueError(f"horizons_s[{k}] must be positive, got {horizon}")

    def grid(self) -> LookaheadGrid:
        return LookaheadGrid(tuple(self.horizons_s), self.steps)


class FirstArgs(MomentArgs):
    threshold: float = Field(
        default=0.8,
        gt=0,
        description="admit while expected cores stay below this x capacity (may exceed 1: "
        "Markov's bound is loose and the threshold is tuned)",
    )


class SecondArgs(MomentArgs):
    threshold: float = Field(
        default=0.05, gt=0, lt=1, description="admit while Cantelli's bound stays below this"
    )


class AdmissionConfigError(RegistryError):
    """An admission policy name or argument that cannot be used; ``key`` locates it."""


def _zeroth(args: AdmissionArgs) -> AdmissionPolicy:
    if not isinstance(args, ZerothArgs):
        raise TypeError(f"zeroth built with {type(args).__name__}")
    return ZerothMoment(args.threshold)


def _first(args: AdmissionArgs) -> AdmissionPolicy:
    if not isinstance(args, FirstArgs):
        raise TypeError(f"first built with {type(args).__name__}")
    return FirstMoment(args.threshold, args.grid(), args.marginal_fraction)


def _second(args: AdmissionArgs) -> AdmissionPolicy:
    if not isinstance(args, SecondArgs):
        raise TypeError(f"second built with {type(args).__name__}")
    return SecondMoment(args.threshold, args.grid(), args.marginal_fraction)


ADMISSION_POLICIES: Registry[AdmissionPolicy] = Registry(
    "admission policy",
    [
        Entry("zeroth", "threshold on active cores", _zeroth, ZerothArgs),
        Entry("first", "Markov bound on expected future cores", _first, FirstArgs),
        Entry("second", "Cantelli bound on future cores", _second, SecondArgs),
    ],
)


def validate_admission_args(
    name: str, args: Mapping[str, Any], key: str = "admission"
) -> AdmissionArgs:
    """The validated arguments of ``name``; ``AdmissionConfigError`` names a bad key."""
    try:
        ADMISSION_POLICIES.entry(name, f"{key}.policy")
        validated = ADMISSION_POLICIES.validate(name, args, key)
    except RegistryError as exc:
        raise AdmissionConfigError(exc.key, exc.reason) from None
    if not isinstance(validated, AdmissionArgs):
        raise TypeError(f"{name} validated to {type(validated).__name__}")
    return validated


def build_admission_policy(
    name: str, args: Mapping[str, Any] | None = None, key: str = "admission"
) -> AdmissionPolicy:
    """Build policy ``name`` from raw configuration arguments."""
    validated = validate_admission_args(name, args or {}, key)
    return ADMISSION_POLICIES.build(name, validated)
