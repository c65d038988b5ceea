"""The live federation's records, as versioned data-only JSON (orjson): requests,
launches, verdicts and pool owners' snapshots. Decoding refuses what is not one.

A pool's partition of the launches topic carries everything that changes the pool, in
the order its owner applies it: launches, preemptions (a launch that names the
running tasks it ends) and task ends, told apart by ``kind``. Verdicts carry the same
``kind``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from lavad.federation.bounded_json import load_bounded
from lavad.federation.messages import (
    Accepted,
    Ended,
    LaunchRequest,
    PoolSummary,
    PreemptRequest,
    Refused,
    RunningTask,
    Task,
    TaskEnd,
    Verdict,
)
from lavad.federation.owner import PoolOwner
from lavad.federation.request_ledger import LaunchId
from lavad.federation.summary_codec import MAX_SUMMARY_BYTES

REQUESTS = "lavad.federation.requests"
LAUNCHES = "lavad.federation.launches"
VERDICTS = "lavad.federation.verdicts"
STATE = "lavad.federation.state"
OWNER_SNAPSHOTS = "lavad.federation.owner-snapshots"
DEAD_LETTERS = "lavad.federation.dead-letters"


MAX_VICTIMS = 64  # a preemption ends a few tasks on one host, not thousands
# Every record carries it as "v"; a record of another version is refused with the
# reason, never read with this build's guess of its fields. Version 1 is the first
# to carry it (launches and verdicts name their request's offset and attempt).
WIRE_VERSION = 1
# A request, launch or task end is a few hundred bytes; a verdict also carries its
# pool's summary, so it may be as large as one (MAX_SUMMARY_BYTES) and a little more.
MAX_RECORD_BYTES = 1024 * 1024
MAX_VERDICT_BYTES = MAX_SUMMARY_BYTES + MAX_RECORD_BYTES
# A task's demand names one count per resource: a handful, never thousands.
MAX_RESOURCES = 64
# The largest count a demand names. JSON integers run to 2**64 - 1, but the
# schedulers and owners count in int64: a count from 2**63 on would raise
# OverflowError there, which a scheduler would take for a defect of its own
# and an owner would halt its pool on. 2**53 is also the largest a reader that
# takes numbers as doubles keeps exactly, and far above any host's capacity.
MAX_DEMAND = 2**53
# The longest text a verdict's reason or instance keeps (the rest is cut).
MAX_TEXT = 1_000


class WireError(ValueError):
    """A record that is not what its topic carries; the message says why."""


def _object(data: bytes, what: str, most: int | None = None) -> dict[str, Any]:
    """The JSON object ``data`` holds, of this wire version; at most ``most`` bytes
    (MAX_RECORD_BYTES)."""
    limit = MAX_RECORD_BYTES if most is None else most
    raw = load_bounded(data, limit, WireError, f"{what}: ")
    if not isinstance(raw, dict):
        raise WireError(f"{what}: not an object")
    version = raw.get("v")
    # type(): True == 1 in Python, and a boolean is no version number.
    if type(version) is not int or version != WIRE_VERSION:
        shown = repr(version)[:40]
        raise WireError(
            f"{what}: federation wire version {shown}, this lavad reads v{WIRE_VERSION}"
        )
    return raw


def _int(raw: dict[str, Any], key: str, what: str, *, least: int | None = None) -> int:
    """``raw[key]`` as a JSON integer (not a boolean, a float or a string), at least ``least``."""
    value = raw.get(key)
    if type(value) is not int:
        raise WireError(f"{what}: {key!r} is not an integer")
    if least is not None and value < least:
        raise WireError(f"{what}: {key!r} is {value}, below {least}")
    return value


def _number(raw: dict[str, Any], key: str, what: str) -> float:
    """``raw[key]`` as a finite JSON number of at least 0 (a time or a duration)."""
    value: Any = raw.get(key)
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise WireError(f"{what}: {key!r} is not a finite number >= 0")
    return float(value)


def _flag(raw: dict[str, Any], key: str, what: str) -> bool:
    value = raw.get(key)
    if type(value) is not bool:
        raise WireError(f"{what}: {key!r} is not true or false")
    return value


def _text(raw: dict[str, Any], key: str, what: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise WireError(f"{what}: {key!r} is not a string")
    return value[:MAX_TEXT]


def _ints(
    value: Any, key: str, what: str, *, most: int, largest: int | None = None
) -> tuple[int, ...]:
    """A JSON list of at most ``most`` integers >= 0 (and at most ``largest``, if given)."""
    if (
        not isinstance(value, list)
        or len(value) > most
        or not all(type(x) is int and x >= 0 for x in value)
    ):
        raise WireError(f"{what}: {key!r} must be a list of at most {most} integers >= 0")
    if largest is not None and any(x > largest for x in value):
        raise WireError(f"{what}: {key!r} names a count above {largest}")
    return tuple(value)


def task_fields(task: Task) -> dict[str, Any]:
    return {
        "task": task.task_id,
        "job": task.job,
        "tenant": task.tenant,
        "demand": list(task.demand),
        "constraints": task.constraints,
        "duration": task.duration,
        "arrival": task.arrival,
    }


def task_from(raw: Any) -> Task:
    """A task's fields, each of its type and range, or WireError naming the first that is not."""
    if not isinstance(raw, dict):
        raise WireError("task: not an object")
    return Task(
        task_id=_int(raw, "task", "task", least=0),
        job=_int(raw, "job", "task", least=0),
        tenant=_int(raw, "tenant", "task", least=0),
        demand=_ints(raw.get("demand"), "demand", "task", most=MAX_RESOURCES, largest=MAX_DEMAND),
        constraints=_int(raw, "constraints", "task", least=0),
        duration=_number(raw, "duration", "task"),
        arrival=_number(raw, "arrival", "task"),
    )


