"""Pool summaries as data on the wire (the state topic): versioned JSON, nothing that runs.

Decoding is bounded and strict: a record that is not a summary of this format, whose
arrays do not have the pool's shape, or whose numbers are not counts, is refused
with the reason (``SummaryError``), never half-applied.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from lavad.federation.bounded_json import load_bounded
from lavad.federation.messages import PoolSummary

SUMMARY_FORMAT = "lavad.federation.summary"
SUMMARY_VERSION = 1
MAX_SUMMARY_BYTES = 64 * 1024 * 1024


class SummaryError(ValueError):
    """A record of the state topic that is not a usable summary; the message says why."""


def encode_summary(summary: PoolSummary) -> bytes:
    return orjson.dumps(
        {
            "format": SUMMARY_FORMAT,
            "v": SUMMARY_VERSION,
            "pool": summary.pool,
            "owner": summary.owner,
            "version": summary.version,
            "sent_at": summary.sent_at,
            "free": summary.free.tolist(),
            "seen_seq": list(summary.seen_seq),
            "tenant_usage": summary.tenant_usage.tolist(),
            "queue_length": summary.queue_length,
        }
    )


def _counts(value: Any, shape: tuple[int, int], what: str) -> np.ndarray:
    if not isinstance(value, list) or len(value) != shape[0]:
        raise SummaryError(f"{what}: want {shape[0]} rows")
    for row in value:
        if not isinstance(row, list) or len(row) != shape[1]:
            raise SummaryError(f"{what}: want rows of {shape[1]} counts")
        if not all(type(x) is int and 0 <= x < 1 << 53 for x in row):
            raise SummaryError(f"{what}: want integer counts >= 0")
    return np.asarray(value, dtype=np.int64).reshape(shape)


def decode_summary(
    data: bytes, *, hosts: int, resources: int, tenants: int, schedulers: int
) -> PoolSummary:
    """The summary ``data`` holds, for a pool of ``hosts`` x ``resources``."""
    raw = load_bounded(data, MAX_SUMMARY_BYTES, SummaryError)
    if not isinstance(raw, dict) or raw.get("format") != SUMMARY_FORMAT:
        raise SummaryError("not a lavad pool summary")
    if raw.get("v") != SUMMARY_VERSION:
        raise SummaryError(f"summary version {raw.get('v')!r}, this lavad reads {SUMMARY_VERSION}")
    pool, owner, version = raw.get("pool"), raw.get("owner"), raw.get("version")
    if type(pool) is not int or not isinstance(owner, str) or type(version) is not int:
        raise SummaryError("pool, owner and version must be an integer, a string, an integer")
    sent_at = raw.get("sent_at")
    if not isinstance(sent_at, int | float) or isinstance(sent_at, bool):
        raise SummaryError("sent_at must be a number")
    seen = raw.get("seen_seq")
    if (
        not isinstance(seen, list)
        or len(seen) != schedulers
        or not all(type(s) is int and s >= 0 for s in seen)
    ):
        raise SummaryError(f"seen_seq: want {schedulers} counts >= 0")
    queue = raw.get("queue_length")
    if type(queue) is not int or queue < 0:
        raise SummaryError("queue_length must be a count >= 0")
    free = _counts(raw.get("free"), (hosts, resources), "free")
    usage = _counts(raw.get("tenant_usage"), (tenants, resources), "tenant_usage")
    free.setflags(write=False)
    usage.setflags(write=False)
    return PoolSummary(
        pool=pool,
        owner=owner,
        version=version,
        sent_at=float(sent_at),
        free=free,
        seen_seq=tuple(seen),
        tenant_usage=usage,
        queue_length=queue,
    )
