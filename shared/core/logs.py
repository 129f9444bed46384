"""Structured logs: one JSON object per line on stdout, in Cloud Logging's shape.

Cloud Run forwards stdout to Cloud Logging, which reads `severity`, `message`,
`logging.googleapis.com/trace` and `logging.googleapis.com/labels` from each JSON line. Labels
(`event_id`, `run_id`, `step_id`, `tenant`) come from a context variable, so code deep in the
engine logs with the ids of the work it is doing without passing them around.

Some lines are *events* that alerts count (`log_event`): they carry `event` and their fields
at the top of the JSON payload, so a log-based metric in `infra/monitoring.tf` matches
`jsonPayload.event="run_failed"` and extracts `jsonPayload.outbox_oldest_seconds`. `EVENTS` is
the one list of those names and fields; tests/test_log_events.py checks that the engine emits
each in this shape and tests/test_infra.py that every metric matches one.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from shared.core.settings import settings

LABEL_KEYS = ("event_id", "run_id", "step_id", "tenant", "connection_id", "inbox_id", "function")
_labels: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar(
    "labels",
    default={},  # noqa: B039 - never mutated: labelled() always sets a new dict
)
_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace", default=None)


class LogEvent(StrEnum):
    """Structured log lines that alerts match (infra/monitoring.tf)."""

    # A run ended failed: a step failed for good, or its lease expired with no attempts left.
    RUN_FAILED = "run_failed"
    # A workflow's circuit breaker opened after consecutive failed runs (shared/gates/breaker.py):
    # its events are refused `workflow_paused` until someone resumes it.
    BREAKER_TRIPPED = "breaker_tripped"
    # Work put aside because it can never succeed. `kind`: `inbox_row` (an inbox row marked
    # dead), `poisoned_message` (a Pub/Sub message recorded in poisoned_messages),
    # `undelivered_event` (a trigger event the sweep gave up re-publishing). Pub/Sub's own
    # dead-letter topics are watched through their hold subscriptions' backlog instead.
    DEAD_LETTERED = "dead_lettered"
    # The sweep reclaimed a running step whose lease expired (its process died or hung).
    LEASE_EXPIRED = "lease_expired"
    # The sweep's periodic report of how old the oldest unfinished work is, in seconds
    # (0 when there is none).
    BACKLOG_AGE = "backlog_age"


EVENTS: dict[LogEvent, tuple[str, ...]] = {
    LogEvent.RUN_FAILED: ("run_id", "outcome_code"),
    LogEvent.BREAKER_TRIPPED: ("workflow_id", "reason"),
    LogEvent.DEAD_LETTERED: ("kind", "reason"),
    LogEvent.LEASE_EXPIRED: ("step_id", "run_id", "outcome"),
    LogEvent.BACKLOG_AGE: (
        "inbox_oldest_seconds",
        "outbox_oldest_seconds",
        "steps_oldest_pending_seconds",
    ),
}
# Keys of the JSON line itself; an event field may not shadow one (tests/test_log_events.py).
ENTRY_KEYS = frozenset({"severity", "message", "time", "logger", "event", "exception"})


class CloudLoggingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "severity": record.levelname if record.levelname != "WARNING" else "WARNING",
            "message": record.getMessage(),
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        if isinstance(event, str):
            entry["event"] = event
            entry.update(getattr(record, "event_fields", {}))
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
    root.setLevel(settings().log_level)
    # httpx logs every request URL at INFO, and HubSpot's developer API key travels in the
    # query string (`hapikey`): a secret must never reach the logs.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    _configured = True


def get_logger(name: str) -> logging.Logger:
    configure()
    return logging.getLogger(name)


def log_event(
    logger: logging.Logger,
    event: LogEvent,
    message: str,
    *,
    level: int = logging.INFO,
    **fields: Any,
) -> None:
    """Write one `event` line with exactly the fields `EVENTS` declares for it.

    A missing or unexpected field is a programming error (an alert would silently stop
    matching), so it raises instead of logging a line of the wrong shape."""
    expected = EVENTS[event]
    if set(fields) != set(expected):
        raise ValueError(f"{event} takes fields {expected}, got {tuple(sorted(fields))}")
    logger.log(
        level,
        message,
        extra={"event": str(event), "event_fields": {k: fields[k] for k in expected}},
    )


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
    project = project or settings().project
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
