"""A seeded share of a trace's VMs: a spread over seeds for a trace that has none.

OpenB records exact times, so the placement matrix's seeds only draw ties
there and every seed replays the same decisions: a cell is one draw, and
one changed decision early on moves its figure by tenths of a point. Keeping
a seeded share of the VMs (all their events, or none) makes each seed a
different, equally real workload of the same trace, so a policy's figure
gets a spread, as resampling a sample does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import TypeVar

Item = TypeVar("Item")

_SCALE = float(1 << 64)


def kept(seed: int, vm_id: str, share: float) -> bool:
    """Whether VM ``vm_id`` is in seed ``seed``'s sample of ``share`` of the VMs.

    A hash of the seed and the id, not a draw in event order: a VM's request
    and exit agree, and the sample does not depend on what else the trace
    holds. The seed is written as digits and a NUL ends it, so no two
    (seed, id) pairs hash the same bytes; ``surrogatepass`` encodes any
    string, lone surrogates included, one to one.
    """
    key = f"{seed}\0{vm_id}".encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE < share


def sample_vms(items: Iterable[Item], seed: int, share: float) -> Iterator[Item]:
    """``items`` without the events of VMs outside the sample; other items pass through."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"the share of VMs kept must be in (0, 1], got {share}")
    if share == 1.0:
        yield from items
        return
    for item in items:
        vm_id = getattr(item, "vm_id", None)
        if not isinstance(vm_id, str) or kept(seed, vm_id, share):
            yield item
