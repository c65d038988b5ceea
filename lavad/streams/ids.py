"""Decision ids: deterministic, readable, and unambiguous for any strings.

A consumer drops duplicates by ``decision_id`` (delivery is at least once),
so two different decisions must never share an id. Ids are ``/``-joined
parts, and the parts come from the input (pool names, VM ids, host ids), which
may themselves hold ``/``: pool ``p`` with VM ``a/b`` and pool ``p/a`` with VM
``b`` would both give ``placement/p/a/b``. So every part taken from the input
is percent-encoded (RFC 3986 style, UTF-8, ``surrogatepass`` so even a lone
surrogate round-trips): ``/`` becomes ``%2F`` and ``%`` itself ``%25``, so no
part holds a ``/`` and the split back into parts is unique. Control
characters, spaces and non-ASCII characters are encoded too, so an id is
printable ASCII whatever it names; the common ids (``az-12-3``, ``h00015``,
``default``) have nothing to encode and stay as they were.

Each kind has a fixed number of parts, and a kind's optional suffix
(``retry1``, ``evict2``) is its own part, so a VM named ``x/retry1`` can no
longer pass for the first retry of VM ``x``.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote

# Characters left as they are: unreserved (RFC 3986) plus a few that ids
# commonly hold. ``/`` and ``%`` are not among them: that is the point.
_SAFE: Final = "-._~:@+=,"
_PLAIN: Final = re.compile(r"[A-Za-z0-9\-._~:@+=,]*")


def part(value: str) -> str:
    """One id part from an input string: ``/``-free, and different strings stay different."""
    if _PLAIN.fullmatch(value):
        return value  # the usual case: nothing to encode, no work
    return quote(value, safe=_SAFE, encoding="utf-8", errors="surrogatepass")


def placement_id(pool: str, vm_id: str, suffix: str = "") -> str:
    """``placement/<pool>/<vm>``, or ``.../<suffix>`` for a VM's later placements.

    The first request of a VM has no suffix, so a redelivered request yields
    the same id. ``suffix`` is built by lavad (``retry1``, ``evict1``,
    ``replace1``), never taken from the input.
    """
    base = f"placement/{part(pool)}/{part(vm_id)}"
    return f"{base}/{suffix}" if suffix else base


def reprediction_id(pool: str, subject: str, subject_id: str, sequence: int) -> str:
    """The pool's ``sequence``-th reprediction, of a VM or a host."""
    return f"reprediction/{part(pool)}/{subject}/{part(subject_id)}/{sequence}"


def admission_id(pool: str, deployment_id: str, sequence: int) -> str:
    return f"admission/{part(pool)}/{part(deployment_id)}/{sequence}"


def migration_id(pool: str, host_id: str, sequence: int) -> str:
    return f"migration/{part(pool)}/{part(host_id)}/{sequence}"


def limit_id(pool: str, vm_id: str, resource: str, digest: str) -> str:
    """``digest`` is the recommender's hex digest of the decision's own tuple."""
    return f"limit/{part(pool)}/{part(vm_id)}/{resource}/{digest}"


def replicas_id(pool: str, deployment_id: str, digest: str) -> str:
    """``digest`` is the tracker's hex digest of the decision's own tuple (as for limits)."""
    return f"replicas/{part(pool)}/{part(deployment_id)}/{digest}"
