"""Restart safety of the live federation, without a broker: the request ledger (which
launch of a request is still unanswered, which requests are final), the commit
watermark (a request's offset is committed only once it is final), the scheduler
dropping a moved queue's tasks, and the owner's snapshot carrying its decided ids."""

from __future__ import annotations

import numpy as np
import pytest

from lavad.federation.live_wire import (
    LaunchVerdict,
    WireError,
    decode_launch,
    decode_verdict,
    encode_launch,
    encode_owner,
    encode_verdict,
    restore_owner,
)
from lavad.federation.messages import LaunchRequest, Task
from lavad.federation.owner import PoolOwner
from lavad.federation.request_ledger import CommitWatermark, RequestLedger
from lavad.federation.running_tasks import RunningTasks
from lavad.federation.scheduler import GlobalScheduler
from lavad.federation.topology import make_pool, uniform_topology
from lavad.federation.view import GlobalView


def _task(tid: int, tenant: int = 0) -> Task:
    return Task(tid, job=tid, tenant=tenant, demand=(1,), constraints=0, duration=1.0, arrival=0.0)


def test_ledger_a_request_is_decided_again_only_after_its_launch_is_answered() -> None:
    ledger = RequestLedger()
    assert ledger.next_attempt(7) == 1 and ledger.outstanding(7) is None
    ledger.launched(7, 1, gm=1, seq=40, pool=0)
    # a scheduler that takes the queue over now must wait: attempt 1 is unanswered
    waiting = ledger.outstanding(7)
    assert waiting is not None and (waiting.attempt, waiting.gm, waiting.pool) == (1, 1, 0)
    ledger.answered(7, 1, gm=1, seq=40, accepted=False, final=False)  # stale view
    assert ledger.outstanding(7) is None and not ledger.is_final(7)
    assert ledger.next_attempt(7) == 2
    ledger.launched(7, 2, gm=0, seq=3, pool=1)
    # an owner that took pool 0 over replays attempt 1: the same verdict, nothing changes
    ledger.answered(7, 1, gm=1, seq=40, accepted=False, final=False)
    assert ledger.outstanding(7) is not None
    ledger.answered(7, 2, gm=0, seq=3, accepted=True, final=True)
    assert ledger.is_final(7) and ledger.outstanding(7) is None
    assert ledger.max_seq == {1: 40, 0: 3}


def test_ledger_a_launch_read_after_its_verdict_is_not_outstanding() -> None:
    # a takeover reads the launches since the owners' commit and the verdicts in either
    # order: a launch whose verdict was read is not waited for
    ledger = RequestLedger()
    ledger.answered(3, 1, gm=0, seq=9, accepted=True, final=True)
    ledger.launched(3, 1, gm=0, seq=9, pool=0)
    assert ledger.outstanding(3) is None and ledger.is_final(3)


def test_ledger_a_final_refusal_is_final_and_a_later_duplicate_does_not_flip_it() -> None:
    ledger = RequestLedger()
    ledger.answered(5, 1, gm=0, seq=1, accepted=False, final=True)
    ledger.answered(5, 1, gm=0, seq=1, accepted=True, final=True)
    assert ledger.is_final(5)
    # is_final only says decided; the first answer is kept (refused), so a second
    # launch is never made: next_attempt is 2 but the scheduler skips a final request
    assert ledger.next_attempt(5) == 2


def test_watermark_commits_up_to_the_first_request_not_final() -> None:
    final: set[int] = set()
    mark = CommitWatermark()
    assert mark.advance(final.__contains__) is None  # nothing read
    mark.read(10, 100)
    mark.read(11, None)  # dead-lettered: done at once
    mark.read(12, 102)
    assert mark.advance(final.__contains__) == 10  # 100 undecided: 10 is read again
    assert mark.advance(final.__contains__) is None  # unmoved: no second commit
    final.add(102)
    assert mark.advance(final.__contains__) is None  # 100 still holds it at 10
    final.add(100)
    assert mark.advance(final.__contains__) == 13  # all final: past the last record
    assert mark.tasks() == set()
    mark.read(13, 103)
    assert mark.tasks() == {103}


