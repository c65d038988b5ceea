"""The generated reference (docs/gen_reference.py) covers the code, and real records
validate against the JSON Schema files it publishes.

Each coverage test enumerates what lavad accepts by its own route (the settings'
JSON Schema and their environment names, the TOML default, the registries, the
command line as click sees it, the schema module's tags) and fails naming any
configuration key, command option, event type or decision kind the generated
pages leave out.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
import typer.main

from lavad.daemon.replay import replay
from lavad.daemon.settings import Settings, load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.schema import DECISION_KINDS, EVENT_TYPES

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "data" / "azure-v1-vms-slice"
CONFIG = ROOT / "config" / "lavad.toml"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", ROOT / "docs" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return _generator()


@pytest.fixture(scope="module")
def reference(gen: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    gen.generate(out)
    return out


def _rows(page: str) -> dict[str, dict[str, str]]:
    """A generated page's tables: heading -> {first cell: last cell}."""
    found: dict[str, dict[str, str]] = {}
    heading = ""
    for line in page.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            found.setdefault(heading, {})
        elif line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            found[heading][cells[0]] = cells[-1]
    return found


def _schema_keys(schema: dict[str, Any], node: dict[str, Any], prefix: str) -> set[str]:
    """Dotted keys of a settings JSON Schema (tables descended, free-form tables not)."""
    keys: set[str] = set()
    for name, prop in node.get("properties", {}).items():
        dotted = f"{prefix}{name}"
        options = prop.get("anyOf", [prop])
        refs = [o["$ref"] for o in options if "$ref" in o]
        if refs:
            target = schema["$defs"][refs[0].rsplit("/", 1)[-1]]
            keys |= _schema_keys(schema, target, dotted + ".")
        else:
            keys.add(dotted)
    return keys


def _table_heading(dotted: str) -> tuple[str, str]:
    table, _, key = dotted.rpartition(".")
    return (f"`[{table}]`" if table else "Top level"), f"`{key}`"


def test_every_configuration_key_has_an_entry_with_a_meaning(reference: Path) -> None:
    rows = _rows((reference / "configuration.md").read_text())
    keys = _schema_keys(Settings.model_json_schema(), Settings.model_json_schema(), "")
    assert len(keys) > 100
    missing = [
        k for k in sorted(keys) if _table_heading(k)[1] not in rows.get(_table_heading(k)[0], {})
    ]
    assert not missing, f"configuration keys with no reference entry: {missing}"
    unexplained = [
        k
        for k in sorted(keys)
        if not re.sub(
            r"<br>`LAVAD_[A-Z0-9_]+`", "", rows[_table_heading(k)[0]][_table_heading(k)[1]]
        ).strip()
    ]
    assert not unexplained, f"configuration keys with no meaning (add a description): {unexplained}"


def test_every_environment_variable_is_named(reference: Path) -> None:
    from lavad.daemon import settings  # noqa: PLC0415

    page = (reference / "configuration.md").read_text()
    names = settings._env_names(Settings, settings.ENV_PREFIX)
    assert names
    missing = [name for name in names if f"`{name}`" not in page]
    assert not missing, f"LAVAD_* variables the reference does not name: {missing}"


def test_every_key_of_the_default_file_has_an_entry(reference: Path) -> None:
    config = tomllib.loads(CONFIG.read_text())
    rows = _rows((reference / "configuration.md").read_text())
    args = _rows((reference / "policy-arguments.md").read_text())

    def walk(table: dict[str, Any], prefix: str) -> list[str]:
        out = []
        for key, value in table.items():
            dotted = f"{prefix}{key}"
            # policies.<name>.<argument>: an argument's value may itself be a table (weights)
            if isinstance(value, dict) and not (
                dotted.startswith("policies.") and dotted.count(".") >= 2
            ):
                out += walk(value, dotted + ".")
            else:
                out.append(dotted)
        return out

    missing = []
    for dotted in walk(config, ""):
        if dotted.startswith("policies."):
            _, policy, key = dotted.split(".", 2)
            if f"`{key}`" not in args.get(f"`{policy}`", {}):
                missing.append(dotted)
        elif _table_heading(dotted)[1] not in rows.get(_table_heading(dotted)[0], {}):
            missing.append(dotted)
    assert not missing, f"keys of config/lavad.toml with no reference entry: {missing}"


