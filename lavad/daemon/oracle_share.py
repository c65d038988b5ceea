"""The share of an oracle's gain a policy keeps, the figure lifetime-aware placement is held to.

A replay that compares a baseline (its first policy), learned policies and
an oracle (a policy that reads each VM's true lifetime) measures each
learned policy by the share of the oracle's gain over the baseline that it
keeps, in pp of empty hosts: the LAVA paper's yardstick (its LAS keeps 64%)
and the one ``lavad evaluate placement`` holds each condition to where the
oracle gains over the same bar, ``MIN_ORACLE_GAIN_PP``. Computed here
once, so the replay's summary, its metrics JSON and the HTML report read
back from that JSON give the same shares.

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
    each share is None where the oracle gains no more than the bar (or the
    policy's own figure is missing)."""

    pool: str
    oracle_gain_pp: float | None
    shares: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class OracleShares:
    """The shares of ``oracle``'s gain over ``baseline``, per pool, given over ``bar``."""

    baseline: str
    oracle: str
    pools: list[PoolShares]
    bar: float = MIN_ORACLE_GAIN_PP

    def as_dict(self) -> dict[str, Any]:
        """For the replay's metrics JSON (``from_dict`` reads it back)."""
        return {
            "baseline": self.baseline,
            "oracle": self.oracle,
            "min_oracle_gain_pp": self.bar,
            "pools": {
                entry.pool: {"oracle_gain_pp": entry.oracle_gain_pp, "shares": entry.shares}
                for entry in self.pools
            },
        }

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> OracleShares:
        """``as_dict`` read back (the HTML report). A document of another layout raises
        KeyError, TypeError or ValueError; its size is the file's, which the
        report bounds."""
        pools = [
            PoolShares(
                pool,
                _number(entry["oracle_gain_pp"], f"{pool}: oracle_gain_pp"),
                {
                    policy: _number(share, f"{pool}: shares: {policy}")
                    for policy, share in _mapping(entry["shares"], f"{pool}: shares").items()
                },
            )
            for pool, entry in _mapping(document["pools"], "pools").items()
        ]
        bar = _number(document["min_oracle_gain_pp"], "min_oracle_gain_pp")
        if bar is None:
            raise ValueError("min_oracle_gain_pp is null")
        baseline = _text(document["baseline"], "baseline")
        return cls(baseline, _text(document["oracle"], "oracle"), pools, bar)

    def lines(self) -> list[str]:
        """One line per pool, for the replay's summary and the report."""
        oracle, baseline, bar = self.oracle, self.baseline, self.bar
        lines = []
        for entry in self.pools:
            gain = entry.oracle_gain_pp
            if gain is None:
                lines.append(
                    f"No share of {oracle}'s gain in pool {entry.pool}: no measured window."
                )
            elif gain <= bar:
                lines.append(
                    f"No share of {oracle}'s gain in pool {entry.pool}: it gains {gain:+.2f} pp"
                    f" of empty hosts over {baseline}, not over the {bar} pp a share needs."
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


def _empty_pct(result: ReplayResult, pool: str) -> float | None:
    metrics = result.pools.get(pool)
    if metrics is None:
        return None
    value = metrics.get("empty_hosts_pct")
    return float(value) if value is not None else None


def _mapping(value: object, name: str) -> dict[str, Any]:
    """``value`` as a JSON object of entries by name; TypeError for anything else."""
    if not isinstance(value, dict):
        raise TypeError(f"{name}: expected an object, got {type(value).__name__}")
    return value


def _text(value: object, name: str) -> str:
    """``value`` as a policy's name; TypeError, naming the key, for anything else."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a policy name, got {type(value).__name__}")
    return value


def _number(value: object, name: str) -> float | None:
    """``value`` as a number or null; TypeError, naming the key, for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: expected a number or null, got {type(value).__name__}")
    return float(value)


def oracle_shares(results: Sequence[ReplayResult], oracles: Sequence[str]) -> OracleShares | None:
    """Per pool of the baseline, the share of the first oracle's gain each compared policy
    keeps; None when there is nothing to divide.

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
    return OracleShares(baseline.policy, oracle.policy, pools)
