"""Which owner holds which pool: requests are routed by it, and a request for a pool no
owner holds is refused (final) with the reason instead of being lost."""

from __future__ import annotations

from lavad.federation.messages import LaunchRequest, PreemptRequest, Refused, Verdict
from lavad.federation.owner import PoolOwner


class OwnerDirectory:
    def __init__(self, owners: list[PoolOwner]) -> None:
        self.owners: dict[int, PoolOwner] = {}
        for owner in owners:
            if owner.pool.index in self.owners:
                raise ValueError(f"pool {owner.pool.index} has two owners")
            self.owners[owner.pool.index] = owner

    def owner_of(self, pool: int) -> PoolOwner | None:
        return self.owners.get(pool)

    def deliver(self, request: LaunchRequest | PreemptRequest, now: float) -> Verdict:
        owner = self.owners.get(request.pool)
        if owner is None:
            known = ", ".join(str(p) for p in sorted(self.owners))
            return Refused(
                pool=request.pool,
                task_id=request.task.task_id,
                seq=request.seq,
                reason=f"unknown pool {request.pool}: no owner holds it (pools: {known})",
                final=True,
                summary=None,
            )
        if isinstance(request, PreemptRequest):
            return owner.preempt(request, now)
        return owner.launch(request, now)
