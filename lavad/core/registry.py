"""One shape for everything the configuration chooses by name.

Placement and admission policies, limit recommenders, migration orders and
lifetime sources are each a ``Registry``: entries of a name, a one-line
summary, a pydantic model of the arguments (validated at start-up, so a bad
key stops lavad naming it) and a factory. The configuration's allowed names
come from the registry, ``lavad policies`` lists every registry, and nothing
chooses by name with an if/elif chain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from lavad.core.config_errors import KeyedError, first_error

Built = TypeVar("Built")


class NoArgs(BaseModel):
    """The arguments of an entry that takes none: any key is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RegistryError(KeyedError, ValueError):
    """A name the registry does not hold, or arguments its entry refuses; ``key`` locates it."""


@dataclass(frozen=True, slots=True)
class Entry(Generic[Built]):
    name: str
    summary: str
    # Called with the validated arguments and the caller's context (a
    # resource, a generator of draws...): the registry's ``build`` says which.
    factory: Callable[..., Built]
    args: type[BaseModel] = NoArgs


class Registry(Generic[Built]):
    """Named entries of one kind (``kind`` names it in errors and in ``lavad policies``)."""

    def __init__(self, kind: str, entries: list[Entry[Built]]) -> None:
        names = [entry.name for entry in entries]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"{kind}: entries named twice: {', '.join(duplicates)}")
        self.kind = kind
        self._entries = {entry.name: entry for entry in entries}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[Built]]:
        return iter(self._entries.values())

    def entry(self, name: str, key: str) -> Entry[Built]:
        found = self._entries.get(name)
        if found is None:
            raise RegistryError(
                key, f"unknown {self.kind} {name!r}; known: {', '.join(self._entries)}"
            )
        return found

    def validate(self, name: str, args: Mapping[str, Any], key: str) -> BaseModel:
        """``name``'s validated arguments; ``key`` names the table they came from."""
        entry = self.entry(name, key)
        try:
            return entry.args.model_validate(dict(args))
        except ValidationError as exc:
            error = first_error(exc, key)
            raise RegistryError(error.key, error.reason) from None

    def build(self, name: str, args: BaseModel | None = None, *context: Any) -> Built:
        """The entry's product from validated arguments (none: the defaults) and context."""
        entry = self.entry(name, self.kind)
        return entry.factory(args if args is not None else entry.args(), *context)

    def check(self, name: str) -> str:
        """``name`` when the registry holds it (a validator for configuration fields)."""
        self.entry(name, self.kind)
        return name