def encode_request(task: Task) -> bytes:
    return orjson.dumps({**task_fields(task), "v": WIRE_VERSION})


def decode_request(data: bytes) -> Task:
    return task_from(_object(data, "request"))


def _kind(request: LaunchRequest | PreemptRequest) -> str:
    return "preempt" if isinstance(request, PreemptRequest) else "launch"


def _launch_ids(request: LaunchRequest | PreemptRequest) -> dict[str, Any]:
    """Who sent a launch and where it goes: the fields its verdict repeats."""
    return {
        "gm": request.gm,
        "seq": request.seq,
        "attempt": request.attempt,
        "request_offset": request.request_offset,
        "pool": request.pool,
        "host": request.host,
    }


@dataclass(frozen=True, slots=True)
class LaunchIds:
    """The fields a launch and its verdict share, read and checked once."""

    gm: int
    seq: int
    attempt: int
    request_offset: int  # -1: not read from the requests topic
    pool: int
    host: int


def _launch_ids_from(raw: dict[str, Any], what: str) -> LaunchIds:
    return LaunchIds(
        gm=_int(raw, "gm", what, least=0),
        seq=_int(raw, "seq", what, least=0),
        attempt=_int(raw, "attempt", what, least=0),
        request_offset=_int(raw, "request_offset", what, least=-1),
        pool=_int(raw, "pool", what, least=0),
        host=_int(raw, "host", what, least=0),
    )


def encode_launch(request: LaunchRequest | PreemptRequest) -> bytes:
    """A launch, or a preemption: the same fields and the victims."""
    fields: dict[str, Any] = {
        "kind": _kind(request),
        **_launch_ids(request),
        "task": task_fields(request.task),
    }
    if isinstance(request, PreemptRequest):
        fields["victims"] = list(request.victims)
    else:
        fields["repartition"] = request.repartition
    fields["v"] = WIRE_VERSION
    return orjson.dumps(fields)


def encode_end(end: TaskEnd) -> bytes:
    return orjson.dumps({"kind": "end", "pool": end.pool, "task": end.task_id, "v": WIRE_VERSION})


def decode_owner_record(data: bytes) -> LaunchRequest | PreemptRequest | TaskEnd:
    """A record of a pool's partition of the launches topic, by its kind."""
    raw = _object(data, "launch")
    kind = raw.get("kind")
    if kind == "end":
        return TaskEnd(pool=_int(raw, "pool", "end", least=0), task_id=_int(raw, "task", "end"))
    if kind not in ("launch", "preempt"):
        raise WireError(f"launch: kind {str(kind)[:40]!r} is none of launch, preempt, end")
    if kind == "preempt":
        victims = raw.get("victims")
        if not isinstance(victims, list) or len(victims) > MAX_VICTIMS:
            raise WireError(f"preempt: victims must be a list of at most {MAX_VICTIMS}")
    ids = _launch_ids_from(raw, kind)
    task = task_from(raw.get("task"))
    if kind == "preempt":
        return PreemptRequest(
            gm=ids.gm,
            seq=ids.seq,
            pool=ids.pool,
            host=ids.host,
            victims=_ints(victims, "victims", "preempt", most=MAX_VICTIMS),
            task=task,
            attempt=ids.attempt,
            request_offset=ids.request_offset,
        )
    return LaunchRequest(
        gm=ids.gm,
        seq=ids.seq,
        pool=ids.pool,
        host=ids.host,
        task=task,
        repartition=_flag(raw, "repartition", "launch"),
        attempt=ids.attempt,
        request_offset=ids.request_offset,
    )


