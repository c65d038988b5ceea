"""Relief of a GPA host that broke its overflow promise: which VMs move, and where.

``relief_rule.py`` says when (its realised overflows reject rho). Then the
source's VMs are read with their *current* moments (mean, variance, third
and fourth cumulants) through the pool's current percentile method and
margin: a host's load is mu + margin x factor(method) x sigma, GPA's fit
test as the placement uses it. VMs leave one at a time, each time the one
whose departure lowers the host's load most (the largest excess first),
until the host passes the fit test. The first always leaves: the realised
overflows have already shown the moments to be wrong. Each goes to the open
host where the fit test with it added passes and whose standardised
headroom is then smallest (GPA Best Fit), or to a new empty host when none
accepts it; a VM alone on the source stays (it would overflow anywhere
alone). Live, where no host can be opened, a VM no host's test accepts goes
to the lowest open empty host whose capacity holds its request, as a
placement does (``GpaFilter``): a wide margin must not keep a VM that rose on
the host it overloads. Work per relief: at most ``max_moves`` VMs, each
against every host once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lavad.core.cluster import FIT_TOLERANCE, BoolArray, ClusterState, FloatArray
from lavad.core.migrations.relief_rule import (
    MIN_OVERFLOWS,
    OverflowEvidence,
    ReliefConfig,
    overflows_needed,
    promise_rejected,
    relief_drift,
)
from lavad.core.placement.gpa import (
    CLUSTER_ROW,
    UsageHooks,
    gpa_fits,
    quantile_factor,
    standardized_headroom,
)
from lavad.models.argument_checks import require_at_least
from lavad.models.usage.hosts import FOURTH, MEAN, THIRD, VARIANCE
from lavad.models.usage.moments import CPU
from lavad.models.usage.tail import NORMAL, PERCENTILE_METHODS, effective_variance

__all__ = [
    "MIN_OVERFLOWS",
    "OverflowEvidence",
    "ReliefConfig",
    "ReliefMove",
    "TailFit",
    "drift_broken_hosts",
    "enable_host_drift",
    "new_host_indices",
    "overflows_needed",
    "plan_host_relief",
    "plan_relief",
    "promise_rejected",
    "relief_drift",
]

# Rows of a terms array: the additive cumulant sums of a host or a VM.
MEAN_ROW, VARIANCE_ROW, THIRD_ROW, FOURTH_ROW = 0, 1, 2, 3
TERMS = 4


@dataclass(frozen=True, slots=True)
class TailFit:
    """GPA's fit test through the pool's current percentile method and margin."""

    rho: float
    method: str
    margin: float
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        quantile_factor(self.rho)
        if self.method not in PERCENTILE_METHODS:
            raise ValueError(f"unknown tail method {self.method!r}")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"margin must be > 0, got {self.margin}")

    def _variance(self, terms: FloatArray) -> FloatArray:
        return effective_variance(
            self.method,
            quantile_factor(self.rho),
            self.rho,
            self.margin,
            terms[VARIANCE_ROW],
            terms[THIRD_ROW],
            terms[FOURTH_ROW],
        )

    def load(self, terms: FloatArray) -> FloatArray:
        """mu + margin x factor x sigma, per column of ``terms`` (rows: the cumulant sums)."""
        z = quantile_factor(self.rho)
        loaded: FloatArray = terms[MEAN_ROW] + z * np.sqrt(self._variance(terms))
        return loaded

    def fits(self, terms: FloatArray, capacity: FloatArray | float) -> BoolArray:
        return gpa_fits(
            terms[MEAN_ROW],
            self._variance(terms),
            capacity,
            quantile_factor(self.rho),
            self.tolerance,
        )

    def headroom(self, terms: FloatArray, capacity: FloatArray | float) -> FloatArray:
        return standardized_headroom(terms[MEAN_ROW], self._variance(terms), capacity)


@dataclass(frozen=True, slots=True)
class ReliefMove:
    """``vm``: index into the source's VMs; ``target``: a host index, or None for a new host."""

    vm: int
    target: int | None


