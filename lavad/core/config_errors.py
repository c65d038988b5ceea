"""The configuration key and reason behind a pydantic validation error.

Every place that validates a table of the configuration (the settings, the
policy and admission registries) reports the first error the same way: the
dotted key under the table's own key, and pydantic's message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class FieldError:
    """The first error of a validation: where, why, and the value given."""

    key: str
    reason: str
    value: Any
    kind: str


def first_error(exc: ValidationError, prefix: str = "") -> FieldError:
    """``prefix`` names the table validated (``policies.las``); the error's location follows."""
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    key = ".".join(part for part in (prefix, where) if part) or "<root>"
    kind, reason = first["type"], first["msg"]
    if kind == "unexpected_keyword_argument":
        # A dataclass table says so of an unknown key; a model table says
        # "extra": one wording for one mistake, whichever kind of table.
        kind, reason = "extra_forbidden", "Extra inputs are not permitted"
    return FieldError(key, reason, first.get("input"), kind)