def test_scheduler_drops_a_moved_queues_tasks_and_keeps_the_rest() -> None:
    topology = uniform_topology(1, 4, 1)
    view = GlobalView(0, topology, {0: "o"}, 2)
    sched = GlobalScheduler(0, topology, view, [0, 1])
    for tid, tenant in ((1, 0), (2, 1), (3, 1), (4, 0)):
        sched.enqueue(_task(tid, tenant))
    assert sched.drop({2, 3, 99}) == 2
    assert sched.queued() == 2
    order = [sched.next_task(), sched.next_task(), sched.next_task()]
    assert [t.task_id if t else None for t in order] == [1, 4, None]


def test_launch_and_verdict_carry_the_attempt_and_a_verdict_without_it_is_refused() -> None:
    pool = make_pool(0, np.array([[1], [1]]), np.zeros(2, dtype=np.uint64), 1)
    owner = PoolOwner("o", pool, 1, 1)
    request = LaunchRequest(0, 5, 0, 1, _task(9), False, attempt=3)
    assert decode_launch(encode_launch(request)) == request
    data = encode_verdict(request, owner.launch(request, 0.0), "a")
    verdict = decode_verdict(data)
    assert isinstance(verdict, LaunchVerdict)
    assert (verdict.request.task_id, verdict.ids.attempt, verdict.accepted) == (9, 3, True)
    with pytest.raises(WireError, match="attempt"):
        decode_verdict(data.replace(b'"attempt":3,', b""))
    with pytest.raises(WireError, match="'seq' is not an integer"):
        decode_verdict(data.replace(b'"seq":5', b'"seq":"5"'))


def test_owner_snapshot_carries_the_decided_launch_ids() -> None:
    pool = make_pool(0, np.array([[1], [1]]), np.zeros(2, dtype=np.uint64), 1)
    owner = PoolOwner("o", pool, 1, 1)
    owner.launch(LaunchRequest(0, 1, 0, 0, _task(9), False, attempt=1), 0.0)
    data = encode_owner(owner, 17, [(9, 1), (8, 2)])
    fresh = PoolOwner("o", pool, 1, 1)
    assert restore_owner(fresh, data) == (17, [(9, 1), (8, 2)])
    assert fresh.free.tolist() == [[0], [1]] and 9 in fresh.running
    with pytest.raises(WireError, match="owner snapshot"):
        restore_owner(fresh, data.replace(b'"decided":[[9,1],[8,2]]', b'"decided":[[9]]'))


def test_ledger_a_preempted_task_waits_again_until_it_is_placed_again() -> None:
    ledger = RequestLedger()
    victim = _task(4, tenant=1)
    ledger.launched(4, 1, gm=0, seq=1, pool=0)
    ledger.answered(4, 1, gm=0, seq=1, accepted=True, final=True)
    ledger.preempted(victim)
    assert not ledger.is_final(4) and ledger.next_attempt(4) == 2
    assert ledger.waiting_again({1}) == [victim] and ledger.waiting_again({0}) == []
    ledger.launched(4, 2, gm=0, seq=2, pool=0)
    assert ledger.waiting_again({1}) == []  # its launch is unanswered: not queued twice
    ledger.answered(4, 2, gm=0, seq=2, accepted=True, final=True)
    assert ledger.is_final(4) and ledger.waiting_again({1}) == []


def test_running_tasks_from_verdicts() -> None:
    running = RunningTasks(pools=2, tenants=2, resources=1)
    running.started(_task(1, tenant=0), gm=0, pool=1, host=3, at=5.0)
    running.started(_task(2, tenant=1), gm=0, pool=1, host=4, at=6.0)
    running.started(_task(2, tenant=1), gm=0, pool=1, host=4, at=6.0)  # a replayed verdict
    assert running.tenant_usage().tolist() == [[1], [1]]
    assert [t.task_id for t in running.in_pool(1, leaving={2})] == [1]
    ended = running.ended(1)
    assert ended is not None and ended.task_id == 1 and running.ended(1) is None
    assert running.tenant_usage().tolist() == [[0], [1]]
