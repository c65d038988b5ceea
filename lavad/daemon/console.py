"""Consoles and start-up helpers shared by the command-line modules."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from lavad.daemon.settings import ConfigError, Settings, check_live_settings, load_settings

# A pipe or a file gets the whole table, not one squeezed to 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def settings_or_exit(config: Path | None, *, live: bool = False) -> Settings:
    """The settings, or exit 2 with the key and the reason.

    ``live``: also refuse what only ``lavad run`` cannot run (the oracles);
    ``lavad run`` and ``lavad config check`` pass it, so they agree.
    """
    try:
        settings = load_settings(config)
        if live:
            check_live_settings(settings)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    return settings


def print_error(message: str) -> None:
    """``lavad: message`` in red on stderr, the message printed as written.

    Escaped because rich reads ``[...]`` as markup: unescaped, the hint
    ``pip install 'lavad[evaluation]'`` printed as ``pip install 'lavad'`` and
    a configuration error lost its ``[table]`` name.
    """
    err.print(f"[red]lavad: {escape(message)}[/red]")


def fail(message: str) -> typer.Exit:
    print_error(message)
    return typer.Exit(2)
