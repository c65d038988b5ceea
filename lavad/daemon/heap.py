"""When the garbage collector runs in a long-lived daemon: the state is old, the garbage young.

A pool's state (hosts, VMs, lifetime tables) is tens of thousands of objects
that live for hours, while each fetched batch allocates as many that die
within it (records, events, decisions, futures). CPython's default schedule
scans the old objects again and again as the young ones churn: measured on
the live ingest benchmark, about a tenth of the daemon's CPU went to full
collections of state that could not be garbage.

So the state is moved out of the collector's view (``gc.freeze``) once it is
settled: after partitions are restored and after each snapshot. Reference
counting still frees everything acyclic at once; only cyclic garbage among
frozen objects waits, until the next snapshot's settle collects the whole
heap once (``unfreeze``, ``collect``, ``freeze``). A restore's settle scans
only the state it brought (``settle_new``). That turns collections whose
frequency grows with the heap into one full pass per snapshot interval, at a
time the daemon chose. The young generation's threshold is raised too, so a
batch of short-lived objects is not scanned a dozen times while it lives.
"""

from __future__ import annotations

import gc
from typing import Final

# CPython's default is 700 allocations; a batch of 2,000 records allocates
# ~10 objects each. At 20,000 a young collection runs about once a batch.
YOUNG_THRESHOLD: Final = 20_000


def tune_collector() -> None:
    """Raise the young generation's threshold (the older two keep CPython's defaults)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def settle() -> None:
    """One full collection, then freeze what survived: it is the daemon's long-lived state."""
    gc.unfreeze()
    settle_new()


def settle_new() -> None:
    """Collect and freeze only what is new since the last freeze (a restored state).

    The frozen objects (the modules, compiled code, earlier state) are not
    scanned again, so after a restore, while records flow, this takes about
    a third of ``settle``'s time (docs/results/speed.md). Cyclic garbage
    among the frozen objects, such as a pool given up in the same
    rebalance, waits for the next ``settle``, at the next snapshot.
    """
    gc.collect()
    gc.freeze()
