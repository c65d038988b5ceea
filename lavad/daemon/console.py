"""Consoles and start-up helpers shared by the command-line modules."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from lavad.daemon.config_file import ConfigError
from lavad.daemon.folders import make_writable_folder
from lavad.daemon.plotting import PlotsUnavailable, pyplot
from lavad.streams.seeds import MAX_SEED, MIN_SEED

if TYPE_CHECKING:
    from lavad.daemon.settings import Settings

# A pipe or a file gets the whole table, not one squeezed to 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def settings_or_exit(config: Path | None, *, live: bool = False) -> Settings:
    """The settings, or exit 2 with the key and the reason.

    ``live``: also refuse what only ``lavad run`` cannot run (the oracles);
    ``lavad run`` and ``lavad config check`` pass it, so they agree.
    """
    # Here, not at the top: the settings bring the policy registries and the
    # engine, which the federation's processes print through this module
    # without needing (``launcher.py``).
    from lavad.daemon.settings import check_live_settings, load_settings  # noqa: PLC0415

    try:
        settings = load_settings(config)
        if live:
            check_live_settings(settings)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    return settings


def writable_or_exit(option: str, *paths: Path | None) -> None:
    """Exit 2 with the option and the reason unless each file of ``paths`` can be
    written (None: not asked for): checked before the work, not after a replay of
    minutes. Makes a missing parent folder, as writing it would; leaves no file."""
    for path in paths:
        if path is None:
            continue
        if path.is_dir():
            raise fail(f"{option} {path}: is a folder; want a file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = exc.strerror or exc
            raise fail(f"{option} {path}: its folder cannot be made ({reason})") from None
        try:
            existed = path.exists()
            with path.open("ab"):
                pass
            if not existed:
                path.unlink()
        except OSError as exc:
            raise fail(f"{option} {path}: cannot be written ({exc.strerror or exc})") from None


def plot_or_exit(option: str, path: Path | None) -> None:
    """``writable_or_exit``, and exit 2 if matplotlib is missing: before the work."""
    writable_or_exit(option, path)
    if path is not None:
        try:
            pyplot()
        except PlotsUnavailable as exc:
            raise fail(str(exc)) from None


def folder_or_exit(option: str, path: Path | None) -> None:
    """Exit 2 with the option and the reason unless ``path`` is, or can be made, a
    folder files can be written in."""
    if path is None:
        return
    try:
        make_writable_folder(path)
    except OSError as exc:
        raise fail(f"{option} {path}: cannot hold files ({exc.strerror or exc})") from None


def seed_option(help: str) -> Any:
    """A ``--seed`` option taking only a seed lavad can write back out (``streams.seeds``)."""
    return typer.Option(help=help, min=MIN_SEED, max=MAX_SEED)


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


def shows_progress(enabled: bool) -> bool:
    """Whether a replay draws its bar: asked for, on a terminal (piped, it prints a summary)."""
    return enabled and sys.stderr.isatty()


@contextlib.contextmanager
def replay_progress(label: str, enabled: bool) -> Iterator[Callable[[int, float], None]]:
    """A bar on stderr while a replay runs (where ``shows_progress``), gone when it ends.

    Yields the callback ``replay`` reports its event count and trace clock to.
    """
    with Progress(
        TextColumn(f"[bold]{label}[/bold]"),
        BarColumn(),
        TextColumn("{task.completed:,} events"),
        TextColumn("trace t={task.fields[clock]:,.0f}s"),
        TimeElapsedColumn(),
        console=err,
        disable=not shows_progress(enabled),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None, clock=0.0)

        def tick(count: int, clock: float) -> None:
            bar.update(task, completed=count, clock=max(clock, 0.0))

        yield tick
