"""The federation's wire: every record versioned, every field of its type and range.

A record a scheduler or owner cannot take whole is refused with the reason (the
callers dead-letter it), so no verdict is half-applied: the scheduler checks a
verdict against the federation's pools, hosts, tenants and shapes before it
changes anything.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.federation.live_scheduler import Scheduler
from lavad.federation.live_wire import (
    WIRE_VERSION,
    EndVerdict,
    LaunchVerdict,
    WireError,
    decode_owner_record,
    decode_request,
    decode_verdict,
    encode_end,
    encode_end_verdict,
    encode_launch,
    encode_request,
    encode_verdict,
)
from lavad.federation.messages import LaunchRequest, PreemptRequest, Task, TaskEnd
from lavad.federation.owner import PoolOwner
from lavad.federation.topology import make_pool, uniform_topology

TASK = Task(task_id=9, job=3, tenant=1, demand=(1,), constraints=0, duration=60.0, arrival=5.0)
LAUNCH = LaunchRequest(0, 5, 0, 1, TASK, False, attempt=3, request_offset=12)


def _changed(data: bytes, **fields: Any) -> bytes:
    """``data``'s JSON object with ``fields`` set (a value of None removes the field)."""
    raw = orjson.loads(data)
    for key, value in fields.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return orjson.dumps(raw)


def _task_changed(data: bytes, key: str, value: Any) -> bytes:
    raw = orjson.loads(data)
    raw["task"][key] = value
    return orjson.dumps(raw)


def _verdict() -> bytes:
    pool = make_pool(0, np.array([[1], [1]]), np.zeros(2, dtype=np.uint64), 1)
    owner = PoolOwner("o", pool, 1, 2)
    return encode_verdict(LAUNCH, owner.launch(LAUNCH, 0.0), "a")


def test_every_record_round_trips_and_carries_the_version() -> None:
    preempt = PreemptRequest(1, 7, 0, 0, (4, 5), TASK, attempt=2, request_offset=-1)
    end = TaskEnd(pool=0, task_id=9)
    assert decode_request(encode_request(TASK)) == TASK
    assert decode_owner_record(encode_launch(LAUNCH)) == LAUNCH
    assert decode_owner_record(encode_launch(preempt)) == preempt
    assert decode_owner_record(encode_end(end)) == end
    for data in (encode_request(TASK), encode_launch(LAUNCH), encode_end(end), _verdict()):
        assert orjson.loads(data)["v"] == WIRE_VERSION
    verdict = decode_verdict(_verdict())
    assert isinstance(verdict, LaunchVerdict)
    assert verdict.request == TASK and verdict.accepted and verdict.ids.request_offset == 12
    assert verdict.summary is not None and verdict.summary.free.tolist() == [[1], [0]]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        # the version first: a record of another build is not read with this one's guess
        (_changed(encode_request(TASK), v=None), "federation wire version None"),
        (_changed(encode_request(TASK), v=2), "federation wire version 2, this lavad reads v1"),
        (_changed(encode_request(TASK), v=True), "federation wire version True"),
        (_changed(encode_request(TASK), v="1"), "federation wire version '1'"),
        (b"[1, 2]", "request: not an object"),
        # an absurd size (1 + 2 x 600,000 + 2 bytes) is refused by its length, before a parse
        (b"[" + b"1," * 600_000 + b"1]", "request: 1200003 bytes, more than 1048576"),
        (b"{", "request: not JSON"),
        # ids are JSON integers: not a string, a float or a boolean, and not negative
        (_changed(encode_request(TASK), task="9"), "'task' is not an integer"),
        (_changed(encode_request(TASK), task=9.0), "'task' is not an integer"),
        (_changed(encode_request(TASK), tenant=True), "'tenant' is not an integer"),
        (_changed(encode_request(TASK), tenant=-1), "'tenant' is -1, below 0"),
        # times are finite numbers >= 0
        (_changed(encode_request(TASK), duration=-1.0), "'duration' is not a finite number"),
        (_changed(encode_request(TASK), arrival="5"), "'arrival' is not a finite number"),
        # a demand is a short list of counts
        (_changed(encode_request(TASK), demand=[1] * 65), "'demand' must be a list of at most"),
        (_changed(encode_request(TASK), demand=[-1]), "'demand' must be a list"),
        (_changed(encode_request(TASK), demand=[0.5]), "'demand' must be a list"),
        (_changed(encode_request(TASK), demand="1"), "'demand' must be a list"),
        # counts the schedulers and owners hold in int64 (2**63 raised OverflowError there)
        (_changed(encode_request(TASK), demand=[2**63]), f"'demand' names a count above {2**53}"),
        (_changed(encode_request(TASK), demand=[2**53 + 1]), "'demand' names a count above"),
    ],
)
def test_a_request_that_is_not_one_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason.replace("(", r"\(")):
        decode_request(data)


