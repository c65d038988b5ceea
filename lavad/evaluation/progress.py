"""What ``lavad evaluate ...`` shows while it runs: a spinner on a terminal, a line when piped.

Each evaluation has its own loops (traces, policies, jobs, windows) and some
report their own progress; this is the floor every one of them gets: on a
terminal (stdout and stderr both), a transient spinner with the elapsed time
on stderr while the command runs; otherwise, at the end, one line on stderr
with the command and its wall time, so a log of a batch of runs says what
ran and for how long without a bar's control characters.
"""

from __future__ import annotations

import sys
import time

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from lavad.daemon.console import err


def track_evaluation(ctx: typer.Context) -> None:
    """The ``evaluate`` group's callback: runs before the chosen command, cleans up after it."""
    name = f"lavad evaluate {ctx.invoked_subcommand or ''}".strip()
    started = time.perf_counter()
    if sys.stdout.isatty() and sys.stderr.isatty():
        bar = Progress(
            SpinnerColumn(),
            TextColumn(f"[bold]{name}[/bold] running"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        )
        bar.add_task(name, total=None)
        bar.start()
        ctx.call_on_close(bar.stop)
        return

    def summary() -> None:
        failed = sys.exc_info()[0] is not None
        state = "stopped" if failed else "done"
        err.print(f"{name}: {state} in {time.perf_counter() - started:.1f} s", highlight=False)

    ctx.call_on_close(summary)