def test_every_policy_argument_has_an_entry_with_a_meaning(
    gen: ModuleType, reference: Path
) -> None:
    rows = _rows((reference / "policy-arguments.md").read_text())
    missing, unexplained = [], []
    for _heading, _where, registry in gen.registries():
        for entry in registry:
            section = rows.get(f"`{entry.name}`")
            if section is None:
                missing.append(entry.name)
                continue
            for field in entry.args.model_fields:
                cell = section.get(f"`{field}`")
                if cell is None:
                    missing.append(f"{entry.name}.{field}")
                elif not cell:
                    unexplained.append(f"{entry.name}.{field}")
    assert not missing, f"registry entries or arguments with no reference entry: {missing}"
    assert not unexplained, f"arguments with no meaning (add a description): {unexplained}"


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def test_every_command_and_option_has_an_entry(reference: Path) -> None:
    from lavad.daemon.cli import app  # noqa: PLC0415
    from lavad.federation.cli import federation_app  # noqa: PLC0415

    page = (reference / "commands.md").read_text()
    sections = re.split(r"^#+ ", page, flags=re.M)
    by_name = {s.split("\n", 1)[0].strip("` "): s for s in sections[1:]}
    tree = _commands(typer.main.get_command(app))
    tree += [(("federation", *p), c) for p, c in _commands(typer.main.get_command(federation_app))]
    names = {" ".join(p) for p, _ in tree}
    assert {"run", "replay", "topics create", "federation owner", "evaluate gpa"} <= names
    missing = []
    for path, command in tree:
        if not path:
            continue
        section = by_name.get("lavad " + " ".join(path))
        if section is None:
            missing.append("lavad " + " ".join(path))
            continue
        for param in command.params:
            if param.name == "help" or not getattr(param, "expose_value", True):
                continue
            opts = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []
            labels = [f"`{o}`" for o in opts] or [f"`{(param.metavar or param.name).upper()}`"]
            absent = [label for label in labels if label not in section]
            if absent:
                missing.append(f"lavad {' '.join(path)} {' '.join(absent)}")
    assert not missing, f"commands or options with no reference entry: {missing}"


def test_every_event_type_and_decision_kind_has_a_schema_and_an_entry(
    gen: ModuleType, reference: Path
) -> None:
    events = json.loads((reference / "schemas" / "events.schema.json").read_text())
    decisions = json.loads((reference / "schemas" / "decisions.schema.json").read_text())
    page = (reference / "events.md").read_text()
    assert set(gen.tagged_definitions(events, "type")) == set(EVENT_TYPES)
    assert set(gen.tagged_definitions(decisions, "kind")) == set(DECISION_KINDS)
    missing = [t for t in [*EVENT_TYPES, *DECISION_KINDS] if f"### `{t}`" not in page]
    assert not missing, f"event types or decision kinds with no reference entry: {missing}"


# --------------------------------------------------- real records against the schemas


@pytest.fixture(scope="module")
def validators(reference: Path) -> tuple[Any, Any]:
    jsonschema = pytest.importorskip("jsonschema", reason="the docs extra: `make docs` installs it")
    events = json.loads((reference / "schemas" / "events.schema.json").read_text())
    decisions = json.loads((reference / "schemas" / "decisions.schema.json").read_text())
    cls = jsonschema.Draft202012Validator
    cls.check_schema(events)
    cls.check_schema(decisions)
    return cls(events), cls(decisions)


def _errors(validator: Any, record: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(record)
    ]


def test_the_slice_events_validate(validators: tuple[Any, Any]) -> None:
    events, _ = validators
    seen: dict[str, int] = {}
    for event in itertools.islice(open_trace(SLICE).events(), 20_000):
        assert not isinstance(event, BadRecord), event
        record = orjson.loads(orjson.dumps(event))
        if seen.get(record["type"], 0) >= 3000:
            continue
        seen[record["type"]] = seen.get(record["type"], 0) + 1
        assert not _errors(events, record), (record, _errors(events, record))
    assert {"vm.request", "vm.exit"} <= set(seen)


def test_the_event_schema_refuses_what_the_edge_refuses(validators: tuple[Any, Any]) -> None:
    events, _ = validators
    good = {"v": 1, "type": "vm.exit", "time": 10.0, "pool": "p", "vm_id": "a"}
    assert not _errors(events, good)
    for bad in (
        {**good, "v": 2},
        {k: v for k, v in good.items() if k != "v"},
        {k: v for k, v in good.items() if k != "type"},
        {**good, "type": "vm.exited"},
        {**good, "time": -1.0},
        {**good, "vm_id": ""},
        {
            "v": 1,
            "type": "vm.request",
            "time": 1.0,
            "pool": "p",
            "vm_id": "a",
            "cores": "8",
            "memory_gib": 1.0,
        },
    ):
        assert _errors(events, bad), bad


def test_a_replay_of_the_slice_gives_decisions_that_validate(
    validators: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, decisions = validators
    # LAS with defragmentation: placements, repredictions and migrations.
    monkeypatch.setenv("LAVAD_PLACEMENT__POLICY", "las")
    monkeypatch.setenv("LAVAD_MIGRATIONS__DEFRAG__EMPTY_BELOW", "0.24")
    settings = load_settings(CONFIG)
    trace = open_trace(SLICE, seed=settings.seed)
    out = io.BytesIO()
    replay(
        itertools.islice(trace.events(), 20_000),
        settings.engine_config(trace_has_hosts=trace.has_hosts),
        decisions_out=out,
    )
    kinds: dict[str, int] = {}
    for line in out.getvalue().splitlines():
        record = json.loads(line)
        kinds[record["kind"]] = kinds.get(record["kind"], 0) + 1
        if kinds[record["kind"]] <= 1500:  # a sample of each kind: validation is slow
            assert not _errors(decisions, record), (record, _errors(decisions, record))
    assert {"placement", "reprediction", "migration"} <= set(kinds), kinds
