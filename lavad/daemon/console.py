"""Consoles and start-up helpers shared by the command-line modules."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

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
        err.print(f"[red]lavad: {exc}[/red]")
        raise typer.Exit(2) from None
    return settings


def fail(message: str) -> typer.Exit:
    err.print(f"[red]lavad: {message}[/red]")
    return typer.Exit(2)