def plan_relief(
    vm_terms: FloatArray,
    source_capacity: float,
    host_terms: FloatArray,
    host_capacity: FloatArray,
    fit: TailFit,
    max_moves: int,
    *,
    source: int | None = None,
    open_hosts: BoolArray | None = None,
    alone: BoolArray | None = None,
) -> list[ReliefMove]:
    """Which of the source's VMs move, and where (see the module's docstring).

    ``vm_terms``: (4, k) current cumulant terms of the source's k VMs, in a
    fixed order (ties go to the lower index). ``host_terms`` (4, h) and
    ``host_capacity`` (h,): every host's current sums; ``source`` is not a
    target, nor is a host with ``open_hosts`` False. A move to a new host
    (``target`` None) opens one host of the source's capacity, which later
    VMs of the same relief may join (its index is then ``h``, ``h + 1``...).
    ``alone`` (k, h): whether host j is empty and holds VM i's request; a VM
    no host's test accepts goes to the first open such host still empty
    (None: none, the offline packer's case, which opens a host instead).
    """
    if vm_terms.ndim != 2 or vm_terms.shape[0] != TERMS:
        raise ValueError(f"vm_terms must be (4, VMs), got {vm_terms.shape}")
    if host_terms.shape[0] != TERMS or host_terms.shape[1] != len(host_capacity):
        raise ValueError("host_terms must be (4, hosts) with one capacity per host")
    if alone is not None and alone.shape != (vm_terms.shape[1], len(host_capacity)):
        raise ValueError(f"alone must be (VMs, hosts), got {alone.shape}")
    # Hosts still empty and holding each VM's request: a host one mover lands on is empty no more.
    lone = (
        np.zeros((vm_terms.shape[1], len(host_capacity)), dtype=np.bool_)
        if alone is None
        else np.array(alone, dtype=np.bool_, copy=True)
    )
    require_at_least(1, max_moves=max_moves)
    staying = list(range(vm_terms.shape[1]))
    hosts = np.array(host_terms, dtype=np.float64, copy=True)
    capacity = np.asarray(host_capacity, dtype=np.float64).copy()
    allowed = (
        np.ones(len(capacity), dtype=np.bool_)
        if open_hosts is None
        else np.asarray(open_hosts, dtype=np.bool_).copy()
    )
    if source is not None and source < len(allowed):
        allowed[source] = False
    moves: list[ReliefMove] = []
    while len(staying) > 1 and len(moves) < max_moves:
        left = vm_terms[:, staying].sum(axis=1, keepdims=True)
        if moves and bool(fit.fits(left, source_capacity)[0]):
            break
        # The load left behind by each candidate's departure; the lowest goes.
        without = left - vm_terms[:, staying]
        leaving = staying[int(np.argmin(fit.load(without)))]
        staying.remove(leaving)
        terms = vm_terms[:, leaving : leaving + 1]
        after = hosts + terms
        fits = fit.fits(after, capacity) & allowed
        lone_here = lone[leaving] & allowed
        target: int | None = None
        if fits.any():
            rank = np.where(fits, fit.headroom(after, capacity), np.inf)
            target = int(np.argmin(rank))
        elif lone_here.any():
            target = int(np.argmax(lone_here))
        if target is not None:
            hosts[:, target] += terms[:, 0]
            lone[:, target] = False
        else:
            # A new empty host of the source's kind; later movers may share it.
            hosts = np.hstack([hosts, terms])
            capacity = np.append(capacity, source_capacity)
            allowed = np.append(allowed, True)
            lone = np.hstack([lone, np.zeros((len(lone), 1), dtype=np.bool_)])
        moves.append(ReliefMove(leaving, target))
    return moves


def new_host_indices(moves: Sequence[ReliefMove], hosts: int) -> list[int]:
    """The host each move lands on, new hosts numbered ``hosts``, ``hosts + 1``... in order."""
    landed: list[int] = []
    for move in moves:
        if move.target is None:
            landed.append(hosts)
            hosts += 1
        else:
            landed.append(move.target)
    return landed


def enable_host_drift(hooks: UsageHooks, config: ReliefConfig) -> None:
    """Start the pool's per-VM drift detection (``[migrations.relief.drift]``; off: nothing)."""
    hooks.usage.moments.enable_drift(relief_drift(config))


