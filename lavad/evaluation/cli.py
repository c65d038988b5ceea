"""``lavad evaluate ...``: the offline studies' commands, as one typer app."""

from __future__ import annotations

import typer

from lavad.evaluation.admission_cli import admission_command
from lavad.evaluation.federation_cli import federation_command
from lavad.evaluation.gpa_cli import gpa_command
from lavad.evaluation.lifetime_cli import lifetime_command
from lavad.evaluation.limits_cli import horizontal_command, limits_command, limits_sweep_command
from lavad.evaluation.migrations_cli import migrations_command
from lavad.evaluation.placement_cli import placement_command
from lavad.evaluation.progress import track_evaluation

evaluate_app = typer.Typer(
    help="Evaluate lavad's models and policies on recorded traces.",
    no_args_is_help=True,
    # A spinner on a terminal, one summary line when piped (progress.py).
    callback=track_evaluation,
)
# In the order ``lavad evaluate --help`` lists them.
for name, command in (
    ("lifetime", lifetime_command),
    ("placement", placement_command),
    ("admission", admission_command),
    ("gpa", gpa_command),
    ("limits", limits_command),
    ("limits-sweep", limits_sweep_command),
    ("horizontal", horizontal_command),
    ("migrations", migrations_command),
    ("federation", federation_command),
):
    evaluate_app.command(name)(command)
