"""``lavad report INPUT.json... --out report.html``: the page a person would rather look at."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lavad.daemon.console import fail, out, writable_or_exit
from lavad.daemon.plotting import PlotsUnavailable
from lavad.evaluation.report_html import ReportInputError, build_report


def report_command(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="JSON outputs of lavad: replay --metrics-json, shadow replay, evaluate"
            " lifetime/limits --json, evaluate gpa's *-gpa.json"
        ),
    ],
    out_path: Annotated[Path, typer.Option("--out", help="the HTML file")] = Path(
        "lavad-report.html"
    ),
    title: Annotated[str, typer.Option(help="the page's title")] = "lavad report",
) -> None:
    """One self-contained HTML page (plots inlined, no network) from lavad's JSON outputs."""
    writable_or_exit("--out", out_path)
    for path in inputs:
        if not path.is_file():
            raise fail(f"{path}: no such file")
    try:
        page = build_report(inputs, title)
    except ReportInputError as exc:
        raise fail(str(exc)) from None
    except PlotsUnavailable as exc:
        raise fail(str(exc)) from None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(page, encoding="utf-8")
    out.print(f"report written to {out_path} ({out_path.stat().st_size:,} bytes)")
