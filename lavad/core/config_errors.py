"""The configuration key and reason behind a pydantic validation error.

Every place that validates a table of the configuration (the settings, the
policy and admission registries) reports the first error the same way: the
dotted key under the table's own key, and pydantic's message; and raises it
as a ``KeyedError``.
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


class KeyedError(Exception):
    """An error located by a configuration key, with its reason.

    It pickles from its key and reason, as raised: an error in a worker
    process (the placement matrix's cells) crosses back whole, where the
    default pickling (from the message alone) breaks the process pool.
    """

    # How the message reads; ``key`` and ``reason`` fill it.
    template = "{key}: {reason}"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(self.template.format(key=key, reason=reason))
        self.key = key
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.reason))
