"""No oracle field ever reaches a learned lifetime model or the placements it drives.

A replay attaches each VM's true lifetime to its request (``ORACLE_FEATURE``)
for the oracle policies. The learned policies run here on the same requests
with the true lifetime, with a scrambled one and with none: every placement,
every prediction and every life table must be the same. The oracle policy
on the same requests does place differently, so the comparison is sensitive
to what the true lifetime would change.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest
from lavad.core.placement.lava import LavaHosts
from lavad.core.placement.lifetime import LifetimeTracker
from lavad.core.placement.registry import (
    PolicyConfigError,
    build_policy,
    validate_policy_args,
)
from lavad.models.lifetime.features import (
    DECLARED_CATEGORICAL,
    ORACLE_FEATURE,
    ORACLE_FIELDS,
    USED_FEATURES,
)
from lavad.streams.adapters.registry import FORMATS
from lavad.streams.schema import VmRequest

QOS = ("LS", "BE", "Burstable")
ROLES = ("prefill", "decode")


def _workload(n: int) -> list[tuple[float, float, float, dict[str, object]]]:
    """(arrival, lifetime, cores, features) with lifetimes that depend on qos and role."""
    rng = np.random.default_rng(11)
    out = []
    t = 0.0
    for _ in range(n):
        t += float(rng.exponential(300.0))
        qos = QOS[int(rng.integers(3))]
        role = ROLES[int(rng.integers(2))]
        scale = {"LS": 30_000.0, "BE": 900.0, "Burstable": 5_000.0}[qos]
        lifetime = float(rng.exponential(scale)) + 60.0
        cores = float(rng.choice([1.0, 2.0, 4.0]))
        features: dict[str, object] = {
            "qos": qos,
            "role": role,
            "gpu_spec": "",
            "hour_of_day": int(t // 3600) % 24,
            "batch_size": 1,
        }
        out.append((t, lifetime, cores, features))
    return out


def _replay(
    policy_name: str, args: dict[str, Any], oracle: str
) -> tuple[list[int | None], LifetimeTracker]:
    """Place the workload; ``oracle`` is "true", "scrambled" or "absent"."""
    cluster = ClusterState()
    for h in range(20):
        cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
    policy = build_policy(
        policy_name, validate_policy_args(policy_name, args), np.random.default_rng(3)
    )
    hooks = policy.hooks
    assert hooks is not None
    workload = _workload(400)
    exits: list[tuple[float, str]] = []
    hosts: list[int | None] = []
    for i, (now, lifetime, cores, features) in enumerate(workload):
        for when, vm in sorted(exits):
            if when <= now and vm in cluster.vms:
                if now >= hooks.next_deadline:
                    hooks.advance(cluster, when)
                hooks.on_released(cluster, cluster.release(vm), when, exited=True)
        exits = [(w, v) for w, v in exits if v in cluster.vms]
        if now >= hooks.next_deadline:
            hooks.advance(cluster, now)
        attached = dict(features)
        if oracle == "true":
            attached[ORACLE_FEATURE] = lifetime
        elif oracle == "scrambled":
            attached[ORACLE_FEATURE] = 1e7 / lifetime
        event = VmRequest(
            time=now,
            pool="p",
            vm_id=f"v{i}",
            cores=cores,
            memory_gib=2 * cores,
            features=attached,
        )
        request = PlacementRequest(f"v{i}", (cores, 2 * cores, 0.0, 0.0), "", None, now, event)
        result = policy.place(cluster, request)
        if isinstance(result, Placed):
            record = cluster.book(f"v{i}", result.host, request.demand, "", now)
            hooks.on_booked(cluster, record, now, event)
            exits.append((now + lifetime, f"v{i}"))
            hosts.append(result.host)
        else:
            hosts.append(None)
    tracker = hooks.tracker if isinstance(hooks, LavaHosts) else hooks
    assert isinstance(tracker, LifetimeTracker)
    return hosts, tracker


VARIANTS = [
    ("las", {}),
    ("las", {"scoring": "quantiles"}),
    ("las", {"categorical": list(DECLARED_CATEGORICAL)}),
    ("las", {"scoring": "quantiles", "categorical": list(DECLARED_CATEGORICAL)}),
    ("lava", {"scoring": "quantiles", "categorical": list(DECLARED_CATEGORICAL)}),
    ("la-binary", {"categorical": list(DECLARED_CATEGORICAL)}),
    # The shrunk model, sibling evidence and forgetting read nothing more.
    ("las", {"model": "shrunk", "siblings": True, "half_life_s": 86_400.0}),
    ("lava", {"model": "shrunk", "categorical": list(DECLARED_CATEGORICAL)}),
]


@pytest.mark.parametrize(("name", "args"), VARIANTS)
def test_oracle_lifetime_changes_no_learned_decision(name: str, args: dict[str, Any]) -> None:
    absent, model = _replay(name, args, "absent")
    for oracle in ("true", "scrambled"):
        hosts, other = _replay(name, args, oracle)
        assert hosts == absent
        np.testing.assert_array_equal(other.model.mass, model.model.mass)
        np.testing.assert_array_equal(other.slots.predicted_exit, model.slots.predicted_exit)
    # The learned model did learn (refits ran, groups filled): not a vacuous pass.
    assert model.model.observations.max() >= 30


def test_the_oracle_policy_places_differently() -> None:
    learned, _ = _replay("las", {}, "true")
    oracle, _ = _replay("las-oracle", {}, "true")
    assert learned != oracle


@pytest.mark.parametrize("field", sorted(ORACLE_FIELDS | set(USED_FEATURES)))
def test_an_oracle_field_cannot_be_a_categorical_feature(field: str) -> None:
    with pytest.raises(PolicyConfigError, match="categorical"):
        validate_policy_args("las", {"categorical": [field]})


def test_every_declared_vm_feature_reaches_the_model() -> None:
    """Each adapter's request features are read: numeric ones, or as categories."""
    for trace in FORMATS.values():
        for feature in trace.vm_features:
            assert feature in USED_FEATURES or feature in DECLARED_CATEGORICAL, feature
            assert feature not in ORACLE_FIELDS
