"""Pools of hosts, each cut into one partition per global scheduler (Megha's eq. 3).

A host has a capacity per resource and a label bitmask (the placement constraints it
satisfies: bit ``i`` set means it meets constraint ``i``). Its *home* partition is the
global scheduler whose internal partition it belongs to; a repartition lends part of a
host to another scheduler for one task, at resource granularity, and the loan ends with
the task (section IV-B4), so the home map itself never changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
IndexArray = npt.NDArray[np.intp]


@dataclass(frozen=True)
class Pool:
    index: int
    name: str
    capacity: IntArray  # (hosts, resources)
    labels: npt.NDArray[np.uint64]  # (hosts,)
    home: npt.NDArray[np.int32]  # (hosts,): the global scheduler whose partition holds it
    _internal: tuple[IndexArray, ...] = field(repr=False, default=())
    _external: tuple[IndexArray, ...] = field(repr=False, default=())

    @property
    def hosts(self) -> int:
        return int(self.capacity.shape[0])

    def internal(self, gm: int) -> IndexArray:
        """The hosts of ``gm``'s internal partition, in scan order."""
        return self._internal[gm]

    def external(self, gm: int) -> IndexArray:
        """The hosts of the other schedulers' partitions, in scan order."""
        return self._external[gm]


@dataclass(frozen=True)
class Topology:
    pools: tuple[Pool, ...]
    schedulers: int
    resources: tuple[str, ...]

    @property
    def hosts(self) -> int:
        return sum(pool.hosts for pool in self.pools)

    def total_capacity(self) -> IntArray:
        total: IntArray = np.sum([pool.capacity.sum(axis=0) for pool in self.pools], axis=0)
        return total


def make_pool(
    index: int,
    capacity: IntArray,
    labels: npt.NDArray[np.uint64],
    schedulers: int,
    name: str | None = None,
) -> Pool:
    """A pool whose hosts are cut into ``schedulers`` contiguous partitions, near-equal in size."""
    hosts = capacity.shape[0]
    if schedulers < 1:
        raise ValueError(f"schedulers must be >= 1, got {schedulers}")
    if hosts < schedulers:
        raise ValueError(
            f"pool {index}: {hosts} hosts cannot give {schedulers} partitions one each"
        )
    if labels.shape != (hosts,):
        raise ValueError(f"pool {index}: labels shape {labels.shape} != ({hosts},)")
    home = np.asarray((np.arange(hosts) * schedulers) // hosts, dtype=np.int32)
    internal = tuple(np.flatnonzero(home == g) for g in range(schedulers))
    external = tuple(np.flatnonzero(home != g) for g in range(schedulers))
    capacity = np.ascontiguousarray(capacity, dtype=np.int64)
    capacity.setflags(write=False)
    return Pool(
        index=index,
        name=name if name is not None else f"pool-{index}",
        capacity=capacity,
        labels=labels,
        home=home,
        _internal=internal,
        _external=external,
    )


def uniform_topology(
    pools: int,
    hosts_per_pool: int,
    schedulers: int,
    host_capacity: tuple[int, ...] = (1,),
    resources: tuple[str, ...] = ("cpu",),
    label_bits: int = 0,
    label_probability: float = 0.5,
    seed: int = 0,
) -> Topology:
    """``pools`` pools of ``hosts_per_pool`` equal hosts; labels drawn per host, seeded.

    With ``label_bits`` 0 every host has no labels and every task fits anywhere (the
    Megha trace carries no constraints); otherwise each host meets each of the
    ``label_bits`` constraints with ``label_probability``, drawn per pool from
    ``default_rng((seed, pool))``.
    """
    if len(host_capacity) != len(resources):
        raise ValueError(f"host_capacity {host_capacity} does not match resources {resources}")
    if not 0 <= label_bits <= 63:
        raise ValueError(f"label_bits must be in 0..63, got {label_bits}")
    built = []
    for p in range(pools):
        capacity = np.tile(np.asarray(host_capacity, dtype=np.int64), (hosts_per_pool, 1))
        labels = np.zeros(hosts_per_pool, dtype=np.uint64)
        if label_bits:
            rng = np.random.default_rng((seed, p))
            bits = rng.random((hosts_per_pool, label_bits)) < label_probability
            weights = np.left_shift(np.uint64(1), np.arange(label_bits, dtype=np.uint64))
            labels = (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
        built.append(make_pool(p, capacity, labels, schedulers))
    return Topology(pools=tuple(built), schedulers=schedulers, resources=resources)
