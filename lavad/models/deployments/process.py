"""A deployment's scaling process (paper 002, section 2.1) with conjugate Gamma beliefs.

The process, per deployment, with time in seconds:

- every active core lives an exponential time with rate ``mu`` (core deaths);
- scale-outs arrive as a Poisson process with rate ``lam``; a scale-out asks for
  ``1 + Poisson(size)`` cores;
- the deployment is shut down whole after an exponential maximum lifetime with
  rate ``kill``; it also dies when its last core dies (death is permanent).

Choices that differ from the paper, on purpose:

- The paper couples the rates: maximum-lifetime rate ``mu / kappa`` and
  scale-out rate ``rho * mu ** alpha`` with population constants fitted on
  Azure. Here ``mu``, ``lam``, ``size`` and ``kill`` carry *independent* Gamma
  beliefs. The likelihood of a deployment's history factorises over the four
  rates (deaths / core exposure, scale-outs / alive time, excess sizes / scale
  outs, kill / alive time), so independent priors stay independent and every
  update is exactly conjugate; the coupled form is not conjugate for ``lam``.
- The paper fits an exponential for the maximum lifetime on the population;
  we fit its rate and use it as the mean of a shape-1 Gamma belief, so a
  deployment's own survival sharpens its belief like the other rates.

All state is advanced by explicit event times (``now`` arguments); nothing here
reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class GammaBelief:
    """Gamma(shape, rate) over a rate parameter: ``shape`` pseudo-events in ``rate`` exposure."""

    shape: float
    rate: float

    def __post_init__(self) -> None:
        if not (self.shape > 0 and math.isfinite(self.shape)):
            raise ValueError(f"shape must be positive and finite, got {self.shape}")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be positive and finite, got {self.rate}")

    @property
    def mean(self) -> float:
        return self.shape / self.rate

    def updated(self, events: float, exposure: float) -> GammaBelief:
        """The posterior after ``events`` Poisson events in ``exposure`` (conjugate update)."""
        if events < 0:
            raise ValueError(f"events must be >= 0, got {events}")
        if exposure < 0:
            raise ValueError(f"exposure must be >= 0, got {exposure}")
        return GammaBelief(self.shape + events, self.rate + exposure)


@dataclass(frozen=True, slots=True)
class DeploymentPriors:
    """Population priors: core death rate, scale-out rate, excess scale-out size, kill rate."""

    core_death: GammaBelief
    scale_out: GammaBelief
    size: GammaBelief
    kill: GammaBelief


@dataclass(frozen=True, slots=True)
class DeploymentParams:
    """The true (hidden) parameters of one deployment, used by the simulator."""

    core_death_rate: float
    scale_out_rate: float
    size_mean_excess: float
    kill_rate: float


@dataclass(slots=True)
class DeploymentState:
    """One deployment's observed history, folded into sufficient statistics online.

    ``core_exposure`` is the integral of active cores over time (core-seconds):
    the exposure of the exponential core lifetimes, censored cores included.
    ``alive_time`` is the exposure of the scale-out and kill processes.
    """

    deployment_id: str
    arrived: float
    cores: float
    last_time: float
    core_exposure: float = 0.0
    alive_time: float = 0.0
    core_deaths: float = 0.0
    scale_outs: int = 0
    excess_size: float = 0.0
    version: int = field(default=0)

    @classmethod
    def arrive(cls, deployment_id: str, now: float, cores: float) -> DeploymentState:
        if cores <= 0:
            raise ValueError(f"cores must be positive, got {cores}")
        return cls(deployment_id, arrived=now, cores=cores, last_time=now)

    def advance(self, now: float) -> None:
        """Accrue exposure up to ``now``; events must come in time order."""
        if now < self.last_time:
            raise ValueError(f"now {now} precedes the last event {self.last_time}")
        elapsed = now - self.last_time
        self.core_exposure += self.cores * elapsed
        self.alive_time += elapsed
        self.last_time = now

    def scale_out(self, now: float, cores: float) -> None:
        """A granted scale-out of ``cores`` (>= 1) cores at ``now``."""
        if cores < 1:
            raise ValueError(f"cores must be >= 1 for a scale-out, got {cores}")
        self.advance(now)
        self.scale_outs += 1
        self.excess_size += cores - 1.0
        self.cores += cores
        self.version += 1

    def scale_in(self, now: float, cores: float) -> None:
        """``cores`` cores die at ``now`` (each is one exponential lifetime ending)."""
        if cores <= 0:
            raise ValueError(f"cores must be positive, got {cores}")
        self.advance(now)
        removed = min(cores, self.cores)
        self.core_deaths += removed
        self.cores -= removed
        self.version += 1

    def posterior(self, priors: DeploymentPriors) -> DeploymentPriors:
        """The four conjugate posteriors given the history up to ``last_time``."""
        return DeploymentPriors(
            core_death=priors.core_death.updated(self.core_deaths, self.core_exposure),
            scale_out=priors.scale_out.updated(self.scale_outs, self.alive_time),
            size=priors.size.updated(self.excess_size, self.scale_outs),
            kill=priors.kill.updated(0.0, self.alive_time),
        )


def sample_params(priors: DeploymentPriors, rng: np.random.Generator) -> DeploymentParams:
    """Draw one deployment's parameters from (independent) Gamma beliefs."""

    def draw(belief: GammaBelief) -> float:
        return float(rng.gamma(belief.shape, 1.0 / belief.rate))

    return DeploymentParams(
        core_death_rate=draw(priors.core_death),
        scale_out_rate=draw(priors.scale_out),
        size_mean_excess=draw(priors.size),
        kill_rate=draw(priors.kill),
    )


