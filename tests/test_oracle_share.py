"""The share of an oracle's gain a replay reports, worked by hand."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from lavad.daemon.oracle_share import MIN_ORACLE_GAIN_PP, OracleShares, oracle_shares
from lavad.daemon.replay import ReplayResult


def _run(policy: str, **empty: float | None) -> ReplayResult:
    """A replay's result holding only each pool's empty hosts %, as the shares read."""
    return ReplayResult(
        policy=policy,
        pools={pool: {"empty_hosts_pct": value} for pool, value in empty.items()},
        events=0,
        decisions=Counter(),
        dead_letters=Counter(),
        end_time=0.0,
        wall_seconds=1.0,
    )


@pytest.mark.parametrize(
    ("baseline", "las", "lava", "oracle", "expected"),
    [
        # Best Fit 10% empty, the oracle 14%: a gain of 4 pp. LAS at 12% keeps
        # 2 of the 4 pp (50%), LAVA at 13% keeps 3 (75%).
        (10.0, 12.0, 13.0, 14.0, {"las": 0.5, "lava": 0.75}),
        # A policy below the baseline keeps a negative share: 9 - 10 = -1 of
        # 4 pp, -25%; one above the oracle more than all of it: 5 of 4, 125%.
        (10.0, 9.0, 15.0, 14.0, {"las": -0.25, "lava": 1.25}),
        # The oracle gains 0.4 pp, not over the 0.5 a share needs: none given.
        (10.0, 10.2, 10.3, 10.4, {"las": None, "lava": None}),
        # Exactly 0.5 pp is not over it either.
        (10.0, 10.2, 10.3, 10.5, {"las": None, "lava": None}),
        # The oracle loses to the baseline: nothing to take a share of.
        (10.0, 9.0, 11.0, 9.5, {"las": None, "lava": None}),
    ],
)
def test_each_policy_keeps_its_gain_over_the_oracles(
    baseline: float,
    las: float,
    lava: float,
    oracle: float,
    expected: dict[str, float | None],
) -> None:
    results = [
        _run("bestfit", default=baseline),
        _run("las", default=las),
        _run("lava", default=lava),
        _run("las-oracle", default=oracle),
    ]
    found = oracle_shares(results, ["las-oracle"])
    assert found is not None
    assert found.oracle == "las-oracle"
    [pool] = found.pools
    assert pool.pool == "default"
    assert pool.oracle_gain_pp == pytest.approx(oracle - baseline)
    assert pool.shares.keys() == expected.keys()
    for policy, share in expected.items():
        if share is None:
            assert pool.shares[policy] is None
        else:
            assert pool.shares[policy] == pytest.approx(share)


def test_the_shares_are_of_the_first_oracle_and_no_oracle_gets_one() -> None:
    # Two oracles: the shares are of the first listed (gain 14 - 10 = 4 pp);
    # the second is an oracle too, so it keeps no share of the first's.
    results = [
        _run("bestfit", default=10.0),
        _run("lava-oracle", default=14.0),
        _run("las", default=11.0),
        _run("las-oracle", default=16.0),
    ]
    found = oracle_shares(results, ["lava-oracle", "las-oracle"])
    assert found is not None
    assert found.oracle == "lava-oracle"
    [pool] = found.pools
    assert pool.shares == {"las": pytest.approx(0.25)}


@pytest.mark.parametrize(
    ("results", "oracles"),
    [
        # No oracle compared.
        (
            [_run("bestfit", default=10.0), _run("las", default=11.0), _run("lava", default=12.0)],
            [],
        ),
        # An oracle, but no policy besides the baseline to measure.
        ([_run("bestfit", default=10.0), _run("las-oracle", default=14.0)], ["las-oracle"]),
        (
            [
                _run("bestfit", default=10.0),
                _run("las-oracle", default=14.0),
                _run("lava-oracle", default=13.0),
            ],
            ["las-oracle", "lava-oracle"],
        ),
        # The baseline is itself an oracle: a share of one oracle's gain over another's.
        (
            [
                _run("las-oracle", default=14.0),
                _run("las", default=11.0),
                _run("lava-oracle", default=13.0),
            ],
            ["las-oracle", "lava-oracle"],
        ),
    ],
)
def test_nothing_to_divide_gives_no_shares(results: list[ReplayResult], oracles: list[str]) -> None:
    assert oracle_shares(results, oracles) is None


def test_each_pool_is_divided_on_its_own() -> None:
    # Pool "cpu": oracle gain 20 - 16 = 4 pp, LAS keeps 17 - 16 = 1 of it
    # (25%). Pool "gpu": an empty measured window in the oracle's run (None)
    # leaves no gain and no share there.
    results = [
        _run("bestfit", cpu=16.0, gpu=30.0),
        _run("las", cpu=17.0, gpu=31.0),
        _run("las-oracle", cpu=20.0, gpu=None),
    ]
    found = oracle_shares(results, ["las-oracle"])
    assert found is not None
    assert found.as_dict() == {
        "baseline": "bestfit",
        "oracle": "las-oracle",
        "min_oracle_gain_pp": MIN_ORACLE_GAIN_PP,
        "pools": {
            "cpu": {"oracle_gain_pp": pytest.approx(4.0), "shares": {"las": pytest.approx(0.25)}},
            "gpu": {"oracle_gain_pp": None, "shares": {"las": None}},
        },
    }
    assert found.lines() == [
        "Share of las-oracle's gain over bestfit (+4.00 pp of empty hosts) kept in pool cpu:"
        " las 25%.",
        "No share of las-oracle's gain in pool gpu: no measured window.",
    ]


def test_an_oracle_within_the_noise_says_why_it_gives_no_share() -> None:
    results = [
        _run("bestfit", default=10.0),
        _run("las", default=10.1),
        _run("las-oracle", default=10.25),
    ]
    found = oracle_shares(results, ["las-oracle"])
    assert found is not None
    assert found.lines() == [
        "No share of las-oracle's gain in pool default: it gains +0.25 pp of empty hosts"
        " over bestfit, not over the 0.5 pp a share needs."
    ]


def test_the_json_reads_back_to_the_same_lines() -> None:
    # What the HTML report reads: the replay's metrics JSON, through orjson.
    results = [
        _run("bestfit", cpu=16.0, gpu=30.0),
        _run("las", cpu=17.0, gpu=30.1),
        _run("las-oracle", cpu=20.0, gpu=30.3),
    ]
    found = oracle_shares(results, ["las-oracle"])
    assert found is not None
    read = OracleShares.from_dict(orjson.loads(orjson.dumps(found.as_dict())))
    assert (read.baseline, read.oracle, read.bar) == ("bestfit", "las-oracle", MIN_ORACLE_GAIN_PP)
    assert read.lines() == found.lines()


def _shares_document() -> dict[str, Any]:
    """The metrics JSON's shares of a one-pool replay, for the tests that damage it."""
    found = oracle_shares(
        [_run("bestfit", cpu=16.0), _run("las", cpu=17.0), _run("las-oracle", cpu=20.0)],
        ["las-oracle"],
    )
    assert found is not None
    return found.as_dict()


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda d: d["pools"]["cpu"]["shares"].update(las="half"), TypeError),
        (lambda d: d["pools"]["cpu"].update(oracle_gain_pp=True), TypeError),
        (lambda d: d.pop("oracle"), KeyError),
        (lambda d: d.update(min_oracle_gain_pp=None), ValueError),
        # Containers of the wrong kind are refused by name, not by whatever
        # the first method call on them raises.
        (lambda d: d.update(pools=[["cpu", {}]]), TypeError),
        (lambda d: d["pools"]["cpu"].update(shares=[["las", 0.5]]), TypeError),
        (lambda d: d.update(oracle={"name": "las-oracle"}), TypeError),
    ],
)
def test_a_json_of_another_layout_is_refused(
    change: Callable[[dict[str, Any]], object], error: type[Exception]
) -> None:
    document = _shares_document()
    change(document)
    with pytest.raises(error):
        OracleShares.from_dict(document)


