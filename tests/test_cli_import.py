"""The command line reads its arguments in main(), never when imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

# Run in a fresh interpreter: this one has the studies loaded for other tests.
PROBE = (
    "import sys; sys.argv = {argv!r}; import lavad.daemon.cli; "
    "print(sorted(m for m in sys.modules"
    " if m.startswith(('lavad.evaluation', 'lavad.federation'))))"
)


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        [""],
        ["lavad"],
        ["lavad", "replay"],
        ["lavad", "run", "--help"],
        ["lavad", "--bogus", "evaluate"],
        ["pytest", "-q", "tests/x.py"],
    ],
)
def test_importing_with_any_argv_does_nothing(argv: list[str]) -> None:
    done = _fresh(PROBE.format(argv=argv))
    assert done.stdout.strip() == "[]", done.stdout
    assert done.stderr == ""


def test_the_app_holds_every_command_whatever_the_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    from lavad.daemon import cli  # noqa: PLC0415

    monkeypatch.setattr(sys, "argv", ["lavad", "run"])
    names = set(typer.main.get_command(cli.build_app()).commands)
    assert {"run", "replay", "evaluate", "report", "federation", "policies"} <= names
    live = set(typer.main.get_command(cli.build_app(offline=False)).commands)
    assert names - live == {"evaluate", "report"}


def test_main_loads_the_studies_only_for_offline_commands() -> None:
    probe = (
        "import sys; from lavad.daemon.cli import main\n"
        "try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print('LOADED', any(m.startswith('lavad.evaluation') for m in sys.modules))"
    )
    live = _fresh(probe.format(args=["run", "--help"]))
    assert live.stdout.strip().endswith("LOADED False"), live.stdout
    offline = _fresh(probe.format(args=["replay", "--help"]))
    assert offline.stdout.strip().endswith("LOADED True"), offline.stdout


def test_the_federation_starts_without_the_daemons_command_line() -> None:
    """`lavad federation ...` (the console script, ``launcher.main``) loads neither the
    daemon's command line nor its settings, the engine or scipy; other commands do."""
    probe = (
        "import sys; from lavad.daemon.launcher import main\n"
        "try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "heavy = ('lavad.daemon.cli', 'lavad.daemon.settings', 'lavad.core.engine', 'scipy')\n"
        "print('LOADED', [m for m in heavy if m in sys.modules])"
    )
    federation = _fresh(probe.format(args=["federation", "--help"]))
    assert "owner" in federation.stdout and "scheduler" in federation.stdout
    assert federation.stdout.strip().endswith("LOADED []"), federation.stdout
    daemon = _fresh(probe.format(args=["run", "--help"]))
    assert "lavad.daemon.cli" in daemon.stdout.strip().splitlines()[-1], daemon.stdout
