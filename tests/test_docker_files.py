"""docker/: the Dockerfile, compose.yaml and prometheus.yml agree with each other.

No Docker engine runs on CI machines, so these tests check the files' structure
instead of building or starting anything. Each ``problems_*`` function lists
what it finds wrong: the real files must give none, and a short table of
deliberate breakages shows that every check can fail.

Where node and the network are available, linters cover syntax and style (both
passed on these files on 2026-11-22):

    npx --yes dclint@3.1.0 docker/compose.yaml
    hadolint docker/Dockerfile
"""

from __future__ import annotations

import copy
import json
import posixpath
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER_DIR = ROOT / "docker"
DOCKERFILE = DOCKER_DIR / "Dockerfile"

LAVAD, KAFKA, TOPIC_INIT = "lavad", "kafka", "kafka-topics"
INPUT_TOPICS = {"lavad.vm-events", "lavad.deployments", "lavad.usage"}
OUTPUT_TOPICS = {
    "lavad.placements",
    "lavad.admissions",
    "lavad.migrations",
    "lavad.limits",
    "lavad.repredictions",
    "lavad.dead-letters",
    # Shadow mode's advice ([shadow] topic).
    "lavad.shadow",
}


class Instruction(NamedTuple):
    keyword: str
    args: str


def read_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order, with backslash-continued lines joined."""
    # Docker drops comment lines even inside a continued instruction.
    lines = [line.strip() for line in text.splitlines() if not line.strip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [
        Instruction(keyword.upper(), args.strip())
        for keyword, _, args in (line.partition(" ") for line in joined.splitlines())
        if keyword
    ]


@dataclass
class Files:
    compose: dict[str, Any]
    prometheus: dict[str, Any]
    dockerfile: list[Instruction]


def _services(files: Files) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = files.compose["services"]
    return services


def _compose_env(files: Files, service: str) -> dict[str, str]:
    # YAML reads `9464` as an int; the container sees every value as a string.
    environment = _services(files)[service].get("environment") or {}
    return {key: str(value) for key, value in environment.items()}


def _dockerfile_env(files: Files) -> dict[str, str]:
    # The Dockerfile uses only the `ENV KEY=value ...` form.
    pairs = [w.partition("=") for kw, a in files.dockerfile if kw == "ENV" for w in shlex.split(a)]
    return {key: value for key, _, value in pairs}


def _last(files: Files, keyword: str) -> str:
    """The arguments of the last `keyword` instruction: the one that takes effect."""
    return ([args for kw, args in files.dockerfile if kw == keyword] or [""])[-1]


def _words(args: str) -> list[str]:
    """CMD/ENTRYPOINT/VOLUME arguments in the JSON exec form or the shell form."""
    words: list[str] = json.loads(args) if args.startswith("[") else shlex.split(args)
    return words


def _unpinned(image: str) -> bool:
    """No tag, or a moving one: `latest`, `slim`... (a version tag has a digit)."""
    _, colon, tag = image.rpartition(":")
    # A colon before the last slash is a registry's port, not a tag.
    moving = not colon or "/" in tag or not any(char.isdigit() for char in tag)
    return moving and "@sha256:" not in image


# --- the checks -----------------------------------------------------------------------


def problems_depends_on(files: Files) -> list[str]:
    services = _services(files)
    problems: list[str] = []
    for name, spec in services.items():
        deps = spec.get("depends_on") or {}
        if isinstance(deps, list):  # the short form: names only
            deps = dict.fromkeys(deps)
        for dep, options in deps.items():
            healthy = (options or {}).get("condition") == "service_healthy"
            if dep not in services:
                problems.append(f"{name} depends on {dep!r}, which is not a service")
            elif healthy and "healthcheck" not in services[dep]:
                problems.append(f"{name} waits for {dep} to be healthy; it has no healthcheck")
    return problems


def problems_image_or_build(files: Files) -> list[str]:
    return [
        f"{name} has neither image nor build"
        for name, spec in _services(files).items()
        if not spec.get("image") and not spec.get("build")
    ]


def problems_build_paths(files: Files) -> list[str]:
    problems: list[str] = []
    for name, spec in _services(files).items():
        build = spec.get("build", {})
        if isinstance(build, str):  # the short form: the context alone
            build = {"context": build}
        if not build:
            continue
        # Compose resolves the context against the compose file's directory.
        context = (DOCKER_DIR / build.get("context", ".")).resolve()
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        if not dockerfile.is_file():
            problems.append(f"{name}: no {dockerfile} (build context {context})")
        elif name == LAVAD and dockerfile != DOCKERFILE:
            # The Dockerfile checks here assume it is the image lavad runs.
            problems.append(f"{name} builds {dockerfile}, not {DOCKERFILE}")
    return problems


def problems_pinned_images(files: Files) -> list[str]:
    images = {name: spec.get("image", "") for name, spec in _services(files).items()}
    images |= {f"FROM {a}": a.split()[0] for kw, a in files.dockerfile if kw == "FROM"}
    return [
        f"{where}: image {image!r} is not pinned to a version"
        for where, image in images.items()
        if image and _unpinned(image)
    ]


def problems_bootstrap(files: Files) -> list[str]:
    listeners = _compose_env(files, KAFKA).get("KAFKA_ADVERTISED_LISTENERS", "")
    advertised = {item.partition("://")[2] for item in listeners.split(",")}
    # The broker also advertises localhost:29092 for the host; inside the compose
    # network lavad must use an address naming the broker's container.
    broker_hosts = {KAFKA, _services(files)[KAFKA].get("hostname", KAFKA)}
    servers = _compose_env(files, LAVAD).get("LAVAD_KAFKA__BOOTSTRAP_SERVERS", "")
    return [
        f"lavad bootstraps from {address!r}, not a listener {KAFKA} advertises to containers"
        for address in servers.split(",")
        if address not in advertised or address.rpartition(":")[0] not in broker_hosts
    ]


def problems_metrics_port(files: Files) -> list[str]:
    port = _compose_env(files, LAVAD).get("LAVAD_HTTP__PORT", "<unset>")
    problems: list[str] = []
    exposed = [w.split("/")[0] for kw, a in files.dockerfile if kw == "EXPOSE" for w in a.split()]
    if port not in exposed:
        problems.append(f"Dockerfile EXPOSE {exposed} lacks lavad's LAVAD_HTTP__PORT {port}")
    targets = [
        target
        for job in files.prometheus["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
        if target.startswith(f"{LAVAD}:")
    ]
    if targets != [f"{LAVAD}:{port}"]:
        problems.append(f"prometheus scrapes {targets}, not {LAVAD}:{port}")
    return problems


def problems_topics(files: Files) -> list[str]:
    command = _services(files)[TOPIC_INIT]["command"]
    partitions: dict[str, str] = {}
    for script in [command] if isinstance(command, str) else command:
        for line in script.splitlines():
            words = shlex.split(line, comments=True)
            if "--create" in words:
                topic = words[words.index("--topic") + 1]
                partitions[topic] = words[words.index("--partitions") + 1]
    created, wanted = set(partitions), INPUT_TOPICS | OUTPUT_TOPICS
    problems = [f"{TOPIC_INIT} does not create {t}" for t in sorted(wanted - created)]
    problems += [f"{TOPIC_INIT} creates {t}, not lavad's" for t in sorted(created - wanted)]
    # lavad joins the inputs by pool key, which needs them co-partitioned.
    counts = {partitions.get(topic) for topic in INPUT_TOPICS}
    if len(counts) != 1:
        problems.append(f"input topics have different partition counts: {counts}")
    return problems


def problems_dockerfile_runtime(files: Files) -> list[str]:
    problems: list[str] = []
    command = _words(_last(files, "ENTRYPOINT")) + _words(_last(files, "CMD"))
    if command[:2] != ["lavad", "run"]:
        problems.append(f"the image runs {command}, not `lavad run`")
    # Without a USER instruction the image runs as root.
    if (_last(files, "USER") or "root").partition(":")[0] in ("root", "0"):
        problems.append("the image runs as root")
    # Snapshots are lavad's state across restarts, so they must outlive the
    # container: both the image's default and compose's override.
    volumes = [
        v.rstrip("/") + "/" for kw, a in files.dockerfile if kw == "VOLUME" for v in _words(a)
    ]
    key = "LAVAD_LIVE__SNAPSHOT_DIR"
    image_dir = _dockerfile_env(files).get(key, "<unset>")
    for directory in sorted({image_dir, _compose_env(files, LAVAD).get(key, image_dir)}):
        if not any((directory + "/").startswith(volume) for volume in volumes):
            problems.append(f"{key}={directory} is in no VOLUME {volumes}")
    return problems


def problems_package_copied(files: Files) -> list[str]:
    # lavad/ holds every package (lavad/daemon, lavad/streams, ...): `pip install .`
    # finds them only if lavad/ was copied beforehand.
    workdir = "/"
    copied: set[str] = set()  # COPY sources up to `pip install`
    for keyword, args in files.dockerfile:
        if keyword == "WORKDIR":
            workdir = posixpath.join(workdir, args)
        elif keyword == "COPY":
            *sources, _dest = [w for w in shlex.split(args) if not w.startswith("--")]
            copied.update(posixpath.normpath(source) for source in sources)
        elif keyword == "RUN" and "pip install" in args:
            break
    else:
        return ["the Dockerfile never runs pip install"]
    return [] if LAVAD in copied else ["lavad/ is not copied before pip install"]


# --- the real files pass every check --------------------------------------------------


@pytest.fixture(scope="module")
def files() -> Files:
    return Files(
        compose=yaml.safe_load((DOCKER_DIR / "compose.yaml").read_text(encoding="utf-8")),
        prometheus=yaml.safe_load((DOCKER_DIR / "prometheus.yml").read_text(encoding="utf-8")),
        dockerfile=read_dockerfile(DOCKERFILE.read_text(encoding="utf-8")),
    )


def test_depends_on_names_services_that_can_be_waited_for(files: Files) -> None:
    assert problems_depends_on(files) == []


def test_every_service_has_an_image_or_a_build(files: Files) -> None:
    assert problems_image_or_build(files) == []


def test_build_context_and_dockerfile_exist(files: Files) -> None:
    assert problems_build_paths(files) == []


def test_images_are_pinned(files: Files) -> None:
    assert problems_pinned_images(files) == []


def test_lavad_bootstraps_from_an_advertised_listener(files: Files) -> None:
    assert problems_bootstrap(files) == []


def test_prometheus_scrapes_lavads_http_port(files: Files) -> None:
    assert problems_metrics_port(files) == []


def test_topic_init_creates_lavads_topics(files: Files) -> None:
    assert problems_topics(files) == []


def test_image_runs_lavad_unprivileged_with_snapshots_on_a_volume(files: Files) -> None:
    assert problems_dockerfile_runtime(files) == []


def test_the_package_is_copied_before_pip_install(files: Files) -> None:
    assert problems_package_copied(files) == []


# --- each check catches a breakage ----------------------------------------------------

Check = Callable[[Files], list[str]]
Mutation = Callable[[Files], object]


def _update(*path: str, **values: object) -> Mutation:
    """Update the mapping at services/<path> with `values`."""

    def mutate(files: Files) -> None:
        node: Any = _services(files)
        for key in path:
            node = node[key]
        node.update(values)

    return mutate


def _edit_script(files: Files, old: str, new: str) -> None:
    spec = _services(files)[TOPIC_INIT]
    spec["command"] = [script.replace(old, new) for script in spec["command"]]


def _move_to_end(files: Files, instruction: Instruction) -> None:
    files.dockerfile.remove(instruction)
    files.dockerfile.append(instruction)


# id -> (check, how the parsed files are broken): the check must report a problem.
BREAKAGES: dict[str, tuple[Check, Mutation]] = {
    "unknown-dependency": (problems_depends_on, _update(LAVAD, "depends_on", zookeeper={})),
    "no-image-no-build": (problems_image_or_build, _update("prometheus", image=None)),
    "no-such-dockerfile": (problems_build_paths, _update(LAVAD, "build", dockerfile="Dockerfil")),
    "kafka-latest": (problems_pinned_images, _update(KAFKA, image="apache/kafka:latest")),
    "bootstrap-on-host-port": (
        problems_bootstrap,
        _update(LAVAD, "environment", LAVAD_KAFKA__BOOTSTRAP_SERVERS="kafka:29092"),
    ),
    "scrape-port-mismatch": (
        problems_metrics_port,
        lambda f: f.prometheus["scrape_configs"][0]["static_configs"][0].update(
            targets=["lavad:9090"]
        ),
    ),
    "output-topic-misspelt": (
        problems_topics,
        lambda f: _edit_script(f, "lavad.dead-letters", "lavad.dlq"),
    ),
    "root-user": (
        problems_dockerfile_runtime,
        lambda f: f.dockerfile.append(Instruction("USER", "root")),
    ),
    "snapshots-off-volume": (
        problems_dockerfile_runtime,
        _update(LAVAD, "environment", LAVAD_LIVE__SNAPSHOT_DIR="/tmp/snapshots"),
    ),
    "lavad-copied-after-pip-install": (
        problems_package_copied,
        lambda f: _move_to_end(f, Instruction("COPY", "lavad ./lavad")),
    ),
}


@pytest.mark.parametrize(("check", "mutate"), BREAKAGES.values(), ids=BREAKAGES.keys())
def test_check_reports_a_breakage(files: Files, check: Check, mutate: Mutation) -> None:
    broken = copy.deepcopy(files)
    mutate(broken)
    assert check(broken) != []


def test_every_check_has_a_breakage() -> None:
    checks = {value for name, value in globals().items() if name.startswith("problems_")}
    assert checks == {check for check, _mutate in BREAKAGES.values()}
