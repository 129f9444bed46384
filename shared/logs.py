"""Structured logs: one JSON object per line on stdout, in Cloud Logging's shape.

Cloud Run forwards stdout to Cloud Logging, which reads `severity`, `message`,
`logging.googleapis.com/trace` and `logging.googleapis.com/labels` from each JSON line. Labels
(`event_id`, `run_id`, `step_id`, `tenant`) come from a context variable, so code deep in the
engine logs with the ids of the work it is doing without passing them around.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

LABEL_KEYS = ("event_id", "run_id", "step_id", "tenant", "connection_id", "inbox_id", "function")
_labels: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar(
    "labels",
    default={},  # noqa: B039 - never mutated: labelled() always sets a new dict
)
_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace", default=None)


class CloudLoggingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "severity": record.levelname if record.levelname != "WARNING" else "WARNING",
            "message": record.getMessage(),
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "logger": record.name,
        }
        labels = dict(_labels.get())
        extra = getattr(record, "labels", None)
        if isinstance(extra, Mapping):
            labels.update({k: str(v) for k, v in extra.items() if v is not None})
        if labels:
            entry["logging.googleapis.com/labels"] = labels
        trace = _trace.get()
        if trace:
            entry["logging.googleapis.com/trace"] = trace
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


_configured = False


def configure() -> None:
    """Route the root logger to stdout as JSON lines (idempotent)."""
    global _configured  # noqa: PLW0603 - configure once per process
    if _configured:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(CloudLoggingFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(os.environ.get("LOG_LEVEL", "INFO"))
    _configured = True


def get_logger(name: str) -> logging.Logger:
    configure()
    return logging.getLogger(name)


@contextmanager
def labelled(**labels: Any) -> Iterator[None]:
    """Add labels to every log line written inside the block."""
    merged = dict(_labels.get())
    merged.update({k: str(v) for k, v in labels.items() if v is not None})
    token = _labels.set(merged)
    try:
        yield
    finally:
        _labels.reset(token)


def trace_from_headers(headers: Mapping[str, str], project: str | None = None) -> str | None:
    """The Cloud Logging trace name from `X-Cloud-Trace-Context` or W3C `traceparent`."""
    project = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("GCP_PROJECT")
    trace_id: str | None = None
    cloud = headers.get("X-Cloud-Trace-Context") or headers.get("x-cloud-trace-context")
    if cloud:
        trace_id = cloud.split("/", 1)[0].strip() or None
    else:
        parent = headers.get("traceparent") or headers.get("Traceparent")
        if parent:
            parts = parent.split("-")
            if len(parts) >= 4 and len(parts[1]) == 32:
                trace_id = parts[1]
    if not trace_id:
        return None
    return f"projects/{project}/traces/{trace_id}" if project else trace_id


@contextmanager
def traced(headers: Mapping[str, str]) -> Iterator[None]:
    token = _trace.set(trace_from_headers(headers))
    try:
        yield
    finally:
        _trace.reset(token)