def test_absurd_figures_in_a_json_read_back_are_only_printed() -> None:
    # The largest finite doubles a JSON can hold (orjson refuses 1e999 and NaN):
    # a gain of 1e308 pp over the bar gives a share line, formatted, nothing more.
    document = {
        "baseline": "bestfit",
        "oracle": "las-oracle",
        "min_oracle_gain_pp": 0.5,
        "pools": {"default": {"oracle_gain_pp": 1e308, "shares": {"las": -1e308}}},
    }
    [line] = OracleShares.from_dict(orjson.loads(orjson.dumps(document))).lines()
    # A gain of 1e308 printed in full: its 309 digits, two decimals.
    assert re.match(r"Share of las-oracle's gain over bestfit \(\+\d{309}\.00 pp of empty", line)
    # A share of -1e308 is -1e310 percent, past a double: printed as such.
    assert line.endswith("kept in pool default: las -inf%.")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d.update(baseline=7), "baseline"),
        (lambda d: d["pools"]["cpu"].update(oracle_gain_pp="4"), "cpu: oracle_gain_pp"),
        (lambda d: d["pools"]["cpu"]["shares"].update(las=[0.25]), "cpu: shares: las"),
        (lambda d: d["pools"]["cpu"].update(shares=None), "cpu: shares"),
    ],
)
def test_a_refused_json_names_the_key_it_could_not_read(
    change: Callable[[dict[str, Any]], object], named: str
) -> None:
    document = _shares_document()
    change(document)
    with pytest.raises(TypeError, match=f"^{re.escape(named)}: expected"):
        OracleShares.from_dict(document)