def simulate_core_counts(
    params: DeploymentParams,
    initial_cores: int,
    times: NDArray[np.float64],
    rng: np.random.Generator,
    *,
    die_at_zero: bool = True,
) -> NDArray[np.float64]:
    """One exact (event-driven) path of the process, sampled at ``times`` (from 0).

    With ``die_at_zero`` the deployment dies for good when its last core dies
    (section 2.1); without it, it may scale out again from zero cores, which is
    the process the closed-form moments describe exactly.
    """
    if initial_cores < 0:
        raise ValueError(f"initial_cores must be >= 0, got {initial_cores}")
    out = np.zeros(len(times))
    horizon = float(times[-1]) if len(times) else 0.0
    kill_at = rng.exponential(1.0 / params.kill_rate) if params.kill_rate > 0 else math.inf
    # Every core's death time is drawn when it is born; a Poisson stream of
    # scale-outs adds cores. Counting alive cores at each sample time is exact.
    births: list[float] = [0.0] * initial_cores
    deaths: list[float] = list(rng.exponential(1.0 / params.core_death_rate, initial_cores))
    t = 0.0
    while params.scale_out_rate > 0:
        t += rng.exponential(1.0 / params.scale_out_rate)
        if t > horizon:
            break
        size = 1 + int(rng.poisson(params.size_mean_excess))
        births.extend([t] * size)
        deaths.extend(t + rng.exponential(1.0 / params.core_death_rate, size))
    birth = np.asarray(births)
    death = np.asarray(deaths)
    dead_from = kill_at
    if die_at_zero:
        dead_from = min(kill_at, _first_empty(birth, death))
    for k, tau in enumerate(times):
        if tau >= dead_from:
            continue
        out[k] = float(np.count_nonzero((birth <= tau) & (death > tau)))
    return out


def _first_empty(birth: NDArray[np.float64], death: NDArray[np.float64]) -> float:
    """The first time the alive-core count drops to zero (inf if it never does)."""
    if birth.size == 0:
        return 0.0
    times = np.concatenate([birth, death])
    steps = np.concatenate([np.ones_like(birth), -np.ones_like(death)])
    # At equal times births count first, so a core born as the last one dies keeps it alive.
    order = np.lexsort((-steps, times))
    alive = np.cumsum(steps[order])
    empty = np.flatnonzero(alive <= 0)
    return float(times[order][empty[0]]) if empty.size else math.inf
