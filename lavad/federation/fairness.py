"""Megha's Algorithm 2: fair shares, enforced only under contention.

A tenant's use is its dominant share: the largest, over resources, of what it holds
divided by the federation's capacity. When a task finds no host (internally, nor by
repartitioning), its tenant may preempt only if, with the task, it would still be
within its configured share; the victims are taken from the tenant with the largest
share violation (use minus share, > 0), then the next. A tenant that would pass its
share is requeued instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lavad.federation.messages import RunningTask

EPSILON = 1e-12


@dataclass(frozen=True, slots=True)
class Shares:
    shares: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.shares:
            raise ValueError("shares: want one share per tenant, got none")
        if any(not 0.0 < s <= 1.0 for s in self.shares):
            raise ValueError(f"shares: each must be in (0, 1], got {list(self.shares)}")
        if sum(self.shares) > 1.0 + 1e-9:
            raise ValueError(f"shares: they sum to {sum(self.shares):.4f} > 1")


def dominant_shares(
    usage: npt.NDArray[np.int64], total: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Per tenant: max over resources of used / capacity."""
    shares: npt.NDArray[np.float64] = (usage / np.maximum(total, 1)).max(axis=1)
    return shares


def may_preempt(
    requester: int,
    usage: npt.NDArray[np.int64],
    total: npt.NDArray[np.int64],
    demand: npt.NDArray[np.int64],
    shares: Shares,
) -> bool:
    """Algorithm 2's test: would the requester, with this task, stay within its share?"""
    after = usage[requester] + demand
    return float((after / np.maximum(total, 1)).max()) <= shares.shares[requester] + EPSILON


def violators(
    requester: int,
    usage: npt.NDArray[np.int64],
    total: npt.NDArray[np.int64],
    shares: Shares,
    demand: npt.NDArray[np.int64] | None = None,
) -> list[int]:
    """Tenants over their share, largest violation first (ties: lower index), requester out.

    With ``demand``, only tenants over by at least the demand's share: losing a task of
    that size leaves them at or above their share, so a preemption never pushes a
    tenant under its share, and two tenants cannot take the same slot back and forth.
    """
    used = dominant_shares(usage, total)
    floor = EPSILON
    if demand is not None:
        floor = float((demand / np.maximum(total, 1)).max()) - EPSILON
    violation = [
        (float(used[t]) - shares.shares[t], t)
        for t in range(len(shares.shares))
        if t != requester and used[t] - shares.shares[t] >= max(floor, EPSILON)
    ]
    # equal violations (to 1e-9: 7/20 - 0.25 and 5/20 - 0.15 differ in floats) go by index
    violation.sort(key=lambda vt: (-round(vt[0], 9), vt[1]))
    return [t for _, t in violation]


def victims_on_host(
    tasks: Sequence[RunningTask],
    tenant: int,
    free: npt.NDArray[np.int64],
    demand: npt.NDArray[np.int64],
) -> tuple[int, ...]:
    """The fewest of ``tenant``'s tasks on one host, newest first (least work lost), whose
    ending frees room for ``demand``; empty when even all of them would not."""
    mine = sorted((t for t in tasks if t.tenant == tenant), key=lambda t: (-t.start, t.task_id))
    room = free.copy()
    chosen: list[int] = []
    for task in mine:
        if bool(np.all(room >= demand)):
            break
        room += np.asarray(task.demand, dtype=np.int64)
        chosen.append(task.task_id)
    if chosen and bool(np.all(room >= demand)):
        return tuple(chosen)
    return ()