def test_a_demand_of_the_largest_count_is_read() -> None:
    # The bound is the largest count, not past it: 2**53 still decodes, as itself.
    task = decode_request(_changed(encode_request(TASK), demand=[2**53]))
    assert task.demand == (2**53,)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_changed(encode_launch(LAUNCH), kind="launch!"), "kind 'launch!' is none of"),
        (_changed(encode_launch(LAUNCH), repartition="no"), "'repartition' is not true or false"),
        (_changed(encode_launch(LAUNCH), seq=-4), "'seq' is -4, below 0"),
        (_changed(encode_launch(LAUNCH), request_offset=-2), "'request_offset' is -2, below -1"),
        (_changed(encode_launch(LAUNCH), host=None), "'host' is not an integer"),
        (_task_changed(encode_launch(LAUNCH), "job", [1]), "'job' is not an integer"),
        (_changed(encode_launch(LAUNCH), task=[1]), "task: not an object"),
        (_changed(encode_launch(LAUNCH), kind="preempt", victims="all"), "victims must be a list"),
        (
            _changed(encode_launch(LAUNCH), kind="preempt", victims=list(range(65))),
            "victims must be a list of at most 64",
        ),
        (_changed(encode_launch(LAUNCH), kind="preempt", victims=[-3]), "'victims' must be"),
        (_changed(encode_end(TaskEnd(0, 9)), pool="0"), "'pool' is not an integer"),
        (_task_changed(encode_launch(LAUNCH), "demand", [2**64 - 1]), "'demand' names a count"),
    ],
)
def test_a_launch_that_is_not_one_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        decode_owner_record(data)


def _summary_changed(data: bytes, key: str, value: Any) -> bytes:
    raw = orjson.loads(data)
    raw["summary"][key] = value
    return orjson.dumps(raw)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_changed(_verdict(), accepted=1), "'accepted' is not true or false"),
        (_changed(_verdict(), task=10), "'task' is not its request's task"),
        (_changed(_verdict(), tenant=0), "'tenant' is not its request's tenant"),
        (_changed(_verdict(), reason=7), "'reason' is not a string"),
        (_changed(_verdict(), preempted=[1.5]), "'preempted' must be a list"),
        (_changed(_verdict(), summary=[1]), "summary is not an object"),
        (_summary_changed(_verdict(), "free", [[1], [1, 2]]), "'free' is not a matrix of integ"),
        (_summary_changed(_verdict(), "free", [[1.5], [0]]), "holds a value that is not an int"),
        (_summary_changed(_verdict(), "free", [["1"], [0]]), "holds a value that is not an int"),
        (_summary_changed(_verdict(), "free", [[-1], [0]]), "not a matrix of counts >= 0"),
        (_summary_changed(_verdict(), "free", [1, 0]), "not a matrix of counts >= 0"),
        (_summary_changed(_verdict(), "tenant_usage", [[2**64 - 1]]), "not a matrix of integers"),
        (_summary_changed(_verdict(), "owner", None), "'owner' is not a string"),
        (_summary_changed(_verdict(), "seen_seq", [True]), "'seen_seq' must be a list"),
    ],
)
def test_a_verdict_that_is_not_one_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        decode_verdict(data)


def test_an_owners_end_verdict_decodes() -> None:
    pool = make_pool(0, np.array([[1], [1]]), np.zeros(2, dtype=np.uint64), 1)
    owner = PoolOwner("o", pool, 1, 2)
    data = encode_end_verdict(TaskEnd(0, 9), owner.end(9, 1.0), "a")
    assert decode_verdict(data) == EndVerdict(task_id=9, pool=0, accepted=False)


async def test_a_verdict_of_a_pool_host_or_shape_the_federation_lacks_changes_nothing() -> None:
    # Constructed, never started: no broker is reached.
    topology = uniform_topology(pools=1, hosts_per_pool=2, schedulers=1)
    scheduler = Scheduler(KafkaSettings(), 0, topology, tenants=2, state_lag_s=1.0)
    good = _verdict()
    unfit = [
        (_changed(good, pool=1), "pool 1: the federation has 1"),
        (_changed(good, host=2), "host 2: pool 0 has 2"),
        (_task_changed_request(good, "tenant", 5), "tenant 5 is not one of the federation's"),
        (_task_changed_request(good, "demand", [1, 1]), "demand names 2 resources"),
        (_summary_changed(good, "free", [[1], [1], [1]]), "summary of shapes"),
        (_summary_changed(good, "tenant_usage", [[0]]), "summary of shapes"),
        (_changed(orjson.dumps(_end_verdict()), pool=3), "pool 3: the federation has 1"),
    ]
    for data, reason in unfit:
        with pytest.raises(WireError, match=reason):
            scheduler.answer(decode_verdict(data), 0.0)
        assert scheduler.running.usage.sum() == 0 and not scheduler.ledger.is_final(9)
    scheduler.answer(decode_verdict(good), 0.0)  # the same verdict, fit: taken
    assert scheduler.running.usage[1].tolist() == [1]


def _task_changed_request(data: bytes, key: str, value: Any) -> bytes:
    raw = orjson.loads(data)
    raw["request"][key] = value
    if key == "tenant":
        raw["tenant"] = value
    return orjson.dumps(raw)


def _end_verdict() -> dict[str, Any]:
    return {"kind": "end", "task": 9, "pool": 0, "accepted": True, "v": WIRE_VERSION}
