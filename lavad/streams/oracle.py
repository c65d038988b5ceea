"""True lifetimes for the oracle policies: a first pass over a trace, attached in the second.

An oracle policy (``las-oracle``, ``lava-oracle``, ...) is an upper bound:
it is told each VM's true lifetime at its request, in
``features["oracle_lifetime_s"]``. A VM still running when the recording
ends is given the time to the end (all the replay can know of it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Final

from lavad.streams.codec import BadRecord
from lavad.streams.schema import Event, VmExit, VmRequest

# The request feature that carries a VM's true lifetime (replays only). Learned
# models never read it (models/lifetime/features.py refuses it as a feature).
ORACLE_FEATURE: Final = "oracle_lifetime_s"


def exit_times(events: Iterable[Event | BadRecord]) -> dict[tuple[str, str], float]:
    """(pool, VM id) -> the time of its first exit after its first request."""
    exits: dict[tuple[str, str], float] = {}
    for event in events:
        if isinstance(event, VmExit):
            exits.setdefault((event.pool, event.vm_id), event.time)
    return exits


def with_true_lifetimes(
    events: Iterable[Event | BadRecord],
    exits: dict[tuple[str, str], float],
    end_time: float,
) -> Iterator[Event | BadRecord]:
    """The same events, each request carrying its VM's true lifetime."""
    for event in events:
        if isinstance(event, VmRequest):
            ends = exits.get((event.pool, event.vm_id), end_time)
            lifetime = max(ends - event.time, 0.0)
            yield dataclasses.replace(event, features={**event.features, ORACLE_FEATURE: lifetime})
        else:
            yield event
