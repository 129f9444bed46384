"""OpenTelemetry (shared/core/tracing.py, issue 30 item 5): one trace per event on the real
path — a signed HubSpot webhook to the real webhook function, the inbox drained, the event
admitted, the run's steps advanced by the real step engine — whose context the rows carry, so a
step woken after its delay joins the same trace; a few metrics; and off costs nothing."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import functions_framework
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from shared.admission import admit as admission
from shared.core import tracing
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ingest.inbox import drain_inbox
from shared.steps.repairs import wake_due_steps
from tests.admission_support import (
    activate_text,
    bind_workflow,
    emit_event,
    make_tenant,
)
from tests.admission_support import make_connection as plain_connection
from tests.ingest_support import (
    HUBSPOT_SECRET,
    hubspot_body,
    hubspot_event,
    hubspot_v3_headers,
    make_connection,
    trigger_events,
    webhook_client,
)
from tests.pubsub_emulator import PubsubProject
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import definition, publish_version, start_run
from tests.test_steps_engine import Queue, make_past

ROOT = Path(__file__).resolve().parent.parent
BASE = "https://hooks.example.com"
WORKFLOW = """\
name: traced
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
steps:
  - id: first
    type: branch
    branches:
      - {when: '1 > 2', next: last}
    otherwise: later
  - id: later
    type: delay
    config: {hours: 3}
    next: last
  - id: last
    type: end
"""


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[InMemorySpanExporter, Any]]:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")  # the test drains the inbox itself
    monkeypatch.setenv("HUBSPOT_SECRET_ACME", HUBSPOT_SECRET)
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracing.configure(exporter, reader)
    try:
        yield exporter, reader
    finally:
        tracing.reset()


def _deliver(db: Database, connection_id: str, caller: str | None = None) -> int:
    """A person changes a contact; HubSpot's signed webhook reaches the real function; the
    drain stores the event. The event's id."""
    path = f"/hubspot/{connection_id}"
    body = hubspot_body(hubspot_event(1))
    answer = webhook_client().post(
        path,
        data=body,
        headers={
            **hubspot_v3_headers(body, BASE + path),
            **({"traceparent": caller} if caller else {}),
        },
        base_url=BASE,
    )
    assert answer.status_code == 200, answer.data
    drain_inbox(db, budget_seconds=10, until_empty=True)
    (event,) = trigger_events(db)
    return int(event["id"])


CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


def test_one_trace_from_the_webhook_to_the_run_after_its_delay(
    db: Database, spans: tuple[InMemorySpanExporter, Any]
) -> None:
    exporter, reader = spans
    connection_id = make_connection(db)
    workflow_id = activate_text(db, WORKFLOW)
    event_id = _deliver(db, connection_id, CALLER)
    queue = Queue()
    lookup = block_lookup(Recorder())
    (outcome,) = admission.admit_event(db, event_id, publish=queue).outcomes
    assert outcome.outcome == "admitted" and outcome.run_id is not None
    queue.drain(db, lookup)  # `first`, then `later` parks on its 3-hour delay
    with db.transaction() as tx:
        stored = tx.all(
            "SELECT step_key, trace_context FROM workflow_steps WHERE run_id = :r", r=outcome.run_id
        )
    assert {r["step_key"] for r in stored} == {"first", "later"}
    assert all(r["trace_context"].split("-")[1] == CALLER_TRACE for r in stored), stored
    before_wait = {s.name for s in exporter.get_finished_spans()}
    every = list(exporter.get_finished_spans())

    # Hours later, on whatever instance: the sweep wakes the step; nothing in memory survives
    # but its row, and its span still joins the trace.
    exporter.clear()
    make_past(db, outcome.run_id)
    wake_due_steps(db, SweepConfig(), queue, SweepReport())
    queue.drain(db, lookup)
    after_wait = exporter.get_finished_spans()
    with db.transaction() as tx:
        run = tx.one("SELECT status FROM workflow_runs WHERE id = :r", r=outcome.run_id)
    assert run is not None and run["status"] == "succeeded"

    assert {"webhook", "drain", "admit", "block branch", "block delay"} <= before_wait
    assert {s.name for s in after_wait} >= {"block delay", "block end"}
    every += after_wait
    assert {f"{s.context.trace_id:032x}" for s in every} == {CALLER_TRACE}
    last = next(s for s in after_wait if s.attributes and s.attributes["onceflow.step"] == "last")
    assert last.attributes is not None
    assert last.attributes["onceflow.run_id"] == outcome.run_id
    assert last.attributes["onceflow.workflow_id"] == workflow_id
    assert last.attributes["onceflow.tenant"] == "acme"
    assert last.attributes["onceflow.block"] == "end"
    assert str(last.attributes["onceflow.record"]).endswith("101")
    # The resumed step's parent is the span of the step that created its row (`first`).
    assert last.parent is not None

    metrics = _metric_points(reader)
    assert metrics["onceflow.runs.started"] == 1
    assert metrics["onceflow.step.duration"] >= 3  # first, later (twice: park, serve), last


