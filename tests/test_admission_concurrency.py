"""Admission under concurrency: 32 consumers, each with its own connections, released together
from a barrier (real Postgres; the advisory locks and unique indexes do the work)."""

from __future__ import annotations

import pytest

from shared.admission.admit import AdmissionResult, admit_event
from shared.core.db import Database
from tests.admission_support import (
    Published,
    at_barrier,
    bind_workflow,
    count,
    emit_event,
    finish_run,
    make_connection,
    make_tenant,
    refusals,
)

CONSUMERS = 32


@pytest.mark.parametrize("dedup", ["once_per_record", "not_while_running", "every_time"])
def test_32_deliveries_of_one_event_make_one_run_and_one_claim(
    db: Database, database_url: str, dedup: str
) -> None:
    make_tenant(db)
    conn = make_connection(db)
    wf = bind_workflow(db, "one", dedup=dedup)
    event_id = emit_event(db, connection_id=conn)
    published = Published()
    results = at_barrier(
        database_url,
        [lambda own: admit_event(own, event_id, publish=published)] * CONSUMERS,
    )
    outcomes = sorted(r.outcome_for(wf).outcome for r in results)
    assert outcomes == ["admitted"] + ["handled"] * (CONSUMERS - 1)
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1
    assert count(db, "SELECT count(*) FROM delivery_claims") == 1
    assert count(db, "SELECT count(*) FROM workflow_steps") == 1
    assert refusals(db) == []
    # Every delivery dispatched the same single first step (redeliveries resume dispatch).
    assert len(set(published.ids)) == 1


def _distinct_events(db: Database, dedup: str) -> tuple[str, str, list[int]]:
    make_tenant(db)
    conn = make_connection(db)
    wf = bind_workflow(db, "wf", dedup=dedup)
    events = [
        emit_event(db, connection_id=conn, changed={"score": str(i)}) for i in range(CONSUMERS)
    ]
    return conn, wf, events


def _admit_all(database_url: str, events: list[int]) -> list[AdmissionResult]:
    return at_barrier(
        database_url,
        [
            (lambda own, e=e: admit_event(own, e, publish=Published()))  # type: ignore[misc]
            for e in events
        ],
    )


def test_32_events_for_one_record_once_per_record_one_run_31_duplicates(
    db: Database, database_url: str
) -> None:
    _, wf, events = _distinct_events(db, "once_per_record")
    _admit_all(database_url, events)
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1
    assert count(db, "SELECT count(*) FROM workflow_enrollments") == 1
    reasons = [r["reason"] for r in refusals(db, wf)]
    assert reasons == ["duplicate"] * (CONSUMERS - 1)
    assert count(db, "SELECT count(*) FROM delivery_claims") == CONSUMERS


def test_32_events_for_one_record_not_while_running_second_run_only_after_first_finished(
    db: Database, database_url: str
) -> None:
    conn, wf, events = _distinct_events(db, "not_while_running")
    results = _admit_all(database_url, events)
    (first,) = [o for r in results for o in r.admitted]
    assert [r["reason"] for r in refusals(db, wf)] == ["already_running"] * (CONSUMERS - 1)
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1
    # While it runs, another event is still refused; once it finished, the next one runs.
    later = emit_event(db, connection_id=conn, changed={"score": "late"})
    assert admit_event(db, later, publish=Published()).outcomes[0].reason == "already_running"
    finish_run(db, str(first.run_id))
    after = emit_event(db, connection_id=conn, changed={"score": "after"})
    assert admit_event(db, after, publish=Published()).outcomes[0].outcome == "admitted"
    assert count(db, "SELECT count(*) FROM workflow_runs") == 2
    assert count(db, "SELECT count(*) FROM workflow_runs WHERE status = 'running'") == 1


def test_32_events_for_one_record_every_time_32_runs(db: Database, database_url: str) -> None:
    _, wf, events = _distinct_events(db, "every_time")
    results = _admit_all(database_url, events)
    assert sum(len(r.admitted) for r in results) == CONSUMERS
    assert count(db, "SELECT count(*) FROM workflow_runs") == CONSUMERS
    assert count(db, "SELECT count(DISTINCT event_id) FROM workflow_runs") == CONSUMERS
    assert refusals(db, wf) == []
