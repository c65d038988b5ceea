"""An existing scheduler's event stream, made from a trace: its placements as ``vm.placed``.

Shadow mode follows an existing scheduler. To measure lavad beside one on a
recorded trace, this plays the trace through a plain engine running a
baseline policy (First Fit, say) and writes what that scheduler's stream
would carry:

* each request it placed as a ``vm.placed`` on the host it chose (the
  request's shape, tenant, deployment, flavor and features kept);
* each request it could not place as the ``vm.request`` itself (the actual
  side of a shadow run counts it as a placement failure);
* a ``host.up`` just before the first placement on a host the pool opened on
  demand (its shape from ``[hosts]``), so the actual cluster knows it;
* every other event (exits, hosts, usage, deployments) as it was.

The baseline scheduler migrates nothing (``[migrations]`` is not applied:
a stream has no event for a move), and a request's ``max_per_host`` is not
carried (``vm.placed`` has no such field). Events the engine refuses are
passed through, so a shadow replay refuses them too.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from lavad.core.engine import Engine, EngineConfig
from lavad.core.migrations.config import MigrationsConfig
from lavad.streams.codec import BadRecord
from lavad.streams.schema import Event, HostUp, Placement, VmPlaced, VmRequest


@dataclasses.dataclass(slots=True)
class PlacedCounts:
    """What ``placed_events`` wrote, by kind; bad records of the trace are skipped and counted."""

    written: Counter[str] = dataclasses.field(default_factory=Counter)
    bad_records: int = 0


def placed_events(
    events: Iterable[Event | BadRecord], config: EngineConfig, counts: PlacedCounts | None = None
) -> Iterator[Event]:
    """The stream an existing scheduler running ``config.policy`` would publish for ``events``."""
    counts = counts if counts is not None else PlacedCounts()
    engine = Engine(dataclasses.replace(config, migrations=MigrationsConfig()))
    shape = config.pools.shape
    known: set[str] = set()
    clock = float("-inf")
    for item in events:
        if isinstance(item, BadRecord):
            counts.bad_records += 1
            continue
        now = item.time
        if now > clock:
            clock = now
            engine.advance(now)  # a learning baseline's timers: nothing to publish
        handled = engine.handle(item, now)
        if isinstance(item, HostUp):
            known.add(item.host_id)
        placed = (
            _placement_of(item.vm_id, handled.decisions)
            if isinstance(item, VmRequest) and handled.rejection is None
            else None
        )
        if placed is None or placed.host_id is None:
            counts.written[item.type] += 1
            yield item
            continue
        assert isinstance(item, VmRequest)
        host_id = placed.host_id
        if host_id not in known:
            known.add(host_id)
            # Hosts present from the start need no host.up: both sides have them.
            if host_id.startswith(f"{item.pool}/auto") and shape is not None:
                counts.written["host.up"] += 1
                yield HostUp(
                    time=now,
                    pool=item.pool,
                    host_id=host_id,
                    cores=shape.cores,
                    memory_gib=shape.memory_gib,
                    disk_gib=shape.disk_gib,
                    gpus=shape.gpus,
                )
        counts.written["vm.placed"] += 1
        yield VmPlaced(
            time=item.time,
            pool=item.pool,
            vm_id=item.vm_id,
            host_id=host_id,
            cores=item.cores,
            memory_gib=item.memory_gib,
            disk_gib=item.disk_gib,
            gpus=item.gpus,
            tenant=item.tenant,
            deployment=item.deployment,
            flavor=item.flavor,
            features=item.features,
        )


def _placement_of(vm_id: str, decisions: Sequence[object]) -> Placement | None:
    for decision in decisions:
        if isinstance(decision, Placement) and decision.vm_id == vm_id:
            return decision
    return None
