"""The hindsight tables of the placement matrix (``lavad/evaluation/hindsight.py``).

The hindsight run must predict from the tables the plain run ended with and
never refit them; if the tables were not installed, or refit, the bound it
gives would be that of another model.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from lavad.core.engine import Engine
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.evaluation import hindsight
from lavad.models.lifetime.grouped import GroupedLifeTables
from lavad.streams.adapters import open_trace

ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"


def _replay(models: hindsight.FittedModels | None) -> tuple[Engine, bytes, list[object]]:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    trace = open_trace(AZURE_SLICE, seed=0)
    config = settings.engine_config("las", trace_has_hosts=trace.has_hosts)
    engine = Engine(config)
    frozen: list[object] = []
    if models is not None:
        frozen.extend(hindsight.install(engine, models))
    out = io.BytesIO()
    replay(trace.events(), config, end_time=trace.end_time, decisions_out=out, engine=engine)
    return engine, out.getvalue(), frozen


def _placements(decisions: bytes) -> list[bytes]:
    return [line for line in decisions.splitlines() if b'"kind":"placement"' in line]


@pytest.mark.slow
def test_the_hindsight_run_predicts_from_the_plain_runs_tables_and_never_refits_them() -> None:
    plain, plain_decisions, _ = _replay(None)
    models = hindsight.fitted_models(plain)
    assert list(models) == ["default"]
    fitted = models["default"]
    mass, observations = fitted.mass.copy(), np.asarray(fitted.observations).copy()

    _, decisions, frozen = _replay(models)

    (tables,) = frozen
    assert isinstance(tables, hindsight.FrozenTables)
    # The slice spans days of event time and the tracker refits hourly.
    assert tables.refits_skipped > 24
    assert np.array_equal(fitted.mass, mass)
    assert np.array_equal(np.asarray(fitted.observations), observations)
    # The same VMs placed, by other predictions: the placements differ somewhere.
    placed = b'"kind":"placement"'
    assert decisions.count(placed) == plain_decisions.count(placed) > 40_000
    assert _placements(decisions) != _placements(plain_decisions)


def test_a_hindsight_variant_needs_its_plain_run_before_it() -> None:
    hindsight.check_order(["bestfit", "las", "las+hindsight"])
    with pytest.raises(ValueError, match=r"needs --policy las before it"):
        hindsight.check_order(["bestfit", "las+hindsight", "las"])
    hindsight.check_order(["las", "las+hindsight-features"])
    with pytest.raises(ValueError, match=r"needs --policy las before it"):
        hindsight.check_order(["las+hindsight-features", "las"])
    assert hindsight.split("lava:host_quantiles=8+hindsight") == (
        "lava:host_quantiles=8",
        hindsight.SUFFIX,
    )
    assert hindsight.split("las+hindsight-features") == ("las", hindsight.FEATURES_SUFFIX)
    assert hindsight.split("las") == ("las", None)
    assert hindsight.wanted("las", ["las", "las+hindsight-features"])
    assert not hindsight.wanted("lava", ["lava", "las+hindsight"])


@pytest.mark.slow
def test_the_features_bound_never_predicts_a_vm_from_its_owners_group() -> None:
    """Frozen, a VM's owner group (its batch with its shape) holds its own exit and its
    siblings': the features-only bound must back off past it, by the tables' own
    rule over the rest, and still predict VMs the plain bound gives their owner's."""
    plain, _, _ = _replay(None)
    fitted = hindsight.fitted_models(plain)["default"]
    assert isinstance(fitted, GroupedLifeTables)
    features = hindsight.FrozenFeatureTables(fitted)
    everything = hindsight.FrozenTables(fitted)
    rows_of_vms = list(fitted._by_keys.values())
    assert len(rows_of_vms) > 1_000
    by_owner = 0
    for rows in rows_of_vms:
        chosen = features.choose(rows)
        assert chosen != rows[0]
        # The rule: the first of the coarser groups with enough observations, else the pool's.
        enough = [row for row in rows[1:-1] if fitted.observations[row] >= fitted.min_observations]
        assert chosen == (enough[0] if enough else rows[-1])
        by_owner += everything.choose(rows) == rows[0]
    # The slice's batches are large enough that the plain bound reads some owners' groups.
    assert by_owner > 0
    # The placement matrix's ``+hindsight-features`` installs these in the tracker.
    settings = load_settings(ROOT / "config" / "lavad.toml")
    engine = Engine(settings.engine_config("las", trace_has_hosts=False))
    (installed,) = hindsight.install(engine, {"default": fitted}, hindsight.FEATURES_SUFFIX)
    assert isinstance(installed, hindsight.FrozenFeatureTables)
    assert engine.pool("default").policy.las.tracker.model is installed  # type: ignore[attr-defined]


def test_the_features_bound_refuses_a_model_without_the_tables_back_off() -> None:
    with pytest.raises(ValueError, match="needs the life tables' back-off"):
        hindsight.FrozenFeatureTables(object())  # type: ignore[arg-type]
