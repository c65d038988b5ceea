"""Which adapter reads a path: detection by file names and headers, and ``open_trace``.

Detection looks only at names and first lines (cheap, no parsing of data),
and formats are disjoint by construction, so the first match is the only
one. A path no format claims raises ``TraceFormatError`` listing what each
format looks for, so the user can tell a typo from an unsupported trace.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from lavad.streams.adapters import azure_vms, dlrm, jsonl, openb, usage
from lavad.streams.adapters.base import Trace, TraceFormatError, TraceOptionError, check_options
from lavad.streams.seeds import seed_refusal

# (format class, sniffer, what it looks for) in detection order.
_REGISTRY: Final[tuple[tuple[type[Trace], Callable[[Path], bool], str], ...]] = (
    (jsonl.JsonLines, jsonl.sniff, "a .jsonl file of canonical events"),
    (
        azure_vms.AzureV1Vms,
        azure_vms.sniff,
        "v1.<split>.txt (+ v1.<split>.c<T>.txt, flav_map.txt, v1.interval_map.txt)",
    ),
    (
        openb.AlibabaOpenb,
        openb.sniff,
        "openb_pod_list_*.csv (+ openb_node_list_all_node.csv)",
    ),
    (dlrm.AlibabaDlrm, dlrm.sniff, f"{dlrm.FILE_NAME} (header '{dlrm.HEADER_PREFIX},...')"),
    (usage.AzureV1Cpu, usage.sniff_azure_cpu, "*_avg_*.csv + *_max_*.csv with a t_s column"),
    (usage.Bitbrains, usage.sniff_bitbrains, "Bitbrains *.csv (header 'Timestamp [ms];')"),
    (usage.GoogleGcd, usage.sniff_gcd, "vm_<job>_<day> files"),
    (usage.PlanetLab, usage.sniff_planetlab, "YYYYMMDD day folders of per-VM files"),
)

FORMATS: Final[dict[str, type[Trace]]] = {cls.name: cls for cls, _, _ in _REGISTRY}
"""Every readable format by name (the ``format=`` option of ``open_trace``)."""


def detect_format(path: Path | str) -> str:
    """The name of the format that reads ``path``; ``TraceFormatError`` if none does."""
    target = Path(path)
    if not target.exists():
        raise TraceFormatError(target, "no such file or directory")
    for cls, sniff, _ in _REGISTRY:
        try:
            claimed = sniff(target)
        except OSError as exc:
            raise TraceFormatError(target, f"cannot read: {exc}") from None
        if claimed:
            return cls.name
    wanted = "; ".join(f"{cls.name}: {hint}" for cls, _, hint in _REGISTRY)
    kind = "directory" if target.is_dir() else "file"
    raise TraceFormatError(target, f"this {kind} matches no known trace format ({wanted})")


def open_trace(
    path: Path | str,
    *,
    seed: int = 0,
    pool: str = "default",
    format: str | None = None,
    **options: Any,
) -> Trace:
    """Open a recorded trace (directory or file) as a stream of canonical events.

    ``format`` skips detection; ``options`` are format-specific (azure-v1-vms:
    ``split``; alibaba-openb: ``pods``, ``hosts``; alibaba-dlrm: ``view``;
    jsonl: ``end_time``) and unknown ones are rejected here, at start-up.
    """
    target = Path(path)
    refusal = seed_refusal(seed)
    if refusal is not None:
        raise TraceOptionError(target, refusal)
    if not isinstance(pool, str) or not 1 <= len(pool) <= 256:
        raise TraceOptionError(
            target, f"pool must be a string of 1 to 256 characters, got {pool!r}"
        )
    if format is None:
        name = detect_format(target)
    elif format in FORMATS:
        if not target.exists():
            raise TraceFormatError(target, "no such file or directory")
        name = format
    else:
        raise TraceOptionError(target, f"unknown format {format!r}; known: {sorted(FORMATS)}")
    cls = FORMATS[name]
    check_options(cls, target, options)
    trace: Trace = cls(target, seed=seed, pool=pool, **options)
    return trace
