"""The request ledger is bounded by work, not by the stream's length: requests below
their queue's committed offset are forgotten unless they still wait on something (a
launch unanswered, a preemption's requeue, a running task), and what it forgets it keeps
answering as before (final, with its attempts going on). Driven directly: no broker."""

from __future__ import annotations

from collections import deque

from lavad.federation.messages import Task
from lavad.federation.request_ledger import CommitWatermark, RequestLedger


def _task(tid: int, tenant: int = 0) -> Task:
    return Task(tid, job=tid, tenant=tenant, demand=(1,), constraints=0, duration=1.0, arrival=0.0)


def test_ledger_stays_bounded_over_a_long_stream() -> None:
    # 40,000 requests on 2 queues, read in order; every 7th is refused once on a stale
    # view and launched again; 50 tasks run at a time (the oldest ends as a new one
    # starts); the queues' holder commits up to its first request not final every 500
    # requests and the ledger retires below. Without retiring, the ledger would hold
    # every task (40,000 x (attempts, final, answered, position) > 160,000 entries).
    # With it: the retired window (1,000), the requests since the last commit (500 per
    # round), the 50 running and their answered ids, the heaps' entries not yet popped.
    ledger = RequestLedger(retired_kept=1_000)
    marks = {0: CommitWatermark(), 1: CommitWatermark()}
    offsets = {0: 0, 1: 0}
    running: deque[int] = deque()
    seq = 0
    largest = 0
    for task in range(40_000):
        queue = task % 2
        ledger.located(task, queue, offsets[queue])
        marks[queue].read(offsets[queue], task)
        offsets[queue] += 1
        attempt = ledger.next_attempt(task)
        seq += 1
        ledger.launched(task, attempt, gm=0, seq=seq, pool=0)
        if task % 7 == 0:
            ledger.answered(task, attempt, gm=0, seq=seq, accepted=False, final=False)
            attempt = ledger.next_attempt(task)
            assert attempt == 2
            seq += 1
            ledger.launched(task, attempt, gm=0, seq=seq, pool=0)
        ledger.answered(task, attempt, gm=0, seq=seq, accepted=True, final=True)
        running.append(task)
        if len(running) > 50:
            running.popleft()
        if task % 500 == 499:
            committed = {q: mark.advance(ledger.is_final) or 0 for q, mark in marks.items()}
            ledger.retire_below(committed, running.__contains__)
        largest = max(largest, ledger.entries())
    assert largest < 4_000, largest
    # what it forgot it still answers: final, and the next attempt follows the last
    assert ledger.position(39_501) is None  # retired: 39,501 = 7 x 5,643, launched twice
    assert ledger.is_final(39_501) and ledger.next_attempt(39_501) == 3
    assert ledger.is_final(39_502) and ledger.next_attempt(39_502) == 2
    assert not ledger.is_final(2)  # out of the retired window long ago


def test_a_running_task_below_the_commit_keeps_its_attempts_for_a_preemption() -> None:
    ledger = RequestLedger(retired_kept=10)
    ledger.located(4, 1, 0)
    ledger.launched(4, 1, gm=0, seq=1, pool=0)
    ledger.answered(4, 1, gm=0, seq=1, accepted=False, final=False)
    ledger.launched(4, 2, gm=0, seq=2, pool=0)
    ledger.answered(4, 2, gm=0, seq=2, accepted=True, final=True)
    assert ledger.retire_below({1: 5}, lambda task: task == 4) == 0  # running: kept
    ledger.preempted(_task(4, tenant=1))
    assert ledger.next_attempt(4) == 3 and ledger.waiting_again({1}) == [_task(4, tenant=1)]
    assert ledger.retire_below({1: 5}, lambda task: False) == 0  # waiting to be placed again
    ledger.launched(4, 3, gm=0, seq=3, pool=0)
    ledger.answered(4, 3, gm=0, seq=3, accepted=True, final=True)
    assert ledger.retire_below({1: 5}, lambda task: False) == 1  # ended: forgotten
    assert ledger.is_final(4) and ledger.next_attempt(4) == 4 and ledger.position(4) is None


def test_a_request_waits_for_its_queues_commit_and_its_launchs_verdict() -> None:
    ledger = RequestLedger()
    ledger.located(1, 0, 10)
    ledger.launched(1, 1, gm=0, seq=1, pool=0)
    assert ledger.retire_below({0: 11}, lambda task: False) == 0  # its launch is unanswered
    ledger.answered(1, 1, gm=0, seq=1, accepted=True, final=True)
    ledger.located(1, 0, 20)  # the same request read again further on
    assert ledger.retire_below({0: 11}, lambda task: False) == 0  # not yet committed there
    assert ledger.retire_below({1: 50}, lambda task: False) == 0  # another queue's commit
    assert ledger.retire_below({0: 21}, lambda task: False) == 1
    assert ledger.is_final(1) and ledger.outstanding(1) is None


def test_a_replayed_launch_or_verdict_of_a_retired_request_is_not_remembered_again() -> None:
    ledger = RequestLedger()
    ledger.located(2, 0, 0)
    ledger.launched(2, 1, gm=1, seq=7, pool=0)
    ledger.answered(2, 1, gm=1, seq=7, accepted=True, final=True)
    assert ledger.retire_below({0: 1}, lambda task: False) == 1
    before = ledger.entries()
    # an owner restored from its snapshot publishes the same verdict again; a takeover
    # reads the launch again from the owners' committed offset
    ledger.located(2, 0, 0)
    ledger.launched(2, 1, gm=1, seq=7, pool=0)
    ledger.answered(2, 1, gm=1, seq=7, accepted=True, final=True)
    assert ledger.entries() == before
    assert ledger.outstanding(2) is None and ledger.is_final(2) and ledger.max_seq == {1: 7}


def test_the_retired_window_keeps_only_the_newest() -> None:
    ledger = RequestLedger(retired_kept=3)
    for task in range(5):
        ledger.located(task, 0, task)
        ledger.launched(task, 1, gm=0, seq=task + 1, pool=0)
        ledger.answered(task, 1, gm=0, seq=task + 1, accepted=True, final=True)
    assert ledger.retire_below({0: 5}, lambda task: False) == 5
    # the oldest two are forgotten for good: a request repeated that late is a new one
    assert [ledger.is_final(task) for task in range(5)] == [False, False, True, True, True]


def test_a_request_set_aside_after_a_defect_is_final_and_retires_below_the_commit() -> None:
    ledger = RequestLedger()
    ledger.located(7, 0, 3)
    assert not ledger.is_final(7)
    ledger.set_aside(7)
    assert ledger.is_final(7) and ledger.outstanding(7) is None
    assert ledger.retire_below({0: 4}, lambda task: False) == 1  # nothing left to wait on
    assert ledger.entries() == 1  # remembered only as retired
