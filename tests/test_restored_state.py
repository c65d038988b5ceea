"""Restored state is checked before compiled code indexes it.

The lifetime tracker (``placement/tracker_state.py``) and the cluster
(``ClusterState.check_restored``), run by the snapshot codec on restore.

A snapshot's checksum catches damage, not intent: a crafted snapshot with a
valid checksum could hold a slot's neighbour or group row past its array's
end, which numba would follow without a bounds check. Each case below
damages one field of a real tracker (a LAS pool after 3,000 events of the
Azure slice) and expects the check to name it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from live_support import AZURE_SLICE, PROJECT_ROOT

from lavad.core.cluster import ClusterState
from lavad.core.engine import Engine
from lavad.core.placement.kernels import HEAD, HOLDER, HOST, NEXT_ON_HOST, PREV_ON_HOST, ROW
from lavad.core.placement.lifetime import LifetimeTracker
from lavad.daemon.live.state_codec import Registry, StateCodecError, dumps, loads
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord


def _engine() -> Engine:
    config = load_settings(PROJECT_ROOT / "config" / "lavad.toml").engine_config(
        "las", trace_has_hosts=False
    )
    engine = Engine(config)
    events = open_trace(AZURE_SLICE, seed=0, pool="east").events()
    for event in itertools.islice(events, 3_000):
        if not isinstance(event, BadRecord):
            engine.handle(event, event.time)
    return engine


def _tracker() -> LifetimeTracker:
    tracker = _engine().pools["east"].policy.hooks
    assert isinstance(tracker, LifetimeTracker)
    assert tracker.slots.alive.any()
    return tracker


@pytest.fixture(scope="module")
def pristine() -> bytes:
    return dumps(_tracker())


def _first_alive(tracker: LifetimeTracker) -> int:
    return int(np.flatnonzero(tracker.slots.alive)[0])


def _slots(tracker: LifetimeTracker) -> int:
    return int(tracker.slots.ints.shape[1])


Damage = Callable[[Any], None]

CASES: list[tuple[str, Damage, str]] = [
    (
        "next VM past the last slot",
        lambda t: t.slots.ints.__setitem__((NEXT_ON_HOST, 0), _slots(t)),
        "next VM on its host",
    ),
    (
        "previous VM below -1",
        lambda t: t.slots.ints.__setitem__((PREV_ON_HOST, 0), -2),
        "previous VM on its host",
    ),
    (
        "a slot's host past the last host",
        lambda t: t.slots.ints.__setitem__((HOST, 0), t.hosts.ints.shape[1]),
        "a slot's host",
    ),
    (
        "a host's first VM past the last slot",
        lambda t: t.hosts.ints.__setitem__((HEAD, 0), 10**9),
        "a host's first VM",
    ),
    (
        "a host's holder past the last slot",
        lambda t: t.hosts.ints.__setitem__((HOLDER, 0), _slots(t)),
        "latest-exit VM",
    ),
    (
        "a running VM's row past the model's tables",
        lambda t: t.slots.ints.__setitem__((ROW, _first_alive(t)), len(t.model.mass)),
        "a running VM's row",
    ),
    (
        "a running VM's group row past the model's counts",
        lambda t: t.levels.__setitem__((_first_alive(t), 0), len(t.model.deaths)),
        "group rows",
    ),
    (
        "slot ints of another dtype",
        lambda t: setattr(t.slots, "ints", t.slots.ints.astype(np.float64)),
        "slot ints",
    ),
    (
        "host times one row short",
        lambda t: setattr(t.hosts, "times", t.hosts.times[:-1].copy()),
        "host times",
    ),
    (
        "slot flags of fewer slots",
        lambda t: setattr(t.slots, "flags", t.slots.flags[:, :-1].copy()),
        "slot flags",
    ),
    (
        "a free slot past the last slot",
        lambda t: t._free.append(_slots(t)),
        "free slot",
    ),
]


def test_a_tracker_as_saved_passes_and_round_trips(pristine: bytes) -> None:
    restored = loads(pristine)
    assert isinstance(restored, LifetimeTracker)
    restored.check_restored()
    assert dumps(restored) == pristine


@pytest.mark.parametrize(
    ("damage", "reason"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_damaged_tracker_is_refused_with_the_field_named(
    pristine: bytes, damage: Damage, reason: str
) -> None:
    tracker = loads(pristine)
    damage(tracker)
    with pytest.raises(ValueError, match=reason):
        tracker.check_restored()
    # Restored from a snapshot that holds the damage, the codec refuses it.
    with pytest.raises(StateCodecError, match=reason):
        loads(dumps(tracker))


CLUSTER_CASES: list[tuple[str, Damage, str]] = [
    ("more hosts than columns", lambda c: setattr(c, "n_hosts", c._columns + 1), "n_hosts"),
    ("a free array one column short", lambda c: setattr(c, "free", c.free[:, :-1].copy()), "free"),
    (
        "VM counts as floats",
        lambda c: setattr(c, "vm_count", c.vm_count.astype(np.float64)),
        "vm_count",
    ),
    ("a host id missing", lambda c: c.host_ids.pop(), "host ids"),
    # The deployment affinity writes its levels at a deployment's hosts.
    (
        "a deployment on a host past the pool",
        lambda c: _deployment_on(c, c.n_hosts, lambda stamp: (stamp, 0, 0)),
        "out of range",
    ),
    (
        "a deployment's last change stamped after the pool's",
        lambda c: _deployment_on(c, 0, lambda stamp: (stamp + 1, 0, 0)),
        "out of order",
    ),
    (
        "a deployment's last change as a list",
        lambda c: _deployment_on(c, 0, lambda stamp: [stamp, 0, 0]),
        "wrong form",
    ),
    (
        "a deployment counting no VM on its host",
        lambda c: _deployment_on(c, 0, lambda stamp: (stamp, 0, 0), count=0),
        "count below 1",
    ),
    (
        "a deployment's hosts as a list",
        lambda c: _deployment_on(c, 0, lambda stamp: (stamp, 0, 0), hosts=[0]),
        "holds no host",
    ),
    (
        "a deployment without its last change",
        lambda c: c.deployment_hosts.setdefault("new", {0: 1}),
        "other deployments",
    ),
]


def _deployment_on(
    cluster: ClusterState,
    host: int,
    change: Callable[[int], Any],
    *,
    count: int = 1,
    hosts: Any = None,
) -> None:
    """A deployment "new" with ``count`` VMs on ``host`` (or the given ``hosts``), its
    last change ``change`` of the pool's stamp."""
    cluster._membership_stamp += 1
    cluster.deployment_hosts["new"] = {host: count} if hosts is None else hosts
    cluster.deployment_changes["new"] = change(cluster._membership_stamp)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(c[1], c[2]) for c in CLUSTER_CASES],
    ids=[c[0] for c in CLUSTER_CASES],
)
def test_a_damaged_cluster_is_refused_with_the_field_named(damage: Damage, reason: str) -> None:
    cluster = loads(dumps(_engine().pools["east"].cluster))
    assert isinstance(cluster, ClusterState)
    cluster.check_restored()
    damage(cluster)
    with pytest.raises(StateCodecError, match=reason):
        loads(dumps(cluster))


class _SelfChecking:
    """A class whose instances say whether they were restored whole."""

    def __init__(self, parts: int) -> None:
        self.parts = parts

    def check_restored(self) -> None:
        if self.parts < 0:
            raise ValueError(f"{self.parts} parts")


def test_the_codec_runs_each_restored_objects_own_check() -> None:
    registry = Registry({"tests._SelfChecking": _SelfChecking}, {})
    assert loads(dumps(_SelfChecking(3), registry), registry).parts == 3
    with pytest.raises(StateCodecError, match="_SelfChecking is inconsistent: -1 parts"):
        loads(dumps(_SelfChecking(-1), registry), registry)
