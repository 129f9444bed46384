"""The structured log lines the alerts in infra/monitoring.tf count keep their shape.

Each test drives the real engine path that should emit an event (real Postgres) and reads the
line as Cloud Logging would: the record formatted by CloudLoggingFormatter into JSON, with
`event` and the fields shared/core/logs.py declares at the top of the payload.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.core.logs import ENTRY_KEYS, EVENTS, CloudLoggingFormatter, LogEvent, log_event
from shared.steps.advance import advance_from_message, advance_step
from shared.steps.claim import LeaseConfig
from shared.sweep.backlog import report_backlog
from shared.sweep.loop import run_sweep
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import chain, definition, publish_version, start_run

LEASE = LeaseConfig(lease_seconds=60, heartbeat_seconds=30)
FORMAT = CloudLoggingFormatter()


def events(caplog: pytest.LogCaptureFixture, event: LogEvent) -> list[dict[str, Any]]:
    lines = [json.loads(FORMAT.format(r)) for r in caplog.records]
    found = [line for line in lines if line.get("event") == str(event)]
    for line in found:
        for name in EVENTS[event]:
            assert name in line, f"{event} line without its field {name}: {line}"
        assert line["severity"] and line["message"]
    return found


def test_an_event_line_carries_its_name_and_fields_at_the_top_of_the_payload() -> None:
    logger = logging.getLogger("test.events")
    record = logger.makeRecord(
        "test.events",
        logging.WARNING,
        __file__,
        1,
        "msg",
        (),
        None,
        extra={"event": "run_failed", "event_fields": {"run_id": "r", "outcome_code": "X"}},
    )
    line = json.loads(FORMAT.format(record))
    assert (line["event"], line["run_id"], line["outcome_code"]) == ("run_failed", "r", "X")
    assert line["severity"] == "WARNING" and line["message"] == "msg"


def test_an_event_with_the_wrong_fields_is_refused_not_logged() -> None:
    logger = logging.getLogger("test.events")
    with pytest.raises(ValueError, match="run_failed takes fields"):
        log_event(logger, LogEvent.RUN_FAILED, "m", run_id="r")
    with pytest.raises(ValueError, match="takes fields"):
        log_event(logger, LogEvent.RUN_FAILED, "m", run_id="r", outcome_code="X", extra=1)


def test_no_event_field_shadows_a_key_of_the_log_entry() -> None:
    for event, fields in EVENTS.items():
        assert not set(fields) & ENTRY_KEYS, event
        assert all(f.isidentifier() and f.islower() for f in fields), event


def test_breaker_tripped_names_the_workflow() -> None:
    # The breaker (shared/gates/breaker.py) emits it; tests/test_breaker.py checks the real line.
    assert EVENTS[LogEvent.BREAKER_TRIPPED] == ("workflow_id", "reason")


def _crash(db: Database, step_id: str, attempt: int) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'running', attempt = :a,"
            " lease_id = gen_random_uuid(), lease_expires_at = now() - interval '5 seconds',"
            " started_at = now() - interval '11 min' WHERE id = :i",
            a=attempt,
            i=step_id,
        )


def test_sweep_logs_lease_expired_and_run_failed_when_attempts_are_used_up(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    version = publish_version(db, definition(chain(2, "test.noop")))
    _, (retried,) = start_run(db, version)
    failed_run, (exhausted,) = start_run(db, version)
    _crash(db, retried, attempt=1)
    _crash(db, exhausted, attempt=50)  # beyond any block's max_attempts
    caplog.set_level(logging.INFO)
    config = SweepConfig(batch=50, poll_seconds=0.05)
    run_sweep(db, 0, config=config, dispatch=lambda ids: None, duties=[])

    expired = {line["step_id"]: line for line in events(caplog, LogEvent.LEASE_EXPIRED)}
    assert expired[retried]["outcome"] == "pending"
    assert expired[exhausted]["outcome"] == "LEASE_EXPIRED"
    failed = events(caplog, LogEvent.RUN_FAILED)
    assert [(f["run_id"], f["outcome_code"]) for f in failed] == [(failed_run, "LEASE_EXPIRED")]


def test_a_step_that_fails_for_good_logs_run_failed_once(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    version = publish_version(db, definition(chain(1, "test.fail_permanent")))
    run_id, (step_id,) = start_run(db, version)
    caplog.set_level(logging.INFO)
    lookup = block_lookup(Recorder())
    advance_step(db, step_id, lookup=lookup, dispatch=lambda ids: None, config=LEASE)
    # Run it twice: the second delivery changes nothing and must not page again.
    advance_step(db, step_id, lookup=lookup, dispatch=lambda ids: None, config=LEASE)
    failed = events(caplog, LogEvent.RUN_FAILED)
    assert [f["run_id"] for f in failed] == [run_id]
    assert failed[0]["severity"] == "WARNING"


def test_a_poisoned_message_logs_dead_lettered(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    bad = {"message": {"data": "!!!", "messageId": "m-poison"}, "subscription": "s"}
    assert advance_from_message(db, bad, message_id="m-poison") is None
    (line,) = events(caplog, LogEvent.DEAD_LETTERED)
    assert line["kind"] == "poisoned_message" and line["reason"]


def test_the_backlog_report_gives_the_age_of_each_queue(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.ops_support import seed_connection, seed_tenant

    tenant = "t-backlog-log"
    seed_tenant(db, tenant)
    connection = seed_connection(db, tenant)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO webhook_inbox (connection_id, body_sha256, body, received_at)"
            " VALUES (:c, sha256('backlog-log'::bytea), 'x', now() - interval '10 minutes')",
            c=connection,
        )
        tx.execute(
            "INSERT INTO workflow_trigger_events (tenant_id, event_type, payload, created_at)"
            " VALUES (:t, 'test.backlog', '{}', now() - interval '20 minutes')",
            t=tenant,
        )
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (step_id,) = start_run(db, version)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET created_at = now() - interval '30 minutes' WHERE id = :i",
            i=step_id,
        )
    caplog.set_level(logging.INFO)
    ages = report_backlog(db)
    (line,) = events(caplog, LogEvent.BACKLOG_AGE)
    for field in EVENTS[LogEvent.BACKLOG_AGE]:
        assert isinstance(line[field], float) and line[field] == ages[field]
    # Other tests may leave older rows behind; these are at least as old as ours.
    assert line["inbox_oldest_seconds"] >= 600
    assert line["outbox_oldest_seconds"] >= 1200
    assert line["steps_oldest_pending_seconds"] >= 1800


def test_a_trigger_event_given_up_as_undelivered_logs_dead_lettered(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    from shared.ingest.outbox import requeue_undecided
    from tests.ops_support import seed_tenant

    seed_tenant(db, "t-undelivered-log")
    with db.transaction() as tx:
        event_id = tx.scalar(
            "INSERT INTO workflow_trigger_events (tenant_id, event_type, payload, published_at,"
            " redeliveries) VALUES ('t-undelivered-log', 'test.lost', '{}',"
            " now() - interval '10 minutes', 3) RETURNING id"
        )
    caplog.set_level(logging.INFO)
    done = requeue_undecided(db, after_seconds=60, max_redeliveries=3, batch=10)
    assert done.given_up == (event_id,)
    (line,) = events(caplog, LogEvent.DEAD_LETTERED)
    assert line["kind"] == "undelivered_event" and str(event_id) in line["reason"]
