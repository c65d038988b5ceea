"""A snapshot's layout cannot change under the same SNAPSHOT_VERSION.

Snapshots hold the engine's objects field by field (``state_codec``), private
fields included, so renaming a field, changing its type or adding one changes
what a snapshot means. Each setup below replays the start of a bundled slice
and records, for every class the codec writes, its fields and the kinds of
value they held; the fingerprint of that layout is recorded beside
SNAPSHOT_VERSION (``lavad/daemon/live/snapshots.py``) and the layout itself in
``tests/snapshot_layout.json``, so that a failure can say what moved.

After a deliberate layout change: bump SNAPSHOT_VERSION (saying why in its
comment), then run this file with RECORD_SNAPSHOT_LAYOUT=1 and copy the
fingerprint its failure names into SNAPSHOT_LAYOUT.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import itertools
import os
import types
from collections.abc import Iterable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from replicas_support import slice_events
from support import PROJECT_ROOT

from lavad.core.engine import Engine
from lavad.core.limits.service import RECOMMENDER_REGISTRY, LimitsConfig
from lavad.core.placement.lifetime import LIFETIME_MODELS
from lavad.core.placement.registry import REGISTRY, needs_true_lifetimes
from lavad.daemon.live.snapshots import SNAPSHOT_LAYOUT, SNAPSHOT_VERSION
from lavad.daemon.live.state_codec import Registry, default_registry
from lavad.daemon.settings import Settings, load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.schema import (
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
    UsageSample,
)

RECORDED = Path(__file__).with_name("snapshot_layout.json")
RECORD = os.environ.get("RECORD_SNAPSHOT_LAYOUT") == "1"
AZURE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"
GOOGLE_LIMITS = PROJECT_ROOT / "data" / "google-2011-gcd-limits-slice"
VM_EVENTS = 3_000
USAGE_EVENTS = 20_000
# Containers are described this deep (a list of tuples of numbers: 3).
DEPTH = 3

_CONTAINERS: dict[type, str] = {
    list: "list",
    tuple: "tuple",
    set: "set",
    frozenset: "frozenset",
    collections.deque: "deque",
}
_MAPPINGS: dict[type, str] = {
    dict: "dict",
    collections.Counter: "Counter",
    collections.defaultdict: "defaultdict",
    collections.OrderedDict: "OrderedDict",
}

Layout = dict[str, dict[str, list[str]]]


class _Walker:
    """Every object a snapshot of ``value`` writes: class -> field -> kinds of value held."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.layout: dict[str, dict[str, set[str]]] = {}
        self.seen: set[int] = set()
        self.queue: list[object] = []

    def walk(self, value: object) -> None:
        self.kinds(value, 0)
        while self.queue:
            self._object(self.queue.pop())

    def _object(self, value: object) -> None:
        kind = type(value)
        name = self.registry.class_name(kind)
        if name is None:
            raise TypeError(f"{kind.__qualname__} is not a codec type (the codec refuses it too)")
        fields = self.layout.setdefault(name, {})
        slots, has_dict = self.registry.layout(kind)
        items = [(s, object.__getattribute__(value, s)) for s in slots if hasattr(value, s)]
        if has_dict:
            items += list(vars(value).items())
        for field, item in items:
            fields.setdefault(field, set()).update(self.kinds(item, 0))

    def kinds(self, value: Any, depth: int) -> set[str]:
        kind = type(value)
        if value is None:
            return {"None"}
        if kind is bool or isinstance(value, np.bool_):
            return {"bool"}
        if kind in (int, float) or isinstance(value, np.number):
            return {"number"}  # ints and floats mix in one field; the codec keeps each
        if kind in (str, bytes):
            return {kind.__name__}
        if isinstance(value, type):
            return {"class"}
        if isinstance(value, types.FunctionType | types.BuiltinFunctionType):
            return {"function"}
        if kind is np.ndarray:
            return {f"ndarray {value.dtype.str} {value.ndim}d"}
        if isinstance(value, np.random.Generator | np.random.BitGenerator):
            return {kind.__name__}
        if isinstance(value, enum.Enum):
            return {f"enum {kind.__qualname__}"}
        label = _CONTAINERS.get(kind) or _MAPPINGS.get(kind)
        if label is None:  # an object: described by its own entry
            if id(value) not in self.seen:
                self.seen.add(id(value))
                self.queue.append(value)
            return {self.registry.class_name(kind) or kind.__qualname__}
        found = {label}
        if depth >= DEPTH:
            return found
        if kind in _MAPPINGS:
            for key, item in value.items():
                found.update(f"{label} key {k}" for k in self.kinds(key, depth + 1))
                found.update(f"{label} value {k}" for k in self.kinds(item, depth + 1))
        else:
            for item in value:
                found.update(f"{label} of {k}" for k in self.kinds(item, depth + 1))
        return found