def decode_launch(data: bytes) -> LaunchRequest:
    """A launch (not a preemption or an end: decode_owner_record reads every kind)."""
    record = decode_owner_record(data)
    if not isinstance(record, LaunchRequest):
        raise WireError(f"launch: a {type(record).__name__}, not a launch")
    return record


def encode_verdict(
    request: LaunchRequest | PreemptRequest, verdict: Verdict, instance: str
) -> bytes:
    accepted = isinstance(verdict, Accepted)
    return orjson.dumps(
        {
            "kind": _kind(request),
            "task": request.task.task_id,
            "tenant": request.task.tenant,
            "request": task_fields(request.task),
            **_launch_ids(request),
            "accepted": accepted,
            "final": accepted or bool(getattr(verdict, "final", True)),
            "reason": "" if accepted else getattr(verdict, "reason", ""),
            "preempted": [v.task_id for v in verdict.preempted]
            if isinstance(verdict, Accepted)
            else [],
            "instance": instance,
            "summary": _summary_fields(verdict.summary),
            "v": WIRE_VERSION,
        }
    )


def encode_end_verdict(end: TaskEnd, verdict: Ended | Refused, instance: str) -> bytes:
    """A task end as its owner took it: ended (its resources back), or refused (not running)."""
    ended = isinstance(verdict, Ended)
    return orjson.dumps(
        {
            "kind": "end",
            "task": end.task_id,
            "pool": end.pool,
            "accepted": ended,
            "final": True,
            "reason": "" if ended else getattr(verdict, "reason", ""),
            "instance": instance,
            "summary": _summary_fields(verdict.summary),
            "v": WIRE_VERSION,
        }
    )


