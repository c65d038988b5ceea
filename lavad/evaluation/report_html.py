"""``lavad report``: one self-contained HTML page from lavad's JSON outputs.

Inputs, recognised by their shape (several may go into one page):

* a replay's metrics (``lavad replay --metrics-json``): ``runs``, one per policy;
* a shadow run's (``lavad shadow replay``): ``mode = "shadow"``, both sides,
  the agreement and the empty-hosts difference;
* ``lavad evaluate lifetime --json``: the calibration of P(T > X);
* ``lavad evaluate limits --json``: the slack / overrun Pareto front;
* ``lavad evaluate gpa`` (``*-gpa.json``): normalised machines against
  overflow frequency.

The page holds everything it shows: plots are PNGs inlined as ``data:``
URIs, the style is inline, and there is no script and no external link, so
it opens offline and reads the same anywhere. Every value shown is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from lavad.daemon.oracle_share import OracleShares
from lavad.daemon.plotting import pyplot


class ReportInputError(ValueError):
    """An input is not one of lavad's JSON outputs (the message says which and why)."""


# A cap on what one input may hold: the page is for people, and a series of
# a million points is drawn as ~2,000 anyway.
MAX_INPUT_BYTES: Final = 256 << 20
MAX_POINTS: Final = 2_000

_STYLE: Final = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
background:#f6f7f9;color:#1d2430}
header{background:#1d3557;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;opacity:.85}
main{max-width:1180px;margin:0 auto;padding:8px 32px 40px}
section{background:#fff;border:1px solid #dde2ea;border-radius:8px;margin:18px 0;padding:16px 20px}
h2{font-size:18px;margin:0 0 10px;color:#1d3557} h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums;font-size:13.5px}
th,td{border-bottom:1px solid #e6e9ef;padding:5px 8px;text-align:right;white-space:nowrap}
th{background:#eef1f6;font-weight:600;white-space:normal;vertical-align:bottom}
.scroll{overflow-x:auto} td:first-child,th:first-child,td.l{text-align:left}
tr.best td{background:#ecf8ee}
img{max-width:100%;height:auto;display:block;margin:8px auto}
.note{color:#5b6573;font-size:13px} .kpi{display:flex;gap:14px;flex-wrap:wrap;margin:6px 0 12px}
.kpi div{background:#eef1f6;border-radius:6px;padding:8px 14px}
.kpi b{display:block;font-size:20px;color:#1d3557}
"""


@dataclass(slots=True)
class Page:
    """The sections of the page, in order, as HTML fragments."""

    title: str
    sources: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)

    def render(self) -> str:
        sources = ", ".join(html.escape(s) for s in self.sources)
        body = "\n".join(self.sections)
        return (
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{html.escape(self.title)}</title>"
            # An empty icon: the browser would otherwise ask for /favicon.ico.
            "<link rel='icon' href='data:,'>"
            f"<style>{_STYLE}</style></head><body>"
            f"<header><h1>{html.escape(self.title)}</h1><p>from {sources}</p></header>"
            f"<main>{body}</main></body></html>\n"
        )


def load_input(path: Path) -> Any:
    size = path.stat().st_size
    if size > MAX_INPUT_BYTES:
        raise ReportInputError(f"{path}: {size:,} bytes, more than {MAX_INPUT_BYTES:,}")
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ReportInputError(f"{path}: not JSON ({exc})") from None


def kind_of(document: Any) -> str:
    """Which of lavad's outputs ``document`` is: replay, shadow, lifetime, limits or gpa."""
    if isinstance(document, dict):
        if document.get("mode") == "shadow" and isinstance(document.get("sides"), dict):
            return "shadow"
        if isinstance(document.get("runs"), list):
            return "replay"
        if isinstance(document.get("models"), list) and "split_time" in document:
            return "lifetime"
        if isinstance(document.get("aligned"), dict) or isinstance(document.get("resampled"), dict):
            return "gpa"
    if (
        isinstance(document, list)
        and document
        and all(
            isinstance(item, dict) and isinstance(item.get("scores"), list) for item in document
        )
    ):
        return "limits"
    raise ReportInputError("not a replay, shadow, lifetime, limits or gpa JSON output of lavad")


def build_report(paths: Sequence[Path], title: str = "lavad report") -> str:
    """The whole page for ``paths``; raises ReportInputError naming a file it cannot read."""
    page = Page(title)
    for path in paths:
        document = load_input(path)
        try:
            kind = kind_of(document)
            RENDERERS[kind](page, document, path.name)
        except ReportInputError as exc:
            raise ReportInputError(f"{path}: {exc}") from None
        # What a JSON document of another layout raises in the renderers: a key
        # missing, a value of another type (None.get, 1.5.items()), a list too short.
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise ReportInputError(
                f"{path}: unexpected layout ({type(exc).__name__}: {exc})"
            ) from None
        page.sources.append(f"{path.name} ({kind})")
    return page.render()


# ----------------------------------------------------------------- pieces


def _num(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}{suffix}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:,.{digits}f}{suffix}"
    return html.escape(str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], best: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        f"<tr{' class=best' if i == best else ''}>"
        + "".join(f"<td>{c}</td>" for c in row)
        + "</tr>"
        for i, row in enumerate(rows)
    )
    return (
        f"<div class=scroll><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def _figure(draw: Callable[[Any], None], width: float = 10.0, height: float = 4.2) -> str:
    """A matplotlib drawing as an inline PNG ``<img>``."""
    plt = pyplot()
    figure = plt.figure(figsize=(width, height))
    try:
        draw(figure)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=90)
    finally:
        plt.close(figure)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f"<img alt='plot' src='data:image/png;base64,{data}'>"


def _thin(points: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
    step = max(1, math.ceil(len(points) / MAX_POINTS))
    return points[::step]


def _series_plot(
    runs: list[tuple[str, dict[str, list[dict[str, Any]]]]],
    key: str,
    label: str,
    window: tuple[float, float] | None = None,
) -> str:
    """One line per run (and pool); ``window``: the measured span, the rest shaded."""

    def draw(figure: Any) -> None:
        axis = figure.add_subplot(1, 1, 1)
        for name, series in runs:
            for pool, full in sorted(series.items()):
                points = _thin(full)
                if not points:
                    continue
                hours = [p["time"] / 3600.0 for p in points]
                tag = name if len(series) == 1 else f"{name} / {pool}"
                axis.plot(hours, [p[key] for p in points], label=tag, linewidth=1.2)
        if window is not None:
            low, high = axis.get_xlim()
            start, until = window[0] / 3600.0, window[1] / 3600.0
            if start > low:
                axis.axvspan(low, start, color="grey", alpha=0.12, label="not measured")
            if until < high:
                axis.axvspan(until, high, color="grey", alpha=0.12)
            axis.set_xlim(low, high)
        axis.set_xlabel("trace time (h)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize=9)

    return _figure(draw)


def _bars(groups: dict[str, dict[str, float]], ylabel: str) -> str:
    """Grouped bars: one group per outer key, one bar per inner key."""
    inner = list(dict.fromkeys(k for values in groups.values() for k in values))

    def draw(figure: Any) -> None:
        axis = figure.add_subplot(1, 1, 1)
        width = 0.8 / max(1, len(inner))
        for j, key in enumerate(inner):
            xs = [i + j * width for i in range(len(groups))]
            axis.bar(xs, [groups[g].get(key, 0.0) for g in groups], width, label=key)
        axis.set_xticks([i + width * (len(inner) - 1) / 2 for i in range(len(groups))])
        axis.set_xticklabels(list(groups), fontsize=9)
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=9)

    return _figure(draw, height=3.6)


_METRIC_HEADERS: Final = (
    "policy / side",
    "pool",
    "empty hosts %",
    "vs first pp",
    "CPU booked %",
    "mem booked %",
    "stranded CPU %",
    "stranded mem %",
    "hosts used peak",
    "hosts end",
    "failures",
)


def _metrics_rows(runs: list[dict[str, Any]]) -> tuple[list[list[str]], int | None]:
    rows: list[list[str]] = []
    first = {pool: m.get("empty_hosts_pct") for pool, m in runs[0]["pools"].items()} if runs else {}
    best_value, best_row = -math.inf, None
    for k, run in enumerate(runs):
        for pool, m in sorted(run["pools"].items()):
            empty = m.get("empty_hosts_pct")
            base = first.get(pool)
            delta = None if k == 0 or empty is None or base is None else empty - base
            if empty is not None and empty > best_value:
                best_value, best_row = empty, len(rows)
            rows.append(
                [
                    html.escape(str(run["policy"])),
                    html.escape(pool),
                    _num(empty),
                    "-" if k == 0 else _num(delta, 2),
                    _num(m.get("cpu_util_pct")),
                    _num(m.get("memory_util_pct")),
                    _num(m.get("stranded_cpu_pct")),
                    _num(m.get("stranded_memory_pct")),
                    _num(m.get("hosts_used_peak")),
                    _num(m.get("hosts_up_end")),
                    f"{_num(m.get('placement_failures'))}"
                    f" ({_num(m.get('placement_failure_pct'))}%)",
                ]
            )
    return rows, best_row


def _measured(runs: list[dict[str, Any]]) -> tuple[float, float] | None:
    for run in runs:
        for m in run["pools"].values():
            start, until = m.get("measured_from_s"), m.get("measured_until_s")
            if isinstance(start, int | float) and isinstance(until, int | float):
                return float(start), float(until)
    return None


def _window_note(runs: list[dict[str, Any]]) -> str:
    for run in runs:
        for m in run["pools"].values():
            basis = m.get("empty_hosts_basis", "hosts up")
            start, until = m.get("measured_from_s"), m.get("measured_until_s")
            if isinstance(start, int | float) and isinstance(until, int | float) and until <= start:
                # As the replay's own summary says it: a trace shorter than the warm-up.
                return (
                    f"<p class=note>No averages: the measured window is empty. It would open "
                    f"{_num(m.get('warmup_s'), 0)} s after the first event, at {_num(start, 0)} s, "
                    f"and it closes at {_num(until, 0)} s; set [metrics] warmup_s below the "
                    "trace's span to measure it.</p>"
                )
            return (
                f"<p class=note>Averages over [{_num(m.get('measured_from_s'), 0)} s, "
                f"{_num(m.get('measured_until_s'), 0)} s] of trace time, after a warm-up of "
                f"{_num(m.get('warmup_s'), 0)} s. Empty hosts as a share of "
                f"{html.escape(str(basis))}; booked CPU and memory of the hosts up; stranded: "
                "free capacity no request of the recent mix fits. The best empty-hosts row "
                "is shaded.</p>"
            )
    return ""


def _packing_sections(page: Page, runs: list[dict[str, Any]], source: str, heading: str) -> None:
    rows, best = _metrics_rows(runs)
    page.sections.append(
        f"<section><h2>{html.escape(heading)}</h2><p class=note>{html.escape(source)}</p>"
        + _table(_METRIC_HEADERS, rows, best)
        + _window_note(runs)
        + "</section>"
    )
    with_series = [(str(r["policy"]), r["series"]) for r in runs if r.get("series")]
    if with_series:
        window = _measured(runs)
        page.sections.append(
            "<section><h2>Empty hosts and utilisation over time</h2>"
            + _series_plot(with_series, "empty_hosts_pct", "empty hosts (% of hosts up)", window)
            + _series_plot(with_series, "cpu_util_pct", "CPU booked (% of hosts up)", window)
            + "<p class=note>Sampled every metrics.sample_interval_s. Shaded: outside the"
            " measured window (the warm-up of a trace that starts with an empty cluster, and"
            " the drain after the last request).</p></section>"
        )
    stranding = {
        f"{r['policy']}" + (f" / {pool}" if len(r["pools"]) > 1 else ""): {
            "CPU": m.get("stranded_cpu_pct") or 0.0,
            "memory": m.get("stranded_memory_pct") or 0.0,
        }
        for r in runs
        for pool, m in sorted(r["pools"].items())
    }
    # No pool took an event: no bars to draw (an empty plot warned of its legend).
    if stranding:
        page.sections.append(
            "<section><h2>Stranding</h2>"
            + _bars(stranding, "stranded, % of schedulable capacity")
            + "<p class=note>Free capacity left after an inflation simulation fills the pool"
            " with the recent request mix until nothing fits (hourly samples, averaged).</p>"
            "</section>"
        )
    _decision_mix(page, runs)


def _decision_mix(page: Page, runs: list[dict[str, Any]]) -> None:
    mix = {str(r["policy"]): {k: float(v) for k, v in r.get("decisions", {}).items()} for r in runs}
    rows = []
    for r in runs:
        for pool, m in sorted(r["pools"].items()):
            counters = m.get("counters", {})
            reasons = ", ".join(
                f"{html.escape(str(k))}: {_num(v)}" for k, v in sorted(counters.items()) if v
            )
            dead = ", ".join(
                f"{html.escape(str(k))}: {_num(v)}"
                for k, v in sorted(r.get("dead_letters", {}).items())
            )
            rows.append(
                [
                    html.escape(str(r["policy"])),
                    html.escape(pool),
                    _num(m.get("requests")),
                    _num(m.get("placed")),
                    _num(m.get("placement_failures_retryable")),
                    _num(m.get("placement_failures_final")),
                    f"<span class=l>{reasons or '-'}</span>",
                    dead or "-",
                ]
            )
    headers = (
        "policy / side",
        "pool",
        "requests",
        "placed",
        "unfit, may retry",
        "unfit, final",
        "pool counters",
        "dead letters",
    )
    plot = _bars(mix, "decisions") if any(mix.values()) else ""
    page.sections.append(
        "<section><h2>Decision mix and unfit reasons</h2>"
        + plot
        + _table(headers, rows)
        + "<p class=note>Unfit, may retry: no host had room at the time (capacity busy); "
        "final: larger than any host. Pool counters: events absorbed or refused, by reason."
        "</p></section>"
    )


# --------------------------------------------------------------- renderers


def _replay(page: Page, document: dict[str, Any], source: str) -> None:
    runs = document["runs"]
    if not runs:
        raise ReportInputError("a replay output with no runs")
    trace = html.escape(str(document.get("trace", "")))
    table_at = len(page.sections)
    _packing_sections(page, runs, f"{source}: replay of {trace}", "Packing metrics per policy")
    shares = document.get("oracle_shares")
    if shares is not None:
        read = OracleShares.from_dict(shares)
        # Beside the table its shares are taken from.
        page.sections.insert(
            table_at + 1,
            "<section><h2>Share of the oracle's gain</h2>"
            + "".join(f"<p>{html.escape(line)}</p>" for line in read.lines())
            + f"<p class=note>In pp of empty hosts over {html.escape(read.baseline)}; no share"
            f" where {html.escape(read.oracle)} gains no more than {read.bar} pp.</p></section>",
        )


def _shadow(page: Page, document: dict[str, Any], source: str) -> None:
    sides = document["sides"]
    runs = [sides["actual"], sides["lavad"]]
    agreement = document.get("agreement", {})
    difference = document.get("empty_hosts_difference", {})
    kpis = []
    for pool, a in sorted(agreement.items()):
        d = difference.get(pool, {})
        ci = d.get("ci95_pp")
        interval = (
            "no interval (too few samples)" if not ci else f"95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}]"
        )
        mean = d.get("mean_pp")
        kpis.append(
            "<div class=kpi>"
            f"<div>pool<b>{html.escape(pool)}</b></div>"
            f"<div>empty hosts, lavad - actual<b>{'n/a' if mean is None else f'{mean:+.2f} pp'}</b>"
            f"{interval}</div>"
            f"<div>same host<b>{_rate(a.get('same_host_rate'))}</b>"
            f"of {_num(a.get('compared'))} VMs</div>"
            f"<div>same LAVA class<b>{_rate(a.get('same_class_rate'))}</b>"
            f"of {_num(a.get('class_compared'))}</div>"
            f"<div>placed by one side only<b>{_num(a.get('actual_only'))} / "
            f"{_num(a.get('lavad_only'))}</b>actual / lavad</div></div>"
        )
    page.sections.append(
        "<section><h2>Shadow mode: lavad beside the existing scheduler</h2>"
        + "".join(kpis)
        + "<p class=note>The actual side follows the existing scheduler's vm.placed events;"
        " lavad's side places the same requests with its policy and sees the same exits."
        " Agreement is per VM both placed; the class is LAVA's, read in lavad's pool. The"
        " interval is over batch means of the hourly differences.</p></section>"
    )
    _packing_sections(page, runs, f"{source}: shadow replay", "Both sides' packing metrics")
    with_diff = {pool: d["series"] for pool, d in difference.items() if d.get("series")}
    if with_diff:

        def draw(figure: Any) -> None:
            axis = figure.add_subplot(1, 1, 1)
            for pool, full in sorted(with_diff.items()):
                points = _thin(full)
                axis.plot(
                    [p["time"] / 3600.0 for p in points],
                    [p["difference_pp"] for p in points],
                    label=pool,
                    linewidth=1.2,
                )
                d = difference[pool]
                if d.get("ci95_pp"):
                    low, high = d["ci95_pp"]
                    axis.axhspan(low, high, alpha=0.15, color="tab:green", label=f"{pool}: 95% CI")
            axis.axhline(0.0, color="grey", linewidth=1)
            axis.set_xlabel("trace time (h)")
            axis.set_ylabel("empty hosts, lavad - actual (pp)")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=9)

        page.sections.append(
            "<section><h2>Difference in empty hosts over time</h2>" + _figure(draw) + "</section>"
        )


def _rate(value: Any) -> str:
    return "n/a" if value is None else f"{100.0 * float(value):.1f}%"


def _lifetime(page: Page, document: dict[str, Any], source: str) -> None:
    models = document["models"]
    panels = [
        (str(model["name"]), threshold)
        for model in models
        for threshold in model["thresholds"]
        if threshold.get("calibration")
    ]
    rows = [
        [
            html.escape(name),
            _num(t["threshold_s"] / 3600.0, 1, " h"),
            _num(t.get("calibration_vms")),
            _num(t.get("expected_calibration_error"), 4),
        ]
        for name, t in panels
    ]

    def draw(figure: Any) -> None:
        axis = figure.add_subplot(1, 1, 1)
        axis.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect")
        for name, t in panels:
            bins = [b for b in t["calibration"] if b["count"]]
            axis.plot(
                [b["mean_predicted"] for b in bins],
                [b["observed"] for b in bins],
                marker="o",
                label=f"{name}, P(T > {t['threshold_s'] / 3600.0:g} h)",
            )
        axis.set_xlabel("predicted probability")
        axis.set_ylabel("observed frequency")
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=9)

    page.sections.append(
        f"<section><h2>Lifetime calibration</h2><p class=note>{html.escape(source)}: "
        f"{_num(document.get('test_vms'))} test VMs</p>"
        + (_figure(draw, 7.0, 5.0) if panels else "<p>No calibration bins.</p>")
        + _table(("model", "X", "VMs judged", "expected calibration error"), rows)
        + "</section>"
    )


def _limits(page: Page, document: list[dict[str, Any]], source: str) -> None:
    scores = [(str(r.get("trace", "")), s) for r in document for s in r["scores"]]
    resources = sorted({s["resource"] for _, s in scores})

    def draw(figure: Any) -> None:
        for i, resource in enumerate(resources, start=1):
            axis = figure.add_subplot(1, len(resources), i)
            for _, s in scores:
                if s["resource"] != resource:
                    continue
                axis.scatter(s["relative_slack_mean"], s["overrun_rate"], s=28)
                axis.annotate(
                    s["recommender"], (s["relative_slack_mean"], s["overrun_rate"]), fontsize=8
                )
            axis.set_title(resource)
            axis.set_xlabel("relative slack (mean)")
            axis.set_ylabel("overrun rate")
            axis.grid(alpha=0.3)

    rows = [
        [
            html.escape(trace),
            html.escape(s["recommender"]),
            html.escape(s["resource"]),
            _num(s["relative_slack_mean"], 3),
            _num(s["overrun_rate"], 4),
            _num(s["days_without_overrun"], 3),
            _num(s["changes_per_job_day"], 2),
        ]
        for trace, s in scores
    ]
    page.sections.append(
        "<section><h2>CPU and memory limits: Pareto plot</h2>"
        f"<p class=note>{html.escape(source)}</p>"
        + (_figure(draw) if scores else "")
        + _table(
            (
                "trace",
                "recommender",
                "resource",
                "slack",
                "overrun rate",
                "days w/o overrun",
                "changes/job-day",
            ),
            rows,
        )
        + "</section>"
    )


def _gpa(page: Page, document: dict[str, Any], source: str) -> None:
    parts = [
        (name, document[name])
        for name in ("resampled", "aligned")
        if isinstance(document.get(name), dict)
    ]
    summaries = [(name, part.get("summary", [])) for name, part in parts]
    summaries = [(name, rows) for name, rows in summaries if rows]

    def draw(figure: Any) -> None:
        for i, (name, rows) in enumerate(summaries, start=1):
            axis = figure.add_subplot(1, len(summaries), i)
            methods = list(dict.fromkeys(str(r["method"]) for r in rows))
            for method in methods:
                points = [r for r in rows if str(r["method"]) == method and r.get("m") is not None]
                axis.scatter([r["q"] for r in points], [r["m"] for r in points], s=22, label=method)
            axis.set_title(name)
            axis.set_xlabel("overflow frequency q")
            axis.set_ylabel("normalised machines m")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)

    page.sections.append(
        f"<section><h2>GPA: machines against overflow</h2><p class=note>{html.escape(source)}: "
        f"{html.escape(str(document.get('trace', '')))}</p>"
        + (_figure(draw) if summaries else "<p>No summary rows.</p>")
        + "</section>"
    )


RENDERERS: Final[dict[str, Callable[[Page, Any, str], None]]] = {
    "replay": _replay,
    "shadow": _shadow,
    "lifetime": _lifetime,
    "limits": _limits,
    "gpa": _gpa,
}
