"""Admission control in the engine: deployment events in, admission decisions out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support import PROJECT_ROOT

from lavad.core.engine import Engine
from lavad.daemon.config_file import ConfigError
from lavad.daemon.settings import load_settings
from lavad.streams.schema import (
    Admission,
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
)

CONFIG = PROJECT_ROOT / "config" / "lavad.toml"


DEFAULT_TABLE = '[admission]\npolicy = "off"\n'


def _config(tmp_path: Path, admission: str) -> Path:
    """The default configuration with its [admission] table replaced by ``admission``."""
    text = CONFIG.read_text()
    assert DEFAULT_TABLE in text
    path = tmp_path / "lavad.toml"
    path.write_text(text.replace(DEFAULT_TABLE, admission) if admission else text)
    return path


def _engine(tmp_path: Path, admission: str) -> Engine:
    settings = load_settings(_config(tmp_path, admission))
    return Engine(replace(settings.engine_config(trace_has_hosts=False)))


def test_zeroth_moment_admits_grants_and_refuses_by_hand(tmp_path: Path) -> None:
    engine = _engine(
        tmp_path,
        '[admission]\npolicy = "zeroth"\ncapacity_cores = 10.0\nargs = { threshold = 0.8 }\n',
    )
    events: list[Event] = [
        # 0 + 4 = 4 < 0.8 x 10 = 8: admitted.
        DeploymentArrival(time=0.0, pool="p", deployment_id="a", cores=4.0),
        # 4 + 5 = 9 >= 8: refused.
        DeploymentArrival(time=1.0, pool="p", deployment_id="b", cores=5.0),
        # 4 + 3 = 7 <= 10: granted (scale-outs are bounded by capacity, not the threshold).
        DeploymentScaleOut(time=2.0, pool="p", deployment_id="a", cores=3.0),
        # 7 + 4 = 11 > 10: refused, the SLA failure.
        DeploymentScaleOut(time=3.0, pool="p", deployment_id="a", cores=4.0),
        # b was refused: its scale-out is counted, not decided.
        DeploymentScaleOut(time=4.0, pool="p", deployment_id="b", cores=1.0),
        # a gives all 7 cores back and ends.
        DeploymentScaleIn(time=5.0, pool="p", deployment_id="a", cores=7.0),
        # 0 + 5 = 5 < 8: b may come now.
        DeploymentArrival(time=6.0, pool="p", deployment_id="b", cores=5.0),
    ]
    decisions = [d for e in events for d in engine.handle(e, e.time).decisions]
    assert all(isinstance(d, Admission) for d in decisions)
    got = [(d.deployment_id, d.request, d.admitted) for d in decisions if isinstance(d, Admission)]
    assert got == [
        ("a", "arrival", True),
        ("b", "arrival", False),
        ("a", "scale_out", True),
        ("a", "scale_out", False),
        ("b", "arrival", True),
    ]
    summary = engine.summary(6.0)["p"]["admission"]
    assert summary["scale_out_failure_rate"] == 0.5
    assert summary["scale_out_of_an_unknown_deployment"] == 1
    assert summary["deployments_ended"] == 1
    assert len({d.decision_id for d in decisions}) == len(decisions)


def test_without_admission_deployment_events_are_counted(tmp_path: Path) -> None:
    engine = _engine(tmp_path, "")
    event = DeploymentArrival(time=0.0, pool="p", deployment_id="a", cores=4.0)
    assert engine.handle(event, 0.0).decisions == []
    assert engine.pools["p"].counters["unconsumed.deployment.arrival"] == 1


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('policy = "zeroth"\n', "admission.capacity_cores"),
        ('policy = "first"\ncapacity_cores = 100.0\n', "admission.priors"),
        (
            'policy = "zeroth"\ncapacity_cores = 100.0\nargs = { threshold = 2.0 }\n',
            "admission.args.threshold",
        ),
    ],
)
def test_bad_admission_config_fails_at_start_up_with_the_key(
    tmp_path: Path, table: str, key: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(_config(tmp_path, "[admission]\n" + table))
    assert caught.value.key == key


def test_first_moment_policy_runs_with_configured_priors(tmp_path: Path) -> None:
    engine = _engine(
        tmp_path,
        '[admission]\npolicy = "first"\ncapacity_cores = 1000.0\n'
        "args = { threshold = 0.9, horizons_s = [86400.0], steps = 24 }\n"
        "[admission.priors]\n"
        "core_death = { shape = 2.0, rate = 172800.0 }\n"
        "scale_out = { shape = 1.0, rate = 86400.0 }\n"
        "size = { shape = 1.0, rate = 1.0 }\n"
        "kill = { shape = 1.0, rate = 604800.0 }\n",
    )
    small = engine.handle(
        DeploymentArrival(time=0.0, pool="p", deployment_id="a", cores=10.0), 0.0
    ).decisions
    huge = engine.handle(
        DeploymentArrival(time=1.0, pool="p", deployment_id="b", cores=950.0), 1.0
    ).decisions
    (first,) = small
    (second,) = huge
    assert isinstance(first, Admission) and isinstance(second, Admission)
    assert first.admitted and not second.admitted
    assert second.explanation["binding_horizon_s"] == 86400.0
