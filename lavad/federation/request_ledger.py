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

The ledger is bounded by work, not by the stream's length: every launch and verdict
names its request's offset in its tenant queue (``located``), and ``retire_below``
forgets the requests below their queue's committed offset (the schedulers' group's:
such a request is final and no holder reads it again), but for those still waiting on
something (a launch unanswered, a task preempted and not placed again, a task running
that a preemption may end: its next attempt must follow its last). The newest
``retired_kept`` retired requests are remembered as final with their last attempt, so a
duplicate request or a verdict replayed by an owner soon after is recognised; a request
repeated after that many others retired is decided as a new one (the owner keeps the
newest decided launch ids per pool, the same kind of bound).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from lavad.federation.messages import Task

LaunchId = tuple[int, int]  # (task, attempt)

# a duplicate request or a replayed verdict comes within a takeover's window, not
# hundreds of thousands of retired requests later; a few MB at most
RETIRED_KEPT = 100_000


@dataclass(frozen=True, slots=True)
class Outstanding:
    """A launch sent and not yet answered."""

    attempt: int
    gm: int
    seq: int
    pool: int


class RequestLedger:
    def __init__(self, retired_kept: int = RETIRED_KEPT) -> None:
        self._attempts: dict[int, int] = {}  # task -> highest attempt launched or answered
        self._final: dict[int, bool] = {}  # task -> True accepted, False refused for good
        self._outstanding: dict[int, Outstanding] = {}  # task -> its unanswered launch
        self._answered: set[LaunchId] = set()
        self.max_seq: dict[int, int] = {}  # scheduler -> the highest launch seq it sent
        self._preempted: dict[int, Task] = {}  # tasks ended by a preemption, not placed again
        self._position: dict[int, tuple[int, int]] = {}  # task -> (queue, its request's offset)
        self._by_offset: dict[int, list[tuple[int, int]]] = {}  # queue -> heap of (offset, task)
        self._held: set[int] = set()  # below their queue's commit, still waiting on something
        # task -> (its last attempt, queue, offset), oldest first
        self._retired: dict[int, tuple[int, int, int]] = {}
        self._retired_kept = retired_kept

    def located(self, task: int, queue: int, offset: int) -> None:
        """``task``'s request is at ``offset`` of tenant queue ``queue`` (a negative offset:
        not known, and the task is never retired)."""
        if offset < 0 or task in self._retired:
            return  # a replayed launch or verdict of a request retired since
        current = self._position.get(task)
        if current is not None and current[1] >= offset:
            return  # a request read twice: the later offset is the one that counts
        self._position[task] = (queue, offset)
        self._held.discard(task)  # its new offset's entry decides
        heapq.heappush(self._by_offset.setdefault(queue, []), (offset, task))

    def retire_below(self, committed: Mapping[int, int], running: Callable[[int], bool]) -> int:
        """Forget the requests below their queue's ``committed`` offset that wait on
        nothing (``running``: a task a preemption may still end); the number retired.
        A queue's committed offset only moves forward: one found below it stays below."""
        retired = 0
        for task in list(self._held):
            if task not in self._position:
                self._held.discard(task)
            elif self._retire(task, running):
                self._held.discard(task)
                retired += 1
        for queue, offset in committed.items():
            heap = self._by_offset.get(queue)
            while heap and heap[0][0] < offset:
                at, task = heapq.heappop(heap)
                if self._position.get(task) != (queue, at):
                    continue  # read again later: that entry decides
                if self._retire(task, running):
                    retired += 1
                else:
                    self._held.add(task)
        return retired

    def _retire(self, task: int, running: Callable[[int], bool]) -> bool:
        if (
            task not in self._final
            or task in self._outstanding
            or task in self._preempted
            or running(task)
        ):
            return False
        attempts = self._attempts.pop(task, 0)
        del self._final[task]
        for attempt in range(1, attempts + 1):
            self._answered.discard((task, attempt))
        queue, offset = self._position.pop(task)
        self._retired[task] = (attempts, queue, offset)
        if len(self._retired) > self._retired_kept:
            del self._retired[next(iter(self._retired))]
        return True

    def entries(self) -> int:
        """Requests remembered (retired ones included): what the bound is about."""
        tasks = self._attempts.keys() | self._final.keys() | self._position.keys()
        heaps = sum(len(heap) for heap in self._by_offset.values())
        return len(tasks) + len(self._answered) + len(self._retired) + heaps + len(self._held)

    def launched(self, task: int, attempt: int, gm: int, seq: int, pool: int) -> None:
        """A launch sent (by this scheduler, or read from the launches topic)."""
        self._seq(gm, seq)
        if task in self._retired and self._retired[task][0] >= attempt:
            return  # a launch of a request retired since: answered long ago
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
        if task in self._retired and self._retired[task][0] >= attempt:
            return
        self._answered.add((task, attempt))
        self._attempts[task] = max(self._attempts.get(task, 0), attempt)
        current = self._outstanding.get(task)
        if current is not None and current.attempt == attempt:
            del self._outstanding[task]
        if accepted or final:
            self._final.setdefault(task, accepted)
        if accepted:
            self._preempted.pop(task, None)

    def set_aside(self, task: int) -> None:
        """A defect met deciding ``task``: its request is done, as one refused for good is
        (its offset may be committed past and the request retired). Only this scheduler
        knows: a holder that reads the request again before that commit decides it again."""
        self._final[task] = False
        self._preempted.pop(task, None)

    def preempted(self, task: Task) -> None:
        """An accepted preemption ended ``task``: it is not final any more, and goes back
        to its tenant's queue (the verdicts log is where every scheduler learns it)."""
        retired = self._retired.pop(task.task_id, None)
        if retired is not None:  # a replayed start of a retired task: its attempts go on
            last, queue, offset = retired
            self._attempts[task.task_id] = max(self._attempts.get(task.task_id, 0), last)
            self.located(task.task_id, queue, offset)
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
        return task in self._final or task in self._retired

    def outstanding(self, task: int) -> Outstanding | None:
        return self._outstanding.get(task)

    def next_attempt(self, task: int) -> int:
        retired = self._retired.get(task)
        return max(self._attempts.get(task, 0), retired[0] if retired else 0) + 1

    def position(self, task: int) -> tuple[int, int] | None:
        """``(queue, offset)`` of the task's request, if known."""
        return self._position.get(task)

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