def test_a_step_written_outside_any_span_joins_the_trace_of_its_runs_event(
    db: Database, spans: tuple[InMemorySpanExporter, Any]
) -> None:
    """The sweep starts a debounced or queued run outside any span, so its rows carry no
    context (simulated here by clearing what admission stored): its steps resume from the
    event that caused the run, not from a trace of their own."""
    exporter, _ = spans
    make_tenant(db)
    bind_workflow(db, "late", steps=[{"id": "only", "type": "end"}])
    with tracing.span("webhook", headers={"traceparent": CALLER}):
        event_id = emit_event(db, connection_id=plain_connection(db))
    queue = Queue()
    (outcome,) = admission.admit_event(db, event_id, publish=queue).outcomes
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_runs SET trace_context = NULL WHERE id = :r", r=outcome.run_id)
        tx.execute(
            "UPDATE workflow_steps SET trace_context = NULL WHERE run_id = :r", r=outcome.run_id
        )
    exporter.clear()
    queue.drain(db, block_lookup(Recorder()))
    (step,) = exporter.get_finished_spans()
    assert step.name == "block end"
    assert f"{step.context.trace_id:032x}" == CALLER_TRACE


def test_a_failed_step_marks_its_span_and_counts_the_failed_run(
    db: Database, spans: tuple[InMemorySpanExporter, Any]
) -> None:
    exporter, reader = spans
    version = publish_version(
        db,
        definition(
            [
                {"id": "a", "type": "test.noop", "next": "b"},
                {"id": "b", "type": "test.fail_permanent"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    queue = Queue()
    queue(first)
    queue.drain(db, block_lookup(Recorder()))
    by_step = {
        s.attributes["onceflow.step"]: s
        for s in exporter.get_finished_spans()
        if s.attributes and "onceflow.step" in s.attributes
    }
    assert by_step["a"].status.status_code is StatusCode.UNSET
    assert by_step["b"].status.status_code is StatusCode.ERROR
    assert by_step["b"].attributes is not None
    assert by_step["b"].attributes["onceflow.outcome"] == "HTTP_400"
    assert by_step["b"].attributes["onceflow.run_id"] == run_id
    assert _metric_points(reader)["onceflow.runs.failed"] == 1


def test_an_event_left_out_by_the_sample_ratio_is_left_out_at_every_hop(
    db: Database, spans: tuple[InMemorySpanExporter, Any]
) -> None:
    """Sampled at the webhook or not at all: the stored `traceparent` carries the decision to
    the drain, admission and the steps, so an event is never traced in part."""
    exporter, _ = spans
    tracing.configure(exporter, InMemoryMetricReader(), sample_ratio=0.0)
    connection_id = make_connection(db)
    activate_text(db, WORKFLOW)
    event_id = _deliver(db, connection_id, caller=None)
    queue = Queue()
    admission.admit_event(db, event_id, publish=queue)
    queue.drain(db, block_lookup(Recorder()))
    assert exporter.get_finished_spans() == ()
    with db.transaction() as tx:
        stored = [r["trace_context"] for r in tx.all("SELECT trace_context FROM workflow_steps")]
    # One trace still (its id in every row), its W3C `sampled` flag (bit 0) off in each.
    assert len({c.split("-")[1] for c in stored}) == 1, stored
    assert all(int(c.split("-")[3], 16) & 1 == 0 for c in stored), stored


def _push(message: Any, subscription: str) -> dict[str, Any]:
    """What a push subscription POSTs for a pulled message, attributes included."""
    return {
        "subscription": subscription,
        "message": {
            "data": base64.b64encode(message.data).decode(),
            "attributes": dict(message.attributes),
            "messageId": message.message_id,
            "publishTime": "2026-12-04T00:00:00Z",
        },
    }


def _pull_one(pubsub: PubsubProject, topic: str) -> Any:
    subscriber = pubsub._subscriber()
    path = pubsub.subscription_path(f"{topic}-test")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        answer = subscriber.pull(request={"subscription": path, "max_messages": 1}, timeout=5)
        for received in answer.received_messages:
            subscriber.acknowledge(request={"subscription": path, "ack_ids": [received.ack_id]})
            return received.message
    raise AssertionError(f"nothing on {topic}")


def test_the_trace_rides_the_pubsub_attributes_between_the_functions(
    db: Database, pubsub: PubsubProject, spans: tuple[InMemorySpanExporter, Any]
) -> None:
    """A trigger-events push carrying `traceparent`: admission continues it, the step-ready
    message it publishes carries it on, and the step pushed to `advance_step` joins it."""
    exporter, _ = spans
    make_tenant(db)
    bind_workflow(db, "pushed")
    event_id = emit_event(db, connection_id=plain_connection(db))  # written outside any span
    data = base64.b64encode(json.dumps({"event_id": event_id}).encode()).decode()
    admit = functions_framework.create_app("admit_event", str(ROOT / "main.py"), "cloudevent")
    body = {
        "subscription": "projects/p/subscriptions/admit",
        "message": {
            "data": data,
            "attributes": {"traceparent": CALLER},
            "messageId": "m1",
            "publishTime": "2026-12-04T00:00:00Z",
        },
    }
    assert admit.test_client().post("/", json=body).status_code == 200

    message = _pull_one(pubsub, "step-ready")
    assert message.attributes["traceparent"].split("-")[1] == CALLER_TRACE
    advance = functions_framework.create_app("advance_step", str(ROOT / "main.py"), "cloudevent")
    answer = advance.test_client().post("/", json=_push(message, "projects/p/subscriptions/s"))
    assert answer.status_code == 200

    finished = exporter.get_finished_spans()
    names = [s.name for s in finished]
    assert {"admit_event", "admit", "advance_step", "block end"} <= set(names), names
    assert {f"{s.context.trace_id:032x}" for s in finished} == {CALLER_TRACE}


def _metric_points(reader: Any) -> dict[str, float]:
    """Counter sums and histogram counts by metric name."""
    found: dict[str, float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    amount = point.count if value is None else value
                    found[metric.name] = found.get(metric.name, 0) + amount
    return found


def test_off_the_sdk_is_never_imported_and_spans_are_one_shared_no_op() -> None:
    """Every entry point loaded, a span opened, a step timed: no OpenTelemetry SDK module in the
    process, no provider, and `span` hands back the same object every time."""
    probe = (
        "import sys, main\n"
        "from shared.core import tracing\n"
        "a = tracing.span('x', run_id='r'); b = tracing.timed('onceflow.step.duration')\n"
        "with a, b: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')),"
        " a is b, tracing.enabled(), tracing.traceparent())\n"
    )
    env = {"PATH": "/usr/bin:/bin", "NO_GCE_CHECK": "true", "ONCEFLOW_TRACING": "off"}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] True False None"


def test_off_a_span_costs_about_a_function_call() -> None:
    """A microbenchmark, printed: `span` off against an empty function call, and every
    tracing call one step makes when off (span, stored context, timer, attributes, stamp's
    check, the publish's attributes) — against a step's own few milliseconds."""
    tracing.reset()

    def empty(name: str, **attributes: Any) -> None:
        return None

    n = 100_000
    started = time.perf_counter()
    for _ in range(n):
        empty("step", run_id="r")
    bare = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(n):
        with tracing.span("step", run_id="r"):
            pass
    off = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(n):
        stored = tracing.stored_in(None, "step", "s")
        with tracing.span("step", stored=stored), tracing.timed("m", block="end"):
            tracing.enabled()
            tracing.traceparent()  # what stamp() checks, twice a step at most
            tracing.message_attributes()
            tracing.count("onceflow.runs.failed", tenant="acme")
    per_step = time.perf_counter() - started
    print(
        json.dumps(
            {
                "call_ns": round(bare / n * 1e9),
                "span_off_ns": round(off / n * 1e9),
                "ratio": round(off / bare, 1),
                "tracing_off_per_step_ns": round(per_step / n * 1e9),
            }
        )
    )
    assert off < bare * 20  # a call and a `with` of the shared nullcontext, nothing built
