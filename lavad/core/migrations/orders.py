"""Which queued VM migrates next, when a migration slot frees up.

The queue holds the VMs of every draining host of a pool (the paper orders
"across all in-migration hosts"). Each order looks at the whole queue at the
moment a slot frees, so repredictions made while a VM waited count:

* ``lars``: the longest predicted remaining lifetime first. Short-lived VMs
  wait, and many exit before their turn, so they are never migrated.
* ``shortest``: the shortest first (LARS's opposite; a lower bound).
* ``arrival``: the order VMs joined the queue (their host's drain, then the
  VM's placement time): the paper's baseline, "defined by the trace".
* ``random``: a seeded uniform draw.

Ties (equal predictions) go to queue order, so every order is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from lavad.core.migrations.config import OrderName
from lavad.core.placement.framework import UniformDraws
from lavad.core.registry import Entry, Registry


@dataclass(slots=True)
class Queued:
    """A VM waiting for its migration; ``sequence`` is its place in arrival order."""

    vm_id: str
    host: int
    sequence: int


Remaining = Callable[[str], float]


class MigrationOrder(Protocol):
    name: OrderName

    def rank(self, queue: Sequence[Queued], remaining: Remaining) -> list[Queued]:
        """The queue in the order the VMs should go (the first that fits goes)."""


class LongestRemainingFirst:
    name: OrderName = "lars"

    def rank(self, queue: Sequence[Queued], remaining: Remaining) -> list[Queued]:
        return sorted(queue, key=lambda q: (-remaining(q.vm_id), q.sequence))


class ShortestRemainingFirst:
    name: OrderName = "shortest"

    def rank(self, queue: Sequence[Queued], remaining: Remaining) -> list[Queued]:
        return sorted(queue, key=lambda q: (remaining(q.vm_id), q.sequence))


class ArrivalOrder:
    name: OrderName = "arrival"

    def rank(self, queue: Sequence[Queued], remaining: Remaining) -> list[Queued]:
        return sorted(queue, key=lambda q: q.sequence)


class RandomOrder:
    """A seeded shuffle of the queue at each slot (the draw order is the seed's)."""

    name: OrderName = "random"

    def __init__(self, draws: UniformDraws) -> None:
        self._draws = draws

    def rank(self, queue: Sequence[Queued], remaining: Remaining) -> list[Queued]:
        rest = sorted(queue, key=lambda q: q.sequence)
        ranked: list[Queued] = []
        while rest:
            ranked.append(rest.pop(self._draws.index(len(rest))))
        return ranked


ORDERS: Registry[MigrationOrder] = Registry(
    "migration order",
    [
        Entry(
            "lars",
            "longest predicted remaining lifetime first (LAVA paper, 4.4)",
            lambda _args, _draws: LongestRemainingFirst(),
        ),
        Entry("arrival", "in the order the VMs were queued", lambda _args, _draws: ArrivalOrder()),
        Entry(
            "shortest",
            "shortest predicted remaining lifetime first",
            lambda _args, _draws: ShortestRemainingFirst(),
        ),
        Entry("random", "a seeded random order", lambda _args, draws: RandomOrder(draws)),
    ],
)


def build_order(name: OrderName, draws: UniformDraws) -> MigrationOrder:
    return ORDERS.build(name, None, draws)
