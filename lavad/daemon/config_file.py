"""Reading a configuration file: its error, its tables' base, and checked values.

Shared by the daemon's settings (``settings.py``) and the federation's
(``federation/settings.py``), without the policy registries and the engine
the daemon's settings import: a federation process starts without them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from lavad.core.config_errors import KeyedError, first_error


class ConfigError(KeyedError):
    template = "configuration error at {key}: {reason}"


class Section(BaseModel):
    """A table of the file: unknown keys refused, values frozen, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_Model = TypeVar("_Model", bound=BaseModel)


def read_config_file(path: Path) -> dict[str, Any]:
    """The TOML file at ``path``; ``ConfigError`` when it is missing or not TOML."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), "configuration file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None


def validate_config(model: type[_Model], values: dict[str, Any]) -> _Model:
    """``model(**values)``, its first validation error raised as a ``ConfigError``."""
    try:
        return model(**values)
    except ValidationError as exc:
        error = first_error(exc)
        # An unknown key may be a misspelt secret, and a secret of the wrong
        # type is still a secret: neither value is shown.
        if error.kind == "extra_forbidden" or is_secret(error.key):
            raise ConfigError(error.key, error.reason) from None
        raise ConfigError(error.key, f"{error.reason} (got {_shown(error.value)})") from None


# A refused value is shown so its key can be mended, but a table of a thousand
# entries (or a megabyte string) would bury the reason: only its start is shown.
_SHOWN_CHARS = 200


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) <= _SHOWN_CHARS:
        return text
    return f"{text[:_SHOWN_CHARS]}... ({len(text):,} characters)"


def is_secret(key: str) -> bool:
    """Whether a key names a secret, whose value an error must not show."""
    return any(word in key for word in ("password", "secret", "token"))
