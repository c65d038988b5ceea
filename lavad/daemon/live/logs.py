"""structlog configuration for the daemon: JSON lines (or console) on stderr."""

from __future__ import annotations

import logging
import sys
from typing import Any, BinaryIO

import orjson
import structlog

from lavad.daemon.settings import LogSettings


class _SinkHandler(logging.Handler):
    """Writes stdlib records, rendered by structlog, to the byte sink structlog writes to."""

    def __init__(self, sink: BinaryIO) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.write(self.format(record).encode("utf-8", "replace") + b"\n")
            self.sink.flush()
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


def configure_logging(settings: LogSettings, sink: BinaryIO | None = None) -> None:
    """Log to stderr, or to ``sink`` (the demo keeps the terminal for its live table).

    Libraries' stdlib logging (aiokafka's connection errors, asyncio's) and
    Python warnings go through the same processors, so every line on the
    sink has one format (JSON lines by default).
    """
    level = getattr(logging, settings.level.upper())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    _route_stdlib(settings, sink or sys.stderr.buffer, shared, level)
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


def _route_stdlib(
    settings: LogSettings,
    sink: BinaryIO,
    shared: list[structlog.types.Processor],
    level: int,
) -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer(serializer=_orjson_text)
        if settings.format == "json"
        else structlog.dev.ConsoleRenderer(colors=sink is sys.stderr.buffer)
    )
    handler = _SinkHandler(sink)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        )
    )
    root = logging.getLogger()
    # Replace our previous handler only (a re-configured demo, tests): other
    # handlers on the root logger (pytest's capture) stay.
    for old in [h for h in root.handlers if isinstance(h, _SinkHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries' info lines (aiokafka's group protocol step by step) repeat
    # what lavad logs itself; their warnings and errors always show, and
    # everything does at debug.
    root.setLevel(level if level <= logging.DEBUG else max(level, logging.WARNING))
    logging.captureWarnings(True)


def _orjson_text(obj: Any, **options: Any) -> str:
    # The formatter's last processor must return text; orjson keeps the same
    # compact form as lavad's own lines.
    return orjson.dumps(obj, **options).decode()
