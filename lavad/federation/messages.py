"""What flows between global schedulers and pool owners.

Verdicts say "refused, may retry" (a stale view: the summary that comes with it is
the owner's current state) apart from "refused, final" (the request itself is wrong:
an unknown pool, a host that lacks the task's labels, a task already running).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class Task:
    task_id: int
    job: int
    tenant: int
    demand: tuple[int, ...]
    constraints: int  # bitmask: the labels a host must all have
    duration: float
    arrival: float


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Place ``task`` on ``host`` of ``pool``; ``repartition`` when the host is not ``gm``'s."""

    gm: int
    seq: int  # per scheduler, increasing: lets a summary say which launches it reflects
    pool: int
    host: int
    task: Task
    repartition: bool
    # which launch of the task this is (1, 2, ... after stale refusals): the live
    # federation names a launch (task, attempt) so that an owner drops a duplicate;
    # the event-time replay never restarts a scheduler and leaves it 0
    attempt: int = 0
    # the live federation's: the request's offset in its tenant queue, so that every
    # scheduler can forget it once the queue's commit has passed it (request_ledger.py);
    # the replay has no queue topic and leaves it -1
    request_offset: int = -1


@dataclass(frozen=True, slots=True)
class PreemptRequest:
    """End ``victims`` (running on ``host``) and launch ``task`` there in their place."""

    gm: int
    seq: int
    pool: int
    host: int
    victims: tuple[int, ...]
    task: Task
    attempt: int = 0  # as LaunchRequest.attempt: a preemption is a launch with victims
    request_offset: int = -1  # as LaunchRequest.request_offset


@dataclass(frozen=True, slots=True)
class TaskEnd:
    """``task_id`` finished on ``pool`` (reported to its owner: the live federation)."""

    pool: int
    task_id: int


@dataclass(frozen=True, slots=True)
class RunningTask:
    task_id: int
    tenant: int
    gm: int
    host: int
    demand: tuple[int, ...]
    start: float


@dataclass(frozen=True, slots=True)
class PoolSummary:
    """An owner's state of one pool as of ``sent_at``: all a global scheduler's view needs.

    ``free`` per host and resource; ``seen_seq[g]``: the last launch of scheduler ``g``
    the owner had processed (so ``g`` re-applies its later, in-flight launches);
    ``tenant_usage[t]``: resources tenant ``t`` holds in the pool; ``running``: the
    tasks running (carried only when fair shares need them to pick victims).
    """

    pool: int
    owner: str
    version: int
    sent_at: float
    free: npt.NDArray[np.int64]
    seen_seq: tuple[int, ...]
    tenant_usage: npt.NDArray[np.int64]
    queue_length: int
    running: tuple[RunningTask, ...] | None = None

    def free_by_label(self, labels: npt.NDArray[np.uint64], bits: int) -> npt.NDArray[np.int64]:
        """Free capacity per placement-constraint class: row ``i`` sums hosts with label ``i``."""
        rows = [self.free[(labels & np.uint64(1 << i)) != 0].sum(axis=0) for i in range(bits)]
        return np.asarray(rows, dtype=np.int64).reshape(bits, self.free.shape[1])


@dataclass(frozen=True, slots=True)
class Accepted:
    pool: int
    host: int
    task_id: int
    seq: int
    repartition: bool
    preempted: tuple[RunningTask, ...]
    summary: PoolSummary


@dataclass(frozen=True, slots=True)
class Refused:
    """``final``: the request is wrong and retrying it cannot help; else the view was stale."""

    pool: int
    task_id: int
    seq: int
    reason: str
    final: bool
    summary: PoolSummary | None


Verdict = Accepted | Refused


@dataclass(frozen=True, slots=True)
class Ended:
    task: RunningTask
    summary: PoolSummary
