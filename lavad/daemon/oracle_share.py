"""The share of an oracle's gain a policy keeps, the figure lifetime-aware placement is held to.

A replay that compares a baseline (its first policy), learned policies and
an oracle (a policy that reads each VM's true lifetime) measures each
learned policy by the share of the oracle's gain over the baseline that it
keeps, in pp of empty hosts: the LAVA paper's yardstick (its LAS keeps 64%)
and the one ``lavad evaluate placement`` holds each condition to where the
oracle gains over the same bar, ``MIN_ORACLE_GAIN_PP``. Computed here
once, so the replay's table and its metrics JSON give the same shares.

At or below ``MIN_ORACLE_GAIN_PP`` the oracle's gain is within a replay's noise
(OpenB's pools of a few hosts swing by tenths of a point on one decision):
a share of it would be a ratio of two noises, so none is given, and the
reason is said instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lavad.daemon.replay import ReplayResult

# The gain over the baseline, in pp of empty hosts, an oracle must exceed for
# a share of it to be given.
MIN_ORACLE_GAIN_PP = 0.5


@dataclass(frozen=True, slots=True)
class PoolShares:
    """One pool's shares: ``oracle_gain_pp`` is None where either run measured no window;
    each share is None where the oracle gains no more than ``MIN_ORACLE_GAIN_PP``
    (or the policy's own figure is missing)."""

    pool: str
    oracle_gain_pp: float | None
    shares: dict[str, float | None]

    def as_dict(self) -> dict[str, Any]:
        return {"oracle_gain_pp": self.oracle_gain_pp, "shares": self.shares}


def _empty_pct(result: ReplayResult, pool: str) -> float | None:
    metrics = result.pools.get(pool)
    if metrics is None:
        return None
    value = metrics.get("empty_hosts_pct")
    return float(value) if value is not None else None


def oracle_shares(
    results: Sequence[ReplayResult], oracles: Sequence[str]
) -> tuple[str, list[PoolShares]] | None:
    """The first oracle's name and, per pool of the baseline, the share of its gain each
    compared policy keeps; None when there is nothing to divide.

    ``results`` in the order compared, the first the baseline; ``oracles``
    the names among them that read true lifetimes. The shares are of the
    first oracle listed after the baseline, for every policy that is neither
    the baseline nor an oracle. None without such an oracle or such a policy.
    """
    if not results:
        return None
    baseline, rest = results[0], results[1:]
    oracle = next((result for result in rest if result.policy in oracles), None)
    others = [result for result in rest if result.policy not in oracles]
    if oracle is None or baseline.policy in oracles or not others:
        return None
    pools = []
    for pool in baseline.pools:
        base = _empty_pct(baseline, pool)
        best = _empty_pct(oracle, pool)
        gain = best - base if base is not None and best is not None else None
        shares: dict[str, float | None] = {}
        for result in others:
            own = _empty_pct(result, pool)
            share = None
            if base is not None and own is not None and gain is not None:
                share = (own - base) / gain if gain > MIN_ORACLE_GAIN_PP else None
            shares[result.policy] = share
        pools.append(PoolShares(pool, gain, shares))
    return oracle.policy, pools


def shares_document(
    results: Sequence[ReplayResult], oracles: Sequence[str]
) -> dict[str, Any] | None:
    """``oracle_shares`` for the replay's metrics JSON; None when there is nothing to divide."""
    found = oracle_shares(results, oracles)
    if found is None:
        return None
    oracle, pools = found
    return {
        "baseline": results[0].policy,
        "oracle": oracle,
        "min_oracle_gain_pp": MIN_ORACLE_GAIN_PP,
        "pools": {entry.pool: entry.as_dict() for entry in pools},
    }


def from_document(shares: dict[str, Any]) -> tuple[str, str, list[PoolShares], float]:
    """``shares_document`` read back (the HTML report): baseline, oracle, pools, and the bar
    its shares were given over. A document of another layout raises KeyError,
    TypeError or ValueError."""
    pools = [
        PoolShares(
            str(pool),
            _number(entry["oracle_gain_pp"]),
            {str(policy): _number(share) for policy, share in entry["shares"].items()},
        )
        for pool, entry in shares["pools"].items()
    ]
    bar = _number(shares["min_oracle_gain_pp"])
    if bar is None:
        raise ValueError("min_oracle_gain_pp is null")
    return str(shares["baseline"]), str(shares["oracle"]), pools, bar


def _number(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number or null, got {value!r}")
    return float(value)


def describe(
    baseline: str, oracle: str, pools: Sequence[PoolShares], bar: float = MIN_ORACLE_GAIN_PP
) -> list[str]:
    """One line per pool, for the replay's summary; ``bar`` the gain its shares needed."""
    lines = []
    for entry in pools:
        gain = entry.oracle_gain_pp
        if gain is None:
            lines.append(f"No share of {oracle}'s gain in pool {entry.pool}: no measured window.")
        elif gain <= bar:
            lines.append(
                f"No share of {oracle}'s gain in pool {entry.pool}: it gains {gain:+.2f} pp of"
                f" empty hosts over {baseline}, not over the {bar} pp a share needs."
            )
        else:
            kept = ", ".join(
                f"{policy} {'n/a' if share is None else f'{100 * share:.0f}%'}"
                for policy, share in entry.shares.items()
            )
            lines.append(
                f"Share of {oracle}'s gain over {baseline} ({gain:+.2f} pp of empty hosts)"
                f" kept in pool {entry.pool}: {kept}."
            )
    return lines
