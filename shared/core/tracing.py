"""OpenTelemetry: one trace per event, from the webhook through the drain, admission and every
step of the run, however late a step runs; and a few metrics. The one home: entry points and
engines call `span`, `annotate`, `stamp`, `count`, `record` and `gauge` here, nothing else.

Off by default (`ONCEFLOW_TRACING=off`), and off costs nothing: no OpenTelemetry module is
imported, `span` returns one shared no-op context manager, `stamp` sends nothing, the stored
context is never read (tests/test_tracing.py proves the SDK stays unimported). `gcp` exports
spans to Cloud Trace and metrics to Cloud Monitoring (Google's exporters, batched off the
request path); `console` prints both to stdout for the local stack.

How the context travels (W3C `traceparent`, the format Cloud Trace reads too):
- the webhook's span continues the caller's `traceparent` header when it sends one;
- every row the event causes records the context of the span that wrote it (the
  `trace_context` columns of migrations/0530_trace_context.sql, filled by `stamp` through a
  transaction-local setting, so no INSERT names it): the inbox row, the trigger event, the run
  and its steps;
- the next hop resumes from its row (the drain from the inbox row, admission from the event,
  a step from its own row — so a step woken hours later, after a wait or a delay, joins the
  trace it began in), or from the Pub/Sub message's `traceparent` attribute when the message
  was published inside the span (`message_attributes`, `from_message`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from shared.core import queries
from shared.core.logs import get_logger
from shared.core.settings import settings

if TYPE_CHECKING:
    from shared.core.db import Tx

SQL = queries.load("tracing")
STAMP = SQL["tracing_stamp"]
STORED = {
    "inbox": SQL["tracing_inbox_context"],
    "event": SQL["tracing_event_context"],
    "step": SQL["tracing_step_context"],
}
TRACEPARENT = "traceparent"
log = get_logger(__name__)
_NOOP: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class _On:
    """The SDK objects, built once when tracing is on (imports happen only here)."""

    def __init__(self, span_exporter: Any, metric_reader: Any, sample_ratio: float) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create({"service.name": "onceflow"})
        # Parent-based: a trace's first span decides (the ratio), every later hop follows the
        # sampled flag of the traceparent it resumes from, so an event is traced whole or not.
        sampler = ParentBased(TraceIdRatioBased(sample_ratio))
        self.tracer_provider = TracerProvider(resource=resource, sampler=sampler)
        processor = (
            SimpleSpanProcessor(span_exporter)
            if type(span_exporter).__name__ in ("InMemorySpanExporter", "ConsoleSpanExporter")
            else BatchSpanProcessor(span_exporter)
        )
        self.tracer_provider.add_span_processor(processor)
        self.tracer = self.tracer_provider.get_tracer("onceflow")
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[metric_reader])
        meter = self.meter_provider.get_meter("onceflow")
        self.propagator = TraceContextTextMapPropagator()
        self.counters = {
            "onceflow.runs.started": meter.create_counter(
                "onceflow.runs.started", unit="{run}", description="Runs admitted and started."
            ),
            "onceflow.runs.failed": meter.create_counter(
                "onceflow.runs.failed", unit="{run}", description="Runs that ended failed."
            ),
        }
        self.histograms = {
            "onceflow.step.duration": meter.create_histogram(
                "onceflow.step.duration",
                unit="s",
                description="Time one step took, claim to settle (block included).",
            ),
        }
        self.gauges = {
            "onceflow.backlog.age": meter.create_gauge(
                "onceflow.backlog.age",
                unit="s",
                description="Age of the oldest unfinished work per queue (the sweep's report).",
            ),
        }

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


_on: _On | None = None
_decided = False
_lock = threading.Lock()


def _exporters(mode: str) -> tuple[Any, Any]:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if mode == "gcp":
        # Google's exporters: Cloud Trace (opentelemetry-exporter-gcp-trace) and Cloud
        # Monitoring (opentelemetry-exporter-gcp-monitoring); the project comes from the
        # runtime's credentials, like every other Google client here.
        from opentelemetry.exporter.cloud_monitoring import CloudMonitoringMetricsExporter
        from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

        # Cloud Monitoring accepts one point per series every 5 s at most; a minute is plenty.
        spans = CloudTraceSpanExporter()  # type: ignore[no-untyped-call]
        return spans, PeriodicExportingMetricReader(
            CloudMonitoringMetricsExporter(), export_interval_millis=60_000
        )
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    return ConsoleSpanExporter(), PeriodicExportingMetricReader(
        ConsoleMetricExporter(), export_interval_millis=60_000
    )


def _state() -> _On | None:
    """The SDK when tracing is on; None when off. Decided once per process (per `reset`)."""
    global _on, _decided  # noqa: PLW0603 - one provider per process
    if _decided:
        return _on
    with _lock:
        if not _decided:
            mode = settings().tracing
            try:
                ratio = settings().tracing_sample_ratio
                _on = None if mode == "off" else _On(*_exporters(mode), ratio)
            except Exception as exc:
                # Telemetry never fails a delivery: no credentials for Cloud Trace (a local
                # run with `gcp`), say, leaves this process untraced, once, with the reason.
                log.warning("tracing %s could not start, tracing off: %r", mode, exc)
                _on = None
            _decided = True
    return _on


def configure(span_exporter: Any, metric_reader: Any, *, sample_ratio: float = 1.0) -> None:
    """Turn tracing on with these exporters (tests: the SDK's in-memory ones)."""
    global _on, _decided
    with _lock:
        if _on is not None:
            _on.shutdown()
        _on, _decided = _On(span_exporter, metric_reader, sample_ratio), True


def reset() -> None:
    """Forget the decision: the next use reads `ONCEFLOW_TRACING` again (tests)."""
    global _on, _decided
    with _lock:
        if _on is not None:
            _on.shutdown()
        _on, _decided = None, False


def enabled() -> bool:
    return _state() is not None


def span(
    name: str,
    *,
    headers: Mapping[str, str] | None = None,
    stored: Callable[[], str | None] | None = None,
    **attributes: Any,
) -> contextlib.AbstractContextManager[Any]:
    """A span around the block; with tracing off, a shared no-op (nothing built, nothing read).

    Its parent: the `traceparent` in `headers` (a webhook's caller, a Pub/Sub message's
    attributes) when there is one; else the span already current (an entry point's, opened
    from the message); else the context `stored()` reads from the row this hop works on
    (called only then: a step run in-process, a drain in the nudge's thread)."""
    on = _state()
    if on is None:
        return _NOOP
    return _span(on, name, headers, stored, attributes)


@contextlib.contextmanager
def _span(
    on: _On,
    name: str,
    headers: Mapping[str, str] | None,
    stored: Callable[[], str | None] | None,
    attributes: Mapping[str, Any],
) -> Iterator[Any]:
    from opentelemetry import trace

    parent = _traceparent_in(headers) if headers is not None else None
    if (
        parent is None
        and stored is not None
        and not trace.get_current_span().get_span_context().is_valid
    ):
        parent = stored()
    context = on.propagator.extract({TRACEPARENT: parent}) if parent else None
    with on.tracer.start_as_current_span(
        name, context=context, attributes=_attributes(attributes)
    ) as current:
        yield current


def _traceparent_in(headers: Mapping[str, str]) -> str | None:
    for key, value in headers.items():
        if key.lower() == TRACEPARENT and value:
            return str(value)
    return None


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {
        f"onceflow.{k}": v if isinstance(v, bool | int | float) else str(v)
        for k, v in attributes.items()
        if v is not None
    }


def annotate(name: str | None = None, *, error: str | None = None, **attributes: Any) -> None:
    """Name the current span (e.g. after the block it turned out to run), add attributes, and
    mark it failed with `error` (a step that settled failed raised nothing the span saw)."""
    if _state() is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if name is not None:
        current.update_name(name)
    current.set_attributes(_attributes(attributes))
    if error is not None:
        current.set_status(trace.Status(trace.StatusCode.ERROR, error))


def traceparent() -> str | None:
    """The current span's W3C `traceparent`; None when off or outside any span."""
    on = _state()
    if on is None:
        return None
    carrier: dict[str, str] = {}
    on.propagator.inject(carrier)
    return carrier.get(TRACEPARENT)


def stamp(tx: Tx) -> None:
    """The rows this transaction inserts record the current span's context (see the module
    docstring). Rides ahead of the transaction's next statement: no round trip of its own."""
    context = traceparent()
    if context is not None:
        tx.ahead(STAMP, context=context)


def stored(tx: Tx, kind: str, row_id: Any) -> str | None:
    """The context recorded with an `inbox`, `event` or `step` row (None: none recorded)."""
    value = tx.scalar(STORED[kind], id=row_id)
    return None if value is None else str(value)


def stored_in(db: Any, kind: str, row_id: Any) -> Callable[[], str | None]:
    """`stored` in a transaction of its own, deferred: for `span(stored=...)`."""

    def read() -> str | None:
        with db.transaction() as tx:
            return stored(tx, kind, row_id)

    return read


def message_attributes() -> dict[str, str]:
    """Pub/Sub attributes carrying the current context; {} when off or outside a span."""
    context = traceparent()
    return {} if context is None else {TRACEPARENT: context}


def message_span(name: str, cloud_event_data: Any) -> contextlib.AbstractContextManager[Any]:
    """The span of a pushed Pub/Sub message that carries a `traceparent` attribute; the no-op
    when it carries none (an outbox batch published outside any span): then the hop's own
    span resumes from its row instead of starting a trace of its own."""
    if _state() is None:
        return _NOOP
    message = cloud_event_data.get("message") if isinstance(cloud_event_data, Mapping) else None
    found = message.get("attributes") if isinstance(message, Mapping) else None
    attributes = {str(k): str(v) for k, v in found.items()} if isinstance(found, Mapping) else {}
    if _traceparent_in(attributes) is None:
        return _NOOP
    return span(name, headers=attributes)


def count(metric: str, amount: int = 1, **attributes: Any) -> None:
    on = _state()
    if on is not None and amount:
        on.counters[metric].add(amount, _attributes(attributes))


def record(metric: str, value: float, **attributes: Any) -> None:
    on = _state()
    if on is not None:
        on.histograms[metric].record(value, _attributes(attributes))


def timed(metric: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """Record how long the block took in the histogram `metric`; the shared no-op when off."""
    on = _state()
    if on is None:
        return _NOOP
    return _timed(on, metric, attributes)


@contextlib.contextmanager
def _timed(on: _On, metric: str, attributes: Mapping[str, Any]) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        on.histograms[metric].record(time.monotonic() - started, _attributes(attributes))


def gauge(metric: str, value: float, **attributes: Any) -> None:
    on = _state()
    if on is not None:
        on.gauges[metric].set(value, _attributes(attributes))