def _summary_fields(summary: PoolSummary | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {
        "owner": summary.owner,
        "version": summary.version,
        "free": summary.free.tolist(),
        "seen_seq": list(summary.seen_seq),
        "tenant_usage": summary.tenant_usage.tolist(),
    }


@dataclass(frozen=True, slots=True)
class VerdictSummary:
    """The pool's state a verdict carries. Its arrays' shapes are the reader's to check
    against the pool it knows (``decode_verdict`` does not know the pool's size)."""

    owner: str
    version: int
    free: np.ndarray
    seen_seq: tuple[int, ...]
    tenant_usage: np.ndarray


@dataclass(frozen=True, slots=True)
class LaunchVerdict:
    """An owner's answer to a launch or a preemption, every field checked."""

    kind: str  # "launch" or "preempt"
    request: Task
    ids: LaunchIds
    accepted: bool
    final: bool
    reason: str
    preempted: tuple[int, ...]
    instance: str
    summary: VerdictSummary | None


@dataclass(frozen=True, slots=True)
class EndVerdict:
    """An owner's answer to a task end: ended, or refused (the task was not running)."""

    task_id: int
    pool: int
    accepted: bool


def _counts(value: Any, key: str) -> np.ndarray:
    """A JSON matrix of counts >= 0 (hosts or tenants x resources)."""
    try:
        array = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise WireError(f"verdict: summary {key!r} is not a matrix of integers") from None
    if array.ndim != 2 or array.shape[1] > MAX_RESOURCES or (array < 0).any():
        raise WireError(f"verdict: summary {key!r} is not a matrix of counts >= 0")
    if not all(type(x) is int for row in value for x in row):
        raise WireError(f"verdict: summary {key!r} holds a value that is not an integer")
    return array


def _verdict_summary(raw: Any, *, most_schedulers: int) -> VerdictSummary | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise WireError("verdict: summary is not an object")
    return VerdictSummary(
        owner=_text(raw, "owner", "verdict summary"),
        version=_int(raw, "version", "verdict summary", least=0),
        free=_counts(raw.get("free"), "free"),
        seen_seq=_ints(raw.get("seen_seq"), "seen_seq", "verdict summary", most=most_schedulers),
        tenant_usage=_counts(raw.get("tenant_usage"), "tenant_usage"),
    )


# seen_seq has one count per global scheduler; federation.schedulers is far below this.
MAX_SCHEDULERS = 10_000


def decode_verdict(data: bytes) -> LaunchVerdict | EndVerdict:
    """A verdict, every field of its type and range, or WireError naming the first that is not.

    The reader can then apply it whole: nothing in it fails half-way through."""
    raw = _object(data, "verdict", MAX_VERDICT_BYTES)
    kind = raw.get("kind")
    if kind == "end":
        return EndVerdict(
            task_id=_int(raw, "task", "verdict", least=0),
            pool=_int(raw, "pool", "verdict", least=0),
            accepted=_flag(raw, "accepted", "verdict"),
        )
    if kind not in ("launch", "preempt"):
        raise WireError(f"verdict: kind {str(kind)[:40]!r} is none of launch, preempt, end")
    ids = _launch_ids_from(raw, "verdict")
    request = task_from(raw.get("request"))
    if _int(raw, "task", "verdict") != request.task_id:
        raise WireError("verdict: 'task' is not its request's task")
    if _int(raw, "tenant", "verdict") != request.tenant:
        raise WireError("verdict: 'tenant' is not its request's tenant")
    return LaunchVerdict(
        kind=kind,
        request=request,
        ids=ids,
        accepted=_flag(raw, "accepted", "verdict"),
        final=_flag(raw, "final", "verdict"),
        reason=_text(raw, "reason", "verdict"),
        preempted=_ints(raw.get("preempted"), "preempted", "verdict", most=MAX_VICTIMS),
        instance=_text(raw, "instance", "verdict"),
        summary=_verdict_summary(raw.get("summary"), most_schedulers=MAX_SCHEDULERS),
    )


def encode_owner(owner: PoolOwner, offset: int, decided: list[LaunchId]) -> bytes:
    """The pool's state as of launch ``offset``, with the launch ids it has decided."""
    return orjson.dumps(
        {
            "pool": owner.pool.index,
            "offset": offset,
            "decided": [list(launch) for launch in decided],
            "version": owner.version,
            "free": owner.free.tolist(),
            "usage": owner.tenant_usage.tolist(),
            "seen_seq": list(owner.seen_seq),
            "running": [
                [r.task_id, r.tenant, r.gm, r.host, list(r.demand), r.start]
                for r in owner.running.values()
            ],
            "v": WIRE_VERSION,
        }
    )


def restore_owner(owner: PoolOwner, data: bytes) -> tuple[int, list[LaunchId]]:
    """Put the snapshot ``data`` into ``owner``; the launches offset it reflects and the
    launch ids decided up to it."""
    # Assembled from chunks whose count and total size its manifest fixed (owner_snapshots).
    raw = _object(data, "owner snapshot", len(data))
    try:
        if int(raw["pool"]) != owner.pool.index:
            raise WireError(f"owner snapshot of pool {raw['pool']}, not {owner.pool.index}")
        free = np.asarray(raw["free"], dtype=np.int64)
        usage = np.asarray(raw["usage"], dtype=np.int64)
        if free.shape != owner.free.shape or usage.shape != owner.tenant_usage.shape:
            raise WireError("owner snapshot: arrays of another shape")
        seen = [int(s) for s in raw["seen_seq"]]
        if len(seen) != len(owner.seen_seq):
            raise WireError("owner snapshot: seen_seq of another length")
        running = {
            int(r[0]): RunningTask(
                int(r[0]), int(r[1]), int(r[2]), int(r[3]), tuple(int(x) for x in r[4]), float(r[5])
            )
            for r in raw["running"]
        }
        offset = int(raw["offset"])
        if not 0 <= offset < 2**63:
            # The consumer seeks there: a Kafka offset is a non-negative int64.
            raise WireError(f"owner snapshot: offset {offset} is no Kafka offset")
        version = int(raw["version"])
        decided = [(int(task), int(attempt)) for task, attempt in raw["decided"]]
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        # OverflowError: a count past int64 (its digest matched: written so, not damaged).
        raise WireError(f"owner snapshot: {exc!r}") from None
    owner.free = free
    owner.tenant_usage = usage
    owner.seen_seq = seen
    owner.running = running
    owner.version = version
    return offset, decided
