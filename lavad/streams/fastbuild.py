"""Fast construction of frozen schema dataclasses for the hot paths.

Adapters build several hundred thousand events a second and the engine one
decision per request; a frozen dataclass's ``__init__`` (one
``object.__setattr__`` per field) costs more than the rest of that work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def fast_constructor(cls: type[T], *names: str) -> Callable[..., T]:
    """A positional constructor for a frozen, slotted dataclass that skips its ``__init__``.

    Why: a frozen dataclass sets every field through ``object.__setattr__``
    (~0.2-0.4 us per field on a modest CPU, ~3 us for a 14-field
    ``VmRequest``), and an adapter feeding a replay of several hundred
    thousand events a second cannot afford that. The returned function fills
    an instance of a mutable twin class with the very same ``__slots__`` (plain
    attribute stores, which CPython specialises to direct slot writes) and
    then re-labels it with ``obj.__class__ = cls``, which CPython allows
    exactly when the two layouts are identical. The result *is* a ``cls``
    instance, equal, hashing, printing and serialising like one built by
    ``cls(...)``, frozen from then on. Fields not in ``names`` get their
    declared default (``default_factory`` is called per object).

    It refuses any class it could not build faithfully (no own slots, a base
    class other than ``object``, ``__post_init__``, ``init=False`` fields, a
    field without default left out) and checks one object against the real
    constructor before returning, so a schema change fails at import, never
    silently. Like ``dataclasses`` itself, it generates the function's source.
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__} must derive from object alone")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__; use its constructor")
    fields = dataclasses.fields(cls)
    known = {f.name for f in fields}
    unknown = [name for name in names if name not in known]
    if unknown or len(set(names)) != len(names):
        raise TypeError(f"{cls.__name__}: bad field names {list(names)}")
    slots = tuple(cls.__dict__["__slots__"])
    if slots != tuple(f.name for f in fields):
        raise TypeError(f"{cls.__name__}: slots {slots} are not its fields")
    twin = type(f"_Mutable{cls.__name__}", (), {"__slots__": slots})
    namespace: dict[str, Any] = {
        "_lavad_new": object.__new__,
        "_lavad_twin": twin,
        "_lavad_cls": cls,
    }
    body = [f"def build({', '.join(names)}):", "    _lavad_obj = _lavad_new(_lavad_twin)"]
    for f in fields:
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name} is an init=False field")
        if f.name in names:
            value = f.name
        elif f.default is not dataclasses.MISSING:
            namespace[f"_lavad_default_{f.name}"] = f.default
            value = f"_lavad_default_{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_lavad_factory_{f.name}"] = f.default_factory
            value = f"_lavad_factory_{f.name}()"
        else:
            raise TypeError(f"{cls.__name__}.{f.name} has no default: pass it")
        body.append(f"    _lavad_obj.{f.name} = {value}")
    body += ["    _lavad_obj.__class__ = _lavad_cls", "    return _lavad_obj"]
    exec("\n".join(body), namespace)
    build: Callable[..., T] = namespace["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    probes = [object() for _ in names]  # distinct markers: equal only to themselves
    if build(*probes) != cls(**dict(zip(names, probes, strict=True))):
        raise TypeError(f"{cls.__name__}: the fast constructor disagrees with __init__")
    return build
