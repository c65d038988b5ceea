"""Policy variants written ``name`` or ``name:key=value;key=value``: a registered
policy with its configured arguments overridden, for studies that compare them.

A value is JSON where it parses as JSON (``0.5``, ``false``, ``null``), else a
bare word; ``categorical=declared`` names the features the adapters declare,
and other lists are ``a|b``.
"""

from __future__ import annotations

import orjson

from lavad.daemon.settings import Settings
from lavad.models.lifetime.features import DECLARED_CATEGORICAL


def parse_value(key: str, raw: str) -> object:
    """One argument's value from its text, as the module says."""
    if key == "categorical":
        return list(DECLARED_CATEGORICAL) if raw == "declared" else [v for v in raw.split("|") if v]
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw  # a bare word: a string argument


def parse_variant(spec: str) -> tuple[str, dict[str, object]]:
    """The policy's name and its overridden arguments."""
    name, _, rest = spec.partition(":")
    args: dict[str, object] = {}
    for item in filter(None, rest.split(";")):
        key, _, raw = item.partition("=")
        args[key.strip()] = parse_value(key.strip(), raw.strip())
    return name, args


def with_variant(settings: Settings, name: str, args: dict[str, object]) -> Settings:
    """``settings`` with policy ``name``'s arguments overridden by ``args``."""
    policies = dict(settings.policies)
    policies[name] = {**policies.get(name, {}), **args}
    return settings.model_copy(update={"policies": policies})
