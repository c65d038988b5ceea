"""docker/: the Grafana dashboard and the alert rules ask only for metrics lavad exports.

The exported names come from the daemon's own registry (the shadow-mode
telemetry, a superset of the plain one), so renaming a metric in the daemon
without the dashboard, or the reverse, fails here. promtool (Debian's
``prometheus`` package) checks and unit-tests the rules when installed.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lavad.daemon.settings import load_settings
from lavad.daemon.shadow.live import ShadowTelemetry

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "lavad.json"
ALERTS = DOCKER / "alerts.yml"
ALERT_TESTS = DOCKER / "alerts.test.yml"
# Series Prometheus makes itself, not lavad.
PROMETHEUS_OWN = frozenset({"up"})
# What a query may name: a metric is an identifier not followed by "(" (a
# function) and not inside braces (a label) or quotes (a label value).
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PROMQL_WORDS = frozenset(
    {"by", "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right",
     "bool", "offset", "le", "inf", "nan"}
)  # fmt: skip


def exported_metric_names() -> set[str]:
    """Every series name the daemon's registry can expose (counters as *_total, ...)."""
    names: set[str] = set()
    for family in ShadowTelemetry().registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        else:
            names.add(family.name)
    return names


def metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    found = set()
    for match in _IDENT.finditer(expr):
        word = match.group()
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _PROMQL_WORDS:
            continue
        found.add(word)
    return found


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query, rows' nested panels included."""
    out = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def alert_exprs(rules: dict[str, Any]) -> list[tuple[str, str]]:
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def unknown_metrics(exprs: list[tuple[str, str]], exported: set[str]) -> list[str]:
    return [
        f"{where}: {name}"
        for where, expr in exprs
        for name in sorted(metrics_in(expr))
        if name not in exported and name not in PROMETHEUS_OWN
    ]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return loaded


def test_the_expression_parser_finds_metrics_not_functions_or_labels() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, pool) (rate(lavad_x_bucket{kind="a b"}[5m])))'
        " / on (pool) lavad_y and lavad_z > 0.5"
    )
    assert metrics_in(expr) == {"lavad_x_bucket", "lavad_y", "lavad_z"}


def test_the_dashboard_reads_only_metrics_the_daemon_exports(dashboard: dict[str, Any]) -> None:
    exprs = dashboard_exprs(dashboard)
    assert len(exprs) > 20
    assert unknown_metrics(exprs, exported_metric_names()) == []


def test_a_renamed_metric_fails_the_check(dashboard: dict[str, Any]) -> None:
    broken = copy.deepcopy(dashboard)
    target = broken["panels"][1]["targets"][0]
    target["expr"] = target["expr"].replace("lavad_", "lavad_renamed_", 1)
    assert len(unknown_metrics(dashboard_exprs(broken), exported_metric_names())) == 1
    # And the other way: a metric the daemon no longer exports.
    exported = exported_metric_names() - {"lavad_consumer_lag_records"}
    missing = unknown_metrics(dashboard_exprs(dashboard), exported)
    assert missing and all(m.endswith("lavad_consumer_lag_records") for m in missing)


def test_the_dashboard_shows_what_an_operator_watches(dashboard: dict[str, Any]) -> None:
    read = {name for _, expr in dashboard_exprs(dashboard) for name in metrics_in(expr)}
    for needed in (
        "lavad_pool_empty_hosts_ratio",
        "lavad_pool_utilisation_ratio",
        "lavad_pool_stranded_ratio",
        "lavad_decisions_total",
        "lavad_decision_latency_seconds_bucket",
        "lavad_consumer_lag_records",
        "lavad_falling_behind",
        "lavad_dead_letters_total",
        "lavad_shadow_pool_empty_hosts_ratio",
        "lavad_shadow_empty_hosts_difference_ratio",
        "lavad_shadow_agreement_ratio",
    ):
        assert needed in read, needed
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {"prometheus"}


def test_the_alerts_read_only_exported_metrics_and_cover_the_failures(
    rules: dict[str, Any],
) -> None:
    exprs = alert_exprs(rules)
    assert unknown_metrics(exprs, exported_metric_names()) == []
    names = {name for name, _ in exprs}
    assert {
        "LavadBrokerUnreachable",
        "LavadConsumerLagGrowing",
        "LavadFallingBehind",
        "LavadDeadLettersRising",
        "LavadOverflowAboveRho",
        "LavadNotReady",
        "LavadStateEvicting",
        "LavadPoolQuarantined",
        "LavadPoolNearHostBound",
        "LavadHostsAtVmLimit",
        "LavadLifetimeGroupsPastBound",
    } <= names


def test_the_overflow_alert_uses_the_configured_rho(rules: dict[str, Any]) -> None:
    (expr,) = [e for name, e in alert_exprs(rules) if name == "LavadOverflowAboveRho"]
    threshold = float(expr.split(">")[1])
    settings = load_settings(ROOT / "config" / "lavad.toml")
    assert threshold == settings.policies["gpa"]["rho"]


def test_the_host_bound_alert_uses_the_configured_bound(rules: dict[str, Any]) -> None:
    (expr,) = [e for name, e in alert_exprs(rules) if name == "LavadPoolNearHostBound"]
    share, bound = (float(part) for part in expr.split(">")[1].split("*"))
    settings = load_settings(ROOT / "config" / "lavad.toml")
    assert (share, bound) == (0.9, settings.hosts.max_hosts)


def test_compose_provisions_grafana_beside_prometheus_with_the_rules() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    prometheus_config = yaml.safe_load((DOCKER / "prometheus.yml").read_text(encoding="utf-8"))
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    for rule_file in prometheus_config["rule_files"]:
        assert (DOCKER / mounts[rule_file]).resolve() == ALERTS.resolve()
    grafana = services["grafana"]
    assert "prometheus" in grafana["depends_on"]
    grafana_mounts = {v.split(":")[1]: DOCKER / v.split(":")[0] for v in grafana["volumes"]}
    provisioning = grafana_mounts["/etc/grafana/provisioning"]
    source = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yaml").read_text(encoding="utf-8")
    )["datasources"][0]
    assert source["uid"] == "prometheus" and source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(
        (provisioning / "dashboards" / "lavad.yaml").read_text(encoding="utf-8")
    )["providers"][0]
    dashboards = grafana_mounts[provider["options"]["path"]]
    assert (dashboards / "lavad.json").resolve() == DASHBOARD.resolve()


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing = "promtool not installed (`make test-tools`; Debian: apt-get install prometheus)"
        # CI installs it (``make test`` runs ``test-tools``): there a missing one is a failure.
        if os.environ.get("CI_REQUIRE_PROMTOOL"):
            pytest.fail(missing)
        pytest.skip(missing)
    return found


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout


def test_promtool_runs_the_rules_unit_tests() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", str(ALERT_TESTS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