def _merged(layouts: Iterable[dict[str, dict[str, set[str]]]]) -> Layout:
    merged: dict[str, dict[str, set[str]]] = {}
    for layout in layouts:
        for name, fields in layout.items():
            into = merged.setdefault(name, {})
            for field, kinds in fields.items():
                into.setdefault(field, set()).update(kinds)
    # A field seen both empty and holding something is an optional one: what it holds.
    return {
        name: {
            field: sorted(kinds - {"None"} if kinds - {"None"} else kinds)
            for field, kinds in sorted(fields.items())
        }
        for name, fields in sorted(merged.items())
    }


def _events(path: Path, count: int, only: type | None = None) -> list[Event]:
    events = (e for e in open_trace(path, seed=0, pool="east").events())
    kept = (e for e in events if not isinstance(e, BadRecord))
    if only is not None:
        kept = (e for e in kept if isinstance(e, only))
    return list(itertools.islice(kept, count))


def _replayed(settings: Settings, policy: str, events: list[Event], **changes: Any) -> Engine:
    engine = Engine(replace(settings.engine_config(policy, trace_has_hosts=False), **changes))
    for event in events:
        engine.handle(event, event.time)
    return engine


def _with_policy_args(settings: Settings, policy: str, **args: Any) -> Settings:
    policies = {**settings.policies, policy: {**settings.policies.get(policy, {}), **args}}
    return settings.model_copy(update={"policies": policies})


def _setups() -> Iterable[tuple[str, Engine]]:
    """One engine per snapshot-bearing choice a live configuration can make."""
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    vms = _events(AZURE, VM_EVENTS)
    # Oracle policies never run live (check_live_settings), so never snapshot.
    for entry in REGISTRY:
        if not needs_true_lifetimes(entry.name):
            yield entry.name, _replayed(settings, entry.name, vms)
    for model in LIFETIME_MODELS:
        for policy in ("las", "lava"):
            changed = _with_policy_args(settings, policy, model=model.name)
            yield f"{policy} {model.name}", _replayed(changed, policy, vms)
    for args in ({"stranding_cost": True}, {"waste_guard": False}, {"cost_tolerance": 0.0}):
        for policy in ("las", "lava"):
            changed = _with_policy_args(settings, policy, **args)
            yield f"{policy} {args}", _replayed(changed, policy, vms)
    usage = _events(GOOGLE_LIMITS, USAGE_EVENTS, UsageSample)
    for recommender in RECOMMENDER_REGISTRY:
        limits = LimitsConfig(recommender.name, 0.05)
        yield f"limits {recommender.name}", _replayed(settings, "gpa", usage, limits=limits)
    # Replica recommendations: the horizontal scalers of real PlanetLab slices.
    replicas = LimitsConfig("off", 0.05, horizontal=True)
    yield "replicas", _replayed(settings, "bestfit", slice_events("east"), limits=replicas)
    # The zeroth moment policy: the others differ in arguments and priors, not in fields.
    admission = settings.admission.model_copy(
        update={"policy": "zeroth", "capacity_cores": 10.0, "args": {"threshold": 0.8}}
    )
    deployments: list[Event] = [
        DeploymentArrival(time=0.0, pool="east", deployment_id="a", cores=4.0),
        DeploymentArrival(time=1.0, pool="east", deployment_id="b", cores=5.0),
        DeploymentScaleOut(time=2.0, pool="east", deployment_id="a", cores=3.0),
        DeploymentScaleIn(time=3.0, pool="east", deployment_id="a", cores=1.0),
    ]
    with_admission = settings.model_copy(update={"admission": admission})
    yield "admission zeroth", _replayed(with_admission, "bestfit", deployments)


