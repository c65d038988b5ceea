"""structlog configuration for the daemon: JSON lines (or console) on stderr."""

from __future__ import annotations

import logging
import sys
from typing import Any, BinaryIO

import orjson
import structlog

from lavad.daemon.settings import LogSettings


def configure_logging(settings: LogSettings, sink: BinaryIO | None = None) -> None:
    """Log to stderr, or to ``sink`` (the demo keeps the terminal for its live table)."""
    level = getattr(logging, settings.level.upper())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if settings.format == "json":
        structlog.configure(
            processors=[*shared, structlog.processors.JSONRenderer(serializer=orjson.dumps)],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=structlog.BytesLoggerFactory(sink or sys.stderr.buffer),
            cache_logger_on_first_use=True,
        )
    else:
        structlog.configure(
            processors=[
                *shared,
                structlog.dev.ConsoleRenderer(colors=sink is None),
                _to_bytes,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=structlog.BytesLoggerFactory(sink or sys.stderr.buffer),
            cache_logger_on_first_use=True,
        )


def _to_bytes(_logger: object, _method: str, rendered: Any) -> bytes:
    # After ConsoleRenderer the "event dict" is the rendered line.
    return str(rendered).encode("utf-8", "replace")
