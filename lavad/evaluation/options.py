"""Evaluation commands whose options are one frozen dataclass.

An evaluation's command line has many options; written as parameters they make
a function nobody can call by position, and they travel on as long keyword
lists. Here the options are the fields of a frozen dataclass (each field's type
``Annotated[..., typer.Option(...)]``, its default the option's default), and
``options_command`` turns it into the typer command: typer reads the same
signature it would read from a function written out by hand, so the command
line and its help do not change, and the study's code receives one object.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any, Protocol, TypeVar


class _Options(Protocol):
    """A dataclass (instance): what ``dataclasses.fields`` accepts."""

    __dataclass_fields__: typing.ClassVar[dict[str, Any]]


Options = TypeVar("Options", bound=_Options)


def options_command(options: type[Options], run: Callable[[Options], None]) -> Callable[..., None]:
    """The typer command for ``run``: its parameters are ``options``' fields, in order.

    Fields without a default (typer arguments) come first, as a dataclass
    requires anyway. The help text is ``run``'s docstring.
    """
    hints = typing.get_type_hints(options, include_extras=True)
    parameters = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=hints[field.name],
            default=(
                inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
            ),
        )
        for field in dataclasses.fields(options)
    ]

    def command(**values: Any) -> None:
        run(options(**values))

    # typer reads the parameters from the signature and their types from the
    # annotations, as it would for a function written out by hand.
    command.__signature__ = inspect.Signature(parameters, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    command.__doc__ = run.__doc__
    command.__name__ = run.__name__
    command.__qualname__ = run.__qualname__
    command.__module__ = run.__module__
    return command
