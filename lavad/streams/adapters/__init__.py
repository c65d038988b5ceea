"""Trace adapters: real recorded traces -> canonical v1 events, in time order.

``open_trace(path)`` detects the format of a directory or file and returns a
``Trace``: ``name``, ``path``, ``end_time`` (censoring time, when known),
``events()`` (events in non-decreasing time, with ``BadRecord`` items for
rows that could not be read, never dropped) and ``describe()`` (static
facts, including the rules each adapter applies where the source is
ambiguous). All randomness derives from ``seed``.

Formats: ``azure-v1-vms``, ``alibaba-openb``, ``alibaba-dlrm``,
``bitbrains-rnd``, ``azure-v1-cpu``, ``google-2011-gcd``, ``planetlab`` and
``jsonl`` (canonical events, as written by ``lavad.streams.trace_tools``).
"""

from lavad.streams.adapters.base import Trace, TraceFormatError, TraceItem, TraceOptionError
from lavad.streams.adapters.registry import FORMATS, detect_format, open_trace

__all__ = [
    "FORMATS",
    "Trace",
    "TraceFormatError",
    "TraceItem",
    "TraceOptionError",
    "detect_format",
    "open_trace",
]
