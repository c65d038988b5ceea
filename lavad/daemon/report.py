"""Human-readable replay results: one table for all compared policies, and a plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lavad.daemon.oracle_share import OracleShares
from lavad.daemon.plotting import pyplot
from lavad.daemon.replay import ReplayResult


def _fmt(value: object, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _empty_hosts_bases(results: Sequence[ReplayResult]) -> dict[str, str]:
    """What each pool's empty hosts % is a share of (replay.on_common_pool sets it)."""
    return {
        pool: str(m.get("empty_hosts_basis", "hosts up"))
        for result in results
        for pool, m in result.pools.items()
    }


def metrics_table(results: Sequence[ReplayResult], trace_name: str) -> Table:
    """Rows per policy and pool; the first policy is the baseline for the pp column.

    Each share says what it is a share of: with hosts added on demand, empty
    hosts are counted against the common pool every policy needed, while
    booked CPU and memory are shares of the hosts up at each moment (the pool
    as grown so far, mostly busy hosts), so the two do not add up to 100.
    """
    table = Table(title=f"lavad replay: {trace_name}", title_justify="left")
    bases = set(_empty_hosts_bases(results).values())
    empty_of = (
        f"of {next(iter(bases)).removeprefix('common pool of ')}"
        if len(bases) == 1
        else "see below"
    )
    for header in (
        "policy",
        "pool",
        f"empty hosts %\n{empty_of}",
        "vs first\npp",
        "CPU booked %\nof hosts up",
        "mem booked %\nof hosts up",
        "stranded CPU %\nof schedulable",
        "stranded mem %\nof schedulable",
        "hosts used\npeak",
        "hosts\nend",
        "failures",
        "events/s",
    ):
        table.add_column(
            header,
            justify="left" if header in ("policy", "pool") else "right",
            no_wrap=header in ("policy", "pool"),
            # Each header line whole: "of hosts up" is the point of the column.
            min_width=max(len(line) for line in header.split("\n")),
        )
    baseline: dict[str, float | None] = {}
    if results:
        baseline = {name: m["empty_hosts_pct"] for name, m in results[0].pools.items()}
    for result in results:
        for pool, m in result.pools.items():
            base = baseline.get(pool)
            empty = m["empty_hosts_pct"]
            delta = empty - base if empty is not None and base is not None else None
            failures = f"{m['placement_failures']} ({m['placement_failure_pct']:.2f}%)"
            table.add_row(
                result.policy,
                pool,
                _fmt(empty),
                _fmt(delta, 2) if result is not results[0] else "-",
                _fmt(m["cpu_util_pct"]),
                _fmt(m["memory_util_pct"]),
                _fmt(m["stranded_cpu_pct"]),
                _fmt(m["stranded_memory_pct"]),
                str(m["hosts_used_peak"]),
                str(m["hosts_up_end"]),
                failures,
                f"{result.events_per_second:,.0f}",
            )
    return table


def print_results(
    results: Sequence[ReplayResult],
    trace_name: str,
    console: Console,
    shares: OracleShares | None = None,
) -> None:
    """The table, what its figures are measured over, and, with ``shares``, the share of
    the compared oracle's gain each other policy keeps."""
    console.print(metrics_table(results, trace_name))
    if results:
        first = next(iter(results[0].pools.values()), None)
        if first is not None and first["measured_until_s"] <= first["measured_from_s"]:
            # A trace shorter than the warm-up: say why every average is n/a,
            # rather than print a window that ends before it begins.
            console.print(
                f"No averages: the measured window is empty. It would open"
                f" {first['warmup_s']:.0f} s after the first event, at"
                f" {first['measured_from_s']:.0f} s, and it closes at the"
                f" {first['measured_until'].replace('_', ' ')}, at"
                f" {first['measured_until_s']:.0f} s; set \\[metrics] warmup_s (or --warmup-s)"
                " below the trace's span to measure it."
            )
        elif first is not None:
            console.print(
                f"Averages over [{first['measured_from_s']:.0f} s,"
                f" {first['measured_until_s']:.0f} s]:"
                f" the first {first['warmup_s']:.0f} s after the first event are warm-up"
                " (the trace starts with an empty cluster) and are not counted;"
                f" the window closes at the {first['measured_until'].replace('_', ' ')}."
                " CPU and mem booked: cores and memory VMs requested, over the capacity of the"
                " hosts up at each moment. Stranded: free capacity no request of the recent mix"
                " fits, over the hosts up and not draining."
            )
        bases = _empty_hosts_bases(results)
        if not bases:
            console.print(
                "No pool took an event (the trace holds no valid event): nothing to measure."
            )
        else:
            listed = "; ".join(f"pool {pool}: {basis}" for pool, basis in sorted(bases.items()))
            common = any(basis.startswith("common pool") for basis in bases.values())
            console.print(
                f"Empty hosts are counted against {listed}."
                + (
                    " A common pool is the largest any compared policy grew to, every host"
                    " present from the start: a pool grown on demand holds mostly busy hosts"
                    " at each moment (so its booked CPU % is high), while its empty hosts are"
                    " counted on the common pool."
                    if common
                    else ""
                )
            )
    if shares is not None:
        for line in shares.lines():
            console.print(line, highlight=False, markup=False)
    for result in results:
        if result.dead_letters:
            console.print(
                f"[yellow]{result.policy}: dead letters {dict(result.dead_letters)}[/yellow]"
            )


def plot_results(results: Sequence[ReplayResult], path: Path, trace_name: str) -> None:
    """Empty hosts % and CPU utilisation over time, one line per policy (and pool)."""
    plt = pyplot()

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for result in results:
        for pool, points in result.series.items():
            if not points:
                continue
            hours = [p["time"] / 3600.0 for p in points]
            label = result.policy if len(result.series) == 1 else f"{result.policy} / {pool}"
            top.plot(hours, [p["empty_hosts_pct"] for p in points], label=label, linewidth=1)
            bottom.plot(hours, [p["cpu_util_pct"] for p in points], label=label, linewidth=1)
    if results:
        first = next(iter(results[0].pools.values()), None)
        if first is not None and first["warmup_s"]:
            for axis in (top, bottom):
                axis.axvspan(
                    (first["measured_from_s"] - first["warmup_s"]) / 3600.0,
                    first["measured_from_s"] / 3600.0,
                    color="grey",
                    alpha=0.15,
                    label="warm-up" if axis is top else None,
                )
        if first is not None:
            for axis in (top, bottom):
                axis.axvline(
                    first["measured_until_s"] / 3600.0,
                    color="grey",
                    linestyle="--",
                    linewidth=1,
                    label="end of measured window" if axis is top else None,
                )
    top.set_ylabel("empty hosts (% of hosts up)")
    bottom.set_ylabel("CPU booked (% of hosts up)")
    bottom.set_xlabel("trace time (h)")
    top.set_title(f"lavad replay: {trace_name}")
    top.legend(loc="best")
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