@cache
def current_layout() -> Layout:
    registry = default_registry()
    layouts = []
    for name, engine in _setups():
        walker = _Walker(registry)
        try:
            walker.walk(engine.pools)  # what a partition snapshot writes of its pools
        except TypeError as exc:
            raise AssertionError(f"{name}: {exc}") from None
        layouts.append(walker.layout)
    return _merged(layouts)


def fingerprint(layout: Layout) -> str:
    return hashlib.sha256(orjson.dumps(layout, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _differences(before: Layout, after: Layout) -> list[str]:
    lines = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            lines.append(f"  {name}: {'added' if old is None else 'gone'}")
            continue
        for field in sorted(old.keys() | new.keys()):
            if old.get(field) != new.get(field):
                lines.append(f"  {name}.{field}: {old.get(field)} -> {new.get(field)}")
    return lines


def _recorded() -> dict[str, Any]:
    if not RECORDED.exists():
        return {"version": None, "fingerprint": None, "layout": {}}
    recorded: dict[str, Any] = orjson.loads(RECORDED.read_bytes())
    return recorded


@pytest.mark.slow
def test_the_snapshot_layout_is_the_one_recorded_for_its_version() -> None:
    layout = current_layout()
    found = fingerprint(layout)
    recorded = _recorded()
    changed = _differences(recorded["layout"], layout)
    if RECORD:
        if changed and recorded["version"] == SNAPSHOT_VERSION:
            pytest.fail(
                "the layout changed but SNAPSHOT_VERSION did not: bump it (and say why in its "
                "comment) before recording\n" + "\n".join(changed)
            )
        document = {"version": SNAPSHOT_VERSION, "fingerprint": found, "layout": layout}
        RECORDED.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
        if found != SNAPSHOT_LAYOUT:
            pytest.fail(f"recorded: now set SNAPSHOT_LAYOUT = {found!r} in snapshots.py")
        return
    if found != SNAPSHOT_LAYOUT or recorded["fingerprint"] != SNAPSHOT_LAYOUT:
        bumped = recorded["version"] != SNAPSHOT_VERSION
        pytest.fail(
            f"the snapshot layout is {found}, SNAPSHOT_LAYOUT says {SNAPSHOT_LAYOUT} "
            f"(recorded for version {recorded['version']}). "
            + (
                ""
                if bumped
                else "A snapshot written before this change would load wrong: bump "
                "SNAPSHOT_VERSION in lavad/daemon/live/snapshots.py (saying why), then "
            )
            + "record the new layout: RECORD_SNAPSHOT_LAYOUT=1 pytest "
            "tests/test_snapshot_layout.py, and set SNAPSHOT_LAYOUT to the fingerprint it "
            "names. What changed:\n" + "\n".join(changed or ["  (field kinds only)"])
        )
    assert recorded["version"] == SNAPSHOT_VERSION, (
        "SNAPSHOT_VERSION was bumped with no layout change: record it "
        "(RECORD_SNAPSHOT_LAYOUT=1 pytest tests/test_snapshot_layout.py)"
    )


@pytest.mark.slow
def test_the_layout_covers_the_lifetime_tracker_and_the_limit_choice() -> None:
    # The walk reaches what earlier version bumps were about; were it to stop
    # short (a setup dropped), the fingerprint would stop guarding them.
    names = set(current_layout())
    assert any(n.endswith(".LifetimeTracker") for n in names), sorted(names)
    assert any(n.endswith(".ChoiceRecommender") for n in names), sorted(names)
    assert any(n.endswith(".SurvivalCalibrator") for n in names), sorted(names)
    assert any(n.endswith(".PoolRuntime") for n in names), sorted(names)
    assert any(".admission." in n for n in names), sorted(names)
