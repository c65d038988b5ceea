"""The lifetime model's evaluation: F1 and calibration by hand, the protocol on the real slice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from support import PROJECT_ROOT
from typer.testing import CliRunner

from lavad.daemon.cli import app
from lavad.evaluation.lifetime import (
    OnlineModelSettings,
    _Distributions,
    calibration,
    evaluate_lifetime_model,
    f1_score,
    log_score,
)
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.survival import Tables, expected_remaining, life_table, suffix_sums
from lavad.streams.adapters import open_trace
from lavad.streams.schema import VmExit, VmRequest

AZURE_SLICE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"
HOUR = 3600.0


def test_f1_by_hand() -> None:
    predicted = np.array([True, True, False, False, True])
    truth = np.array([True, False, True, False, True])
    # tp = 2, fp = 1, fn = 1: F1 = 2*2 / (2*2 + 1 + 1) = 4/6
    assert f1_score(predicted, truth) == pytest.approx(4 / 6)
    assert f1_score(np.zeros(3, bool), np.zeros(3, bool)) == 0.0


def test_calibration_by_hand() -> None:
    predicted = np.array([0.05, 0.15, 0.12, 0.95])
    truth = np.array([False, True, False, True])
    table, ece = calibration(predicted, truth)
    # bins [0, .1): 0.05 vs 0; [.1, .2): mean 0.135 vs 0.5; [.9, 1]: 0.95 vs 1
    assert [(b.count, b.mean_predicted, b.observed) for b in table] == [
        (1, pytest.approx(0.05), 0.0),
        (2, pytest.approx(0.135), 0.5),
        (1, pytest.approx(0.95), 1.0),
    ]
    # ECE = (1 * 0.05 + 2 * 0.365 + 1 * 0.05) / 4 = 0.2075
    assert ece == pytest.approx(0.2075)


def test_pareto_tail_keeps_the_mass_and_shortens_the_unknown_tail() -> None:
    bins = LifetimeBins.log_spaced()
    deaths = np.zeros(bins.count)
    censored = np.zeros(bins.count)
    deaths[5] = 10.0
    censored[12] = 10.0  # half the VMs are still running at bin 12
    plain = life_table(deaths, censored)
    tailed = life_table(deaths, censored, bins.pareto_tail_hazard)
    # Up to the last observation the two agree; the mass beyond is the same
    # in total (the data say only that it is beyond), spread instead of at
    # the horizon.
    assert tailed[0, :13] == pytest.approx(plain[0, :13])
    assert tailed[0, 13:].sum() == pytest.approx(plain[0, 13:].sum())
    assert plain[0, -1] == pytest.approx(plain[0, 13:].sum())
    assert tailed[0, -1] < plain[0, -1]
    rows = np.array([0])
    u = np.array([bins.edges[13]])
    remaining_plain = expected_remaining(Tables(bins, plain, *suffix_sums(plain, bins)), rows, u)
    remaining_tailed = expected_remaining(Tables(bins, tailed, *suffix_sums(tailed, bins)), rows, u)
    assert remaining_tailed[0] < remaining_plain[0]
    # Still a heavy tail: it expects at least as long again as it has run.
    assert remaining_tailed[0] >= u[0]


def test_protocol_on_the_real_slice() -> None:
    trace = open_trace(AZURE_SLICE, seed=0)
    times = [e.time for e in trace.events() if isinstance(e, VmRequest)]
    end = trace.end_time if trace.end_time is not None else times[-1]
    split = times[0] + 0.5 * (times[-1] - times[0])
    result = evaluate_lifetime_model(
        open_trace(AZURE_SLICE, seed=0).events(),
        split_time=split,
        end_time=end,
        settle_s=(end - split) / 2,
        river_seed=0,
    )
    assert result.train_exits > 1000 and result.test_vms > 1000
    assert [m.name for m in result.models] == ["life tables", "river (Hoeffding adaptive tree)"]
    for model in result.models:
        one_hour = model.thresholds[0]
        assert one_hour.threshold_s == HOUR
        # Knowing the uptime helps: F1 at 30% of the lifetime beats F1 at creation.
        assert one_hour.f1[0.3] > one_hour.f1[0.0], model.name
        # Calibration covers every settled test VM exactly once.
        assert sum(b.count for b in one_hour.calibration) == one_hour.calibration_vms
        assert 0.0 <= one_hour.expected_calibration_error <= 1.0


def test_protocol_refuses_a_split_after_the_end() -> None:
    with pytest.raises(ValueError, match="split_time"):
        evaluate_lifetime_model([], split_time=10.0, end_time=5.0)


def test_cli_prints_f1_calibration_and_latency(tmp_path: Path) -> None:
    written = tmp_path / "lifetime.json"
    result = CliRunner().invoke(
        app,
        ["evaluate", "lifetime", str(AZURE_SLICE), "--json", str(written)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "F1" in result.output and "calibration" in result.output
    assert "per VM in batches" in result.output
    assert "river" in result.output and "log score" in result.output
    models = orjson.loads(written.read_bytes())["models"]
    # The life tables, the shrunk life tables and the river classifier.
    assert [len(m["thresholds"]) for m in models] == [2, 2, 2]
    assert all(m["log_score"] > 0 for m in models)


def test_log_score_worked_by_hand() -> None:
    # Bins [0, 300), [300, 3000), open. One distribution: mass 0.25, 0.375, 0.375.
    bins = LifetimeBins.log_spaced(first_s=300.0, horizon_s=3000.0, count=2)
    mass = life_table(np.array([1.0, 1.0, 0.0]), np.array([0.0, 2.0, 0.0]))
    m0, m1 = suffix_sums(mass, bins)
    predicted = _Distributions(mass, m0, m1, {("p", "a"): 0, ("p", "b"): 0})
    # a exited after 100 s (bin 0): -ln 0.25. b was still running at the end,
    # 300 s after its start: -ln P(T > 300) = -ln 0.75.
    test = {("p", "a"): 0.0, ("p", "b"): 700.0}
    score = log_score(bins, predicted, test, {("p", "a"): 100.0}, end_time=1000.0)
    assert score == pytest.approx((np.log(4.0) + np.log(4.0 / 3.0)) / 2.0)


def _prequential_events() -> list[VmRequest | VmExit]:
    """a lives 100 s before the split (150 s); b lives 500 s and c is still running at the end."""

    def request(at: float, vm: str) -> VmRequest:
        return VmRequest(time=at, pool="p", vm_id=vm, cores=2.0, memory_gib=4.0, tenant="t")

    return [
        request(0.0, "a"),
        VmExit(time=100.0, pool="p", vm_id="a"),
        request(200.0, "b"),
        VmExit(time=700.0, pool="p", vm_id="b"),
        request(800.0, "c"),
    ]


@pytest.mark.parametrize(("protocol", "ece"), [("split", 1.0), ("online", 0.75)])
def test_online_protocol_predicts_with_the_model_as_it_stands(protocol: str, ece: float) -> None:
    # Bins [0, 300), [300, 3000), open; "lives beyond 300 s"; refits every 100 s.
    # Split (frozen at 150 s, a's death only): P(T > 300) = 0 for b and c.
    # Both outlive 300 s (b lived 500, c runs from 800 to the end at 2000), so
    # ECE = 1. Online: b is predicted at 200 s from a's death alone (0); c at
    # 800 s, after the refit that counts b's death in bin 1 too: deaths
    # (1, 1, 0), hazards 1/2 then 1/1, P(T > 300) = 0.5. ECE = (|0 - 1| +
    # |0.5 - 1|) / 2 = 0.75.
    result = evaluate_lifetime_model(
        _prequential_events(),
        split_time=150.0,
        end_time=2000.0,
        thresholds_s=(300.0,),
        settle_s=0.0,
        bins=LifetimeBins.log_spaced(first_s=300.0, horizon_s=3000.0, count=2),
        protocol="online" if protocol == "online" else "split",
        settings=OnlineModelSettings(min_observations=1, refit_interval_s=100.0),
    )
    (report,) = result.models[0].thresholds
    assert report.calibration_vms == 2
    assert report.expected_calibration_error == pytest.approx(ece)
    assert result.protocol == protocol
    # Online, every exit was learned from; frozen, only a's.
    assert result.train_exits == (2 if protocol == "online" else 1)


def test_online_protocol_refuses_an_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="protocol"):
        evaluate_lifetime_model([], split_time=1.0, end_time=5.0, protocol="later")  # type: ignore[arg-type]


def test_cli_online_protocol_and_a_calibrated_model(tmp_path: Path) -> None:
    written = tmp_path / "lifetime.json"
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "lifetime",
            str(AZURE_SLICE),
            "--protocol",
            "online",
            "--no-river",
            "--models",
            "tables,tables-calibrated",
            "--json",
            str(written),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "as it stood then" in result.output
    saved = orjson.loads(written.read_bytes())
    assert saved["protocol"] == "online"
    assert [m["name"] for m in saved["models"]] == [
        "life tables",
        "life tables, recalibrated online",
    ]
    refused = CliRunner().invoke(app, ["evaluate", "lifetime", str(AZURE_SLICE), "--protocol", "x"])
    assert refused.exit_code != 0 and "--protocol" in refused.output
