"""The live federation's records, as versioned data-only JSON (orjson): requests,
launches, verdicts and pool owners' snapshots. Decoding refuses what is not one.

A pool's partition of the launches topic carries everything that changes the pool, in
the order its owner applies it: launches, preemptions (a launch that names the
running tasks it ends) and task ends, told apart by ``kind``. Verdicts carry the same
``kind``."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

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

REQUESTS = "lavad.federation.requests"
LAUNCHES = "lavad.federation.launches"
VERDICTS = "lavad.federation.verdicts"
STATE = "lavad.federation.state"
OWNER_SNAPSHOTS = "lavad.federation.owner-snapshots"
DEAD_LETTERS = "lavad.federation.dead-letters"


MAX_VICTIMS = 64  # a preemption ends a few tasks on one host, not thousands


class WireError(ValueError):
    """A record that is not what its topic carries; the message says why."""


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"{what}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise WireError(f"{what}: not an object")
    return raw


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
    try:
        return Task(
            task_id=int(raw["task"]),
            job=int(raw["job"]),
            tenant=int(raw["tenant"]),
            demand=tuple(int(x) for x in raw["demand"]),
            constraints=int(raw["constraints"]),
            duration=float(raw["duration"]),
            arrival=float(raw["arrival"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"task: {exc!r}") from None


def encode_request(task: Task) -> bytes:
    return orjson.dumps(task_fields(task))


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
    return orjson.dumps(fields)


def encode_end(end: TaskEnd) -> bytes:
    return orjson.dumps({"kind": "end", "pool": end.pool, "task": end.task_id})


def decode_owner_record(data: bytes) -> LaunchRequest | PreemptRequest | TaskEnd:
    """A record of a pool's partition of the launches topic, by its kind."""
    raw = _object(data, "launch")
    kind = raw.get("kind")
    try:
        if kind == "launch":
            return _launch(raw)
        if kind == "preempt":
            victims = raw["victims"]
            if not isinstance(victims, list) or len(victims) > MAX_VICTIMS:
                raise WireError(f"preempt: victims must be a list of at most {MAX_VICTIMS}")
            return PreemptRequest(
                gm=int(raw["gm"]),
                seq=int(raw["seq"]),
                pool=int(raw["pool"]),
                host=int(raw["host"]),
                victims=tuple(int(v) for v in victims),
                task=task_from(raw["task"]),
                attempt=int(raw["attempt"]),
                request_offset=int(raw["request_offset"]),
            )
        if kind == "end":
            return TaskEnd(pool=int(raw["pool"]), task_id=int(raw["task"]))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"{kind}: {exc!r}") from None
    raise WireError(f"launch: kind {str(kind)[:40]!r} is none of launch, preempt, end")


def decode_launch(data: bytes) -> LaunchRequest:
    """A launch (not a preemption or an end: decode_owner_record reads every kind)."""
    record = decode_owner_record(data)
    if not isinstance(record, LaunchRequest):
        raise WireError(f"launch: a {type(record).__name__}, not a launch")
    return record


def _launch(raw: dict[str, Any]) -> LaunchRequest:
    try:
        return LaunchRequest(
            gm=int(raw["gm"]),
            seq=int(raw["seq"]),
            pool=int(raw["pool"]),
            host=int(raw["host"]),
            task=task_from(raw["task"]),
            repartition=bool(raw["repartition"]),
            attempt=int(raw["attempt"]),
            request_offset=int(raw["request_offset"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"launch: {exc!r}") from None


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


def decode_verdict(data: bytes) -> dict[str, Any]:
    raw = _object(data, "verdict")
    kind = raw.get("kind")
    if kind == "end":
        for key in ("task", "pool", "accepted"):
            if key not in raw:
                raise WireError(f"verdict: no {key!r}")
        return raw
    if kind not in ("launch", "preempt"):
        raise WireError(f"verdict: kind {str(kind)[:40]!r} is none of launch, preempt, end")
    ints = ("task", "tenant", "gm", "seq", "attempt", "request_offset", "pool", "host")
    for key in (*ints, "accepted", "final"):
        if key not in raw:
            raise WireError(f"verdict: no {key!r}")
    for key in ints:
        if not isinstance(raw[key], int) or isinstance(raw[key], bool):
            raise WireError(f"verdict: {key!r} is not an integer")
    return raw


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
        }
    )


def restore_owner(owner: PoolOwner, data: bytes) -> tuple[int, list[LaunchId]]:
    """Put the snapshot ``data`` into ``owner``; the launches offset it reflects and the
    launch ids decided up to it."""
    raw = _object(data, "owner snapshot")
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
        version = int(raw["version"])
        decided = [(int(task), int(attempt)) for task, attempt in raw["decided"]]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise WireError(f"owner snapshot: {exc!r}") from None
    owner.free = free
    owner.tenant_usage = usage
    owner.seen_seq = seen
    owner.running = running
    owner.version = version
    return offset, decided
