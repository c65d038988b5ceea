"""What a global scheduler knows of each request's launches, so that a scheduler that
restarts, or that takes over another's tenant queues, neither loses a request nor
launches it twice.

A launch is named by its request and attempt, ``(task, attempt)``: attempt 1 is the
first launch, and a launch refused on a stale view is followed by the next attempt.
Every scheduler reads the verdicts topic from its beginning, so the ledger knows
which requests are final (accepted, or refused for good) and the highest attempt
answered; launches sent but not yet answered are known from the launches topic,
read at a takeover from the owners' committed offsets on (everything before them
has its verdict published). A request that is not final and has no launch waiting
for its verdict is decided again, with the next attempt; one that has a launch
waiting is not sent again, so at most one launch per request is ever outstanding
and at most one is accepted at a time (a task a preemption ended is decided again,
by whoever holds its tenant's queue: the preemption's verdict says so).

``CommitWatermark`` is the other half: a request's offset is committed only once it
is final, so a scheduler killed at any point leaves its undecided requests to be read
again by whoever takes the queue over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lavad.federation.messages import Task

LaunchId = tuple[int, int]  # (task, attempt)


@dataclass(frozen=True, slots=True)
class Outstanding:
    """A launch sent and not yet answered."""

    attempt: int
    gm: int
    seq: int
    pool: int


class RequestLedger:
    def __init__(self) -> None:
        self._attempts: dict[int, int] = {}  # task -> highest attempt launched or answered
        self._final: dict[int, bool] = {}  # task -> True accepted, False refused for good
        self._outstanding: dict[int, Outstanding] = {}  # task -> its unanswered launch
        self._answered: set[LaunchId] = set()
        self.max_seq: dict[int, int] = {}  # scheduler -> the highest launch seq it sent
        self._preempted: dict[int, Task] = {}  # tasks ended by a preemption, not placed again

    def launched(self, task: int, attempt: int, gm: int, seq: int, pool: int) -> None:
        """A launch sent (by this scheduler, or read from the launches topic)."""
        self._seq(gm, seq)
        self._attempts[task] = max(self._attempts.get(task, 0), attempt)
        if (task, attempt) in self._answered:
            return
        current = self._outstanding.get(task)
        if current is None or current.attempt < attempt:
            self._outstanding[task] = Outstanding(attempt, gm, seq, pool)

    def answered(
        self, task: int, attempt: int, gm: int, seq: int, accepted: bool, final: bool
    ) -> None:
        """A verdict read (a duplicate, from an owner that replayed a launch, changes nothing)."""
        self._seq(gm, seq)
        self._answered.add((task, attempt))
        self._attempts[task] = max(self._attempts.get(task, 0), attempt)
        current = self._outstanding.get(task)
        if current is not None and current.attempt == attempt:
            del self._outstanding[task]
        if accepted or final:
            self._final.setdefault(task, accepted)
        if accepted:
            self._preempted.pop(task, None)

    def preempted(self, task: Task) -> None:
        """An accepted preemption ended ``task``: it is not final any more, and goes back
        to its tenant's queue (the verdicts log is where every scheduler learns it)."""
        self._final.pop(task.task_id, None)
        self._preempted[task.task_id] = task

    def waiting_again(self, tenants: set[int]) -> list[Task]:
        """The preempted tasks of ``tenants`` not placed again, with no launch unanswered."""
        return [
            task
            for task_id, task in self._preempted.items()
            if task.tenant in tenants and task_id not in self._outstanding
        ]

    def is_final(self, task: int) -> bool:
        return task in self._final

    def outstanding(self, task: int) -> Outstanding | None:
        return self._outstanding.get(task)

    def next_attempt(self, task: int) -> int:
        return self._attempts.get(task, 0) + 1

    def _seq(self, gm: int, seq: int) -> None:
        if seq > self.max_seq.get(gm, 0):
            self.max_seq[gm] = seq


class CommitWatermark:
    """One requests partition: its offsets in the order read and the request at each
    (None: a record that was dead-lettered, done at once). The offset to commit is the
    first whose request is not final: everything before it is decided for good."""

    def __init__(self) -> None:
        self._open: deque[tuple[int, int | None]] = deque()
        self._committed: int | None = None
        self._next: int | None = None

    def read(self, offset: int, task: int | None) -> None:
        self._open.append((offset, task))
        self._next = offset + 1

    def advance(self, is_final: Callable[[int], bool]) -> int | None:
        """The new offset to commit, or None if it has not moved."""
        while self._open and (self._open[0][1] is None or is_final(self._open[0][1])):
            self._open.popleft()
        target = self._open[0][0] if self._open else self._next
        if target is None or target == self._committed:
            return None
        self._committed = target
        return target

    def tasks(self) -> set[int]:
        """The requests read and not yet known final."""
        return {task for _, task in self._open if task is not None}