def _live_fit(hooks: UsageHooks, rho: float) -> TailFit:
    tail = hooks.tail
    return (
        TailFit(rho, tail.method, tail.margin, FIT_TOLERANCE)
        if tail is not None
        else TailFit(rho, NORMAL, 1.0, FIT_TOLERANCE)
    )


def drift_broken_hosts(hooks: UsageHooks, cluster: ClusterState) -> list[int]:
    """Hosts whose VM changed regime since the last look and that now fail GPA's fit test.

    The VMs the detector reset (their moments now read the new regime) name
    their hosts; each such host with two VMs or more is read again through
    the pool's current method and margin, as the relief reads it, and
    returned (ascending) when its promise no longer holds: it is relieved
    without waiting for its overflows to reject rho. Work: the reset VMs'
    hosts only.
    """
    rho = hooks.rho
    usage = hooks.usage
    drifted = usage.moments.take_drifted()
    if rho is None or not drifted:
        return []
    hosts = {host for vm_id in drifted if (host := usage.host_of(vm_id)) is not None}
    if not hosts:
        return []
    n = cluster.n_hosts
    usage.ensure_columns(n)
    fit = _live_fit(hooks, rho)
    variance = usage.variance(CPU, n)
    broken: list[int] = []
    for host in sorted(hosts):
        if host >= n or len(cluster.host_vms[host]) < 2:
            continue
        terms = np.array(
            [
                [usage.mean_sum[CPU, host]],
                [variance[host]],
                [usage.third_sum[CPU, host]],
                [usage.fourth_sum[CPU, host]],
            ]
        )
        capacity = float(cluster.capacity[CLUSTER_ROW[CPU], host])
        if not bool(fit.fits(terms, capacity)[0]):
            broken.append(host)
    return broken


def plan_host_relief(
    hooks: UsageHooks, cluster: ClusterState, host: int, max_moves: int
) -> list[tuple[str, int | None]]:
    """The live relief of ``host``: (VM id, target host column, or None).

    Live, an empty host is one of the hosts (zero sums), so None means that
    no host now open for placement passes the fit test with the VM and no
    open empty host holds its request: it cannot move until one does (a host
    comes up or frees room).

    The VMs' current CPU estimates (``HostUsage.contribution``, the variance
    with the pool's variance factor) and every host's current sums, read
    through the pool's current method and margin (plain GPA without a
    learned tail); targets are the hosts open for placement. Ties go to the
    VM id order and the lower column, so a replay and the live daemon agree.
    """
    rho = hooks.rho
    if rho is None:
        raise ValueError("relief needs the policy's rho")
    usage = hooks.usage
    n = cluster.n_hosts
    usage.ensure_columns(n)
    residents = sorted(cluster.host_vms[host])
    factor = float(usage.variance_factor[CPU])
    vm_terms = np.zeros((TERMS, len(residents)))
    requested = np.zeros(len(residents))
    for index, vm_id in enumerate(residents):
        record = cluster.vms[vm_id]
        requested[index] = record.demand[0]
        added = usage.contribution(vm_id, (record.demand[0], record.demand[1]))
        vm_terms[:, index] = (
            added[MEAN + CPU],
            added[VARIANCE + CPU] * factor,
            added[THIRD + CPU],
            added[FOURTH + CPU],
        )
    host_terms = np.vstack(
        [
            usage.mean_sum[CPU, :n],
            usage.variance(CPU, n),
            usage.third_sum[CPU, :n],
            usage.fourth_sum[CPU, :n],
        ]
    )
    fit = _live_fit(hooks, rho)
    capacity = cluster.capacity[CLUSTER_ROW[CPU], :n]
    empty = cluster.vm_count[:n] == 0
    alone = empty[np.newaxis, :] & (
        capacity[np.newaxis, :] >= requested[:, np.newaxis] - FIT_TOLERANCE
    )
    moves = plan_relief(
        vm_terms,
        float(capacity[host]),
        host_terms,
        capacity,
        fit,
        max_moves,
        source=host,
        open_hosts=cluster.schedulable[:n],
        alone=alone,
    )
    return [
        (residents[move.vm], move.target if move.target is None or move.target < n else None)
        for move in moves
    ]
