"""Imports run one way (DESIGN.md): a wrong import fails here, not in review.

Read from the source with ``ast`` (nothing is imported), imports inside
functions and under TYPE_CHECKING included: a lazy import is still a
dependency, and the rules are about what the code needs, not when it loads.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lavad"

# The decision core: pure, synchronous, no I/O; its own folder.
CORE: tuple[str, ...] = ("lavad.core",)
# What the core must never reach, directly or through the lavad modules it imports.
CORE_FORBIDDEN_LIBRARIES = frozenset(
    {"asyncio", "aiokafka", "aiohttp", "prometheus_client", "typer", "pydantic_settings"}
)
# The process (shells, settings, command line, snapshots) is lavad.daemon.
CORE_FORBIDDEN_LAVAD: tuple[str, ...] = ("lavad.daemon", "lavad.federation", "lavad.evaluation")


def _within(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imported(name: str, path: Path) -> Iterator[str]:
    """The absolute names ``name`` imports: modules where they are modules."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield submodule if submodule in modules() else base


@cache
def imports() -> dict[str, frozenset[str]]:
    return {name: frozenset(_imported(name, path)) for name, path in modules().items()}


def _lavad_imports(name: str) -> set[str]:
    return {m for m in imports()[name] if _within(m, "lavad") and m != "lavad"}


def _reach(start: str) -> dict[str, str]:
    """Every module ``start`` reaches through lavad's own imports -> the one that imports it."""
    via: dict[str, str] = {start: start}
    stack = [start]
    while stack:
        current = stack.pop()
        for target in sorted(imports()[current]):
            if target not in via:
                via[target] = current
                if target in modules():
                    stack.append(target)
    return via


def _chain(via: dict[str, str], end: str) -> str:
    chain = [end]
    while via[chain[-1]] != chain[-1]:
        chain.append(via[chain[-1]])
    return " -> ".join(reversed(chain))


def test_the_core_list_names_modules_that_exist() -> None:
    missing = [p for p in CORE if not any(_within(m, p) for m in modules())]
    assert not missing, f"CORE names modules that are gone: {missing}"


def test_streams_imports_nothing_else_of_lavad() -> None:
    wrong = {
        f"{name} imports {target}"
        for name in modules()
        if _within(name, "lavad.streams")
        for target in _lavad_imports(name)
        if not _within(target, "lavad.streams")
    }
    assert not wrong, sorted(wrong)


def test_models_import_only_streams() -> None:
    wrong = {
        f"{name} imports {target}"
        for name in modules()
        if _within(name, "lavad.models")
        for target in _lavad_imports(name)
        if not _within(target, ("lavad.models", "lavad.streams"))
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("core", CORE)
def test_the_core_reaches_no_process_code(core: str) -> None:
    wrong = set()
    for name in (m for m in modules() if _within(m, core)):
        via = _reach(name)
        for target in via:
            top = target.split(".", 1)[0]
            if top in CORE_FORBIDDEN_LIBRARIES or _within(target, CORE_FORBIDDEN_LAVAD):
                wrong.add(_chain(via, target))
    assert not wrong, "\n".join(sorted(wrong))


def test_the_rules_see_a_wrong_import() -> None:
    # The reading itself, on a module known to import from its own package.
    assert "lavad.core.cluster" in imports()["lavad.core.engine"]
    assert "lavad.streams.schema" in _lavad_imports("lavad.core.engine")
    assert "asyncio" in imports()["lavad.daemon.live.shell"]


def _cycles_of(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more nodes of ``graph`` (Tarjan's,
    iteratively): each is a cycle."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in order:
            continue
        work = [(root, 0)]
        while work:
            node, edge = work.pop()
            if edge == 0:
                order[node] = low[node] = len(order)
                stack.append(node)
                on_stack.add(node)
            if edge < len(graph[node]):
                work.append((node, edge + 1))
                target = graph[node][edge]
                if target not in order:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], order[target])
                continue
            if low[node] == order[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
            if work:
                parent = work[-1][0]  # the frame below is the node that reached this one
                low[parent] = min(low[parent], low[node])
    return found


def test_no_import_cycles() -> None:
    """Lazy and TYPE_CHECKING imports included: a cycle hidden from the interpreter
    still ties two modules' designs together."""
    graph = {name: sorted(m for m in _lavad_imports(name) if m in modules()) for name in modules()}
    assert _cycles_of(graph) == []


def test_the_cycle_search_finds_cycles() -> None:
    # a -> b -> c -> a is one cycle; d only hangs off it; e <-> f is another.
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["f"], "f": ["e"]}
    assert _cycles_of(graph) == [["a", "b", "c"], ["e", "f"]]
    assert _cycles_of({"a": ["b"], "b": []}) == []
