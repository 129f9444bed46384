"""A throttle on starting runs (issue 29, item 6): at most `limit` runs started per window per
workflow (or key); the events over it wait in order, never refused, and start when a later
window has room. Real Postgres, real admission, the sweep's own repair."""

from __future__ import annotations

from typing import Any

from shared.admission.admit import admit_event
from shared.admission.run_throttle_start import start_due_runs
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.publishing.validate import validate_text
from shared.sweep.loop import next_due_seconds
from tests.admission_support import activate_text, at_barrier, emit_event, make_tenant, refusals

# Hour-long windows: fixed windows start on the epoch's hour, so a test straddles a boundary
# (and sees a fresh window mid-test) once in ~1,000 runs rather than once in ~20 with minutes.
WORKFLOW = """
name: throttled
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
  throttle: {limit: %d, period: 1h%s}
steps:
  - id: start
    type: end
"""


def throttled(db: Database, limit: int, key: str = "") -> str:
    make_tenant(db)
    return activate_text(db, WORKFLOW % (limit, key))


def admit(db: Database, event_id: int) -> Any:
    return admit_event(db, event_id, publish=lambda ids: None)


def started_events(db: Database) -> list[int]:
    with db.transaction() as tx:
        return [
            int(r["event_id"])
            for r in tx.all("SELECT event_id FROM workflow_runs ORDER BY created_at, event_id")
        ]


def next_window(db: Database) -> None:
    """Time travel: the current window ended (its counts go), and the queue is due."""
    with db.transaction() as tx:
        tx.execute("DELETE FROM throttle_windows WHERE scope = 'run_start'")
        tx.execute("UPDATE run_start_queue SET due_at = now() WHERE status = 'queued'")


def sweep(db: Database) -> int:
    return start_due_runs(db, SweepConfig(), lambda ids: None, SweepReport())


def test_over_the_limit_events_wait_in_order_and_start_in_later_windows(db: Database) -> None:
    workflow_id = throttled(db, 2)
    events = [emit_event(db, object_id=str(i)) for i in range(5)]
    outcomes = [admit(db, e).outcome_for(workflow_id).outcome for e in events]
    assert outcomes == ["admitted", "admitted", "queued", "queued", "queued"]
    assert refusals(db) == []  # waiting, not refused
    assert sweep(db) == 0  # the window is still full: not due
    due_in = next_due_seconds(db, SweepConfig())
    assert due_in is not None and 0 < due_in <= 3600  # the sweep wakes when the window ends
    next_window(db)
    assert sweep(db) == 2
    assert started_events(db) == events[:4]  # in order
    next_window(db)
    assert sweep(db) == 1 and sweep(db) == 0
    assert started_events(db) == events
    assert refusals(db) == []
    # A redelivery of a started or admitted event changes nothing.
    for e in events:
        assert admit(db, e).outcome_for(workflow_id).outcome == "handled"
    assert len(started_events(db)) == 5


def test_a_new_event_never_overtakes_a_waiting_one(db: Database) -> None:
    workflow_id = throttled(db, 1)
    first, second = emit_event(db, object_id="1"), emit_event(db, object_id="2")
    admit(db, first)
    assert admit(db, second).outcome_for(workflow_id).outcome == "queued"
    with db.transaction() as tx:  # the window ends, but the sweep has not run yet
        tx.execute("DELETE FROM throttle_windows WHERE scope = 'run_start'")
    third = emit_event(db, object_id="3")
    assert admit(db, third).outcome_for(workflow_id).outcome == "queued"  # behind `second`
    again = admit(db, second).outcome_for(workflow_id)
    assert again.outcome == "handled"  # a redelivery of a waiting event: still one entry
    with db.transaction() as tx:
        tx.execute("UPDATE run_start_queue SET due_at = now()")
    assert sweep(db) == 1
    assert started_events(db) == [first, second]


def test_a_key_gives_each_value_its_own_window(db: Database) -> None:
    workflow_id = throttled(db, 1, ", key: record.id")
    outcomes = [
        admit(db, emit_event(db, object_id=oid)).outcome_for(workflow_id).outcome
        for oid in ("a", "b", "a")
    ]
    assert outcomes == ["admitted", "admitted", "queued"]


def test_two_admissions_at_a_barrier_start_one_run_and_queue_the_other(
    db: Database, database_url: str
) -> None:
    workflow_id = throttled(db, 1)
    events = [emit_event(db, object_id=str(i)) for i in range(2)]
    results = at_barrier(
        database_url, [lambda own, e=e: admit(own, e).outcome_for(workflow_id) for e in events]
    )
    assert sorted(r.outcome for r in results) == ["admitted", "queued"]
    assert len(started_events(db)) == 1


def test_two_sweeps_at_a_barrier_never_start_more_than_the_limit(
    db: Database, database_url: str
) -> None:
    workflow_id = throttled(db, 3)
    events = [emit_event(db, object_id=str(i)) for i in range(10)]
    for e in events:
        admit(db, e)
    assert len(started_events(db)) == 3
    next_window(db)
    done = at_barrier(database_url, [sweep, sweep])
    assert sum(done) == 3
    assert started_events(db) == events[:6]  # three more, in order
    with db.transaction() as tx:
        used = tx.scalar("SELECT sum(used) FROM throttle_windows WHERE scope = 'run_start'")
        waiting = tx.scalar("SELECT count(*) FROM run_start_queue WHERE status = 'queued'")
    assert int(used) >= 3 and waiting == 4
    assert workflow_id


def test_throttle_is_validated_with_file_line_and_column() -> None:
    text = """name: t
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  throttle:
    limit: 0
    period: 2d
    key: run.id
steps:
  - {id: start, type: end}
"""
    report = validate_text(text, "t.yaml")
    assert [(p.line, p.column) for p in report.errors] == [(6, 12)]
    fixed = validate_text(text.replace("limit: 0", "limit: 5"), "t.yaml")
    found = {(p.line, p.column): p.message for p in fixed.errors}
    assert "period is at most 1d" in found[(7, 13)]
    assert "cannot read `run`" in found[(8, 10)]


def test_ops_explain_shows_a_waiting_event_with_its_place(db: Database, client: Any) -> None:
    from tests.admission_support import make_connection
    from tests.ops_support import bearer, mint

    workflow_id = throttled(db, 1)
    conn = make_connection(db)
    events = [emit_event(db, connection_id=conn) for _ in range(3)]
    for e in events:
        admit(db, e)
    token = mint(db, tenant="acme")
    got = client.get(f"/v1/records/explain?record_key={conn}:contact:101", headers=bearer(token))
    assert got.status_code == 200, got.get_json()
    last = next(e for e in got.get_json()["events"] if e["event_id"] == events[2])
    (decision,) = [d for d in last["decisions"] if d["workflow_id"] == workflow_id]
    assert decision["outcome"] == "undecided"
    assert "waits its turn, with 1 ahead of it" in decision["explanation"]


def test_a_start_due_while_the_workflow_is_paused_is_refused_not_run(db: Database) -> None:
    workflow_id = throttled(db, 1)
    events = [emit_event(db, object_id=str(i)) for i in range(2)]
    for e in events:
        admit(db, e)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_breakers (workflow_id, state, opened_at, reason)"
            " VALUES (CAST(:w AS uuid), 'open', now(), '10 runs failed in a row')",
            w=workflow_id,
        )
    next_window(db)
    assert sweep(db) == 1
    assert started_events(db) == events[:1]
    assert [(f["event_id"], f["reason"]) for f in refusals(db)] == [(events[1], "workflow_paused")]


def test_a_kill_after_an_event_was_queued_loses_nothing(db: Database, database_url: str) -> None:
    """A real process admits three events under a limit of one and is killed right after the
    second was queued (committed; the third never admitted). The queued one starts exactly
    once when the window has room; the third, redelivered, waits behind it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from shared.core.crashpoints import EXIT_CODE

    workflow_id = throttled(db, 1)
    events = [emit_event(db, object_id=str(i)) for i in range(3)]
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS="admission_after_run_queued:1",
    )
    script = (
        "from shared.core.db import get_database\n"
        "from shared.admission.admit import admit_event\n"
        "db = get_database()\n"
        f"for e in {events!r}:\n"
        "    admit_event(db, e, publish=lambda ids: None)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == EXIT_CODE, child.stderr.decode()[-2000:]
    assert started_events(db) == events[:1]
    assert admit(db, events[2]).outcome_for(workflow_id).outcome == "queued"
    next_window(db)
    assert sweep(db) == 1 and sweep(db) == 0  # one slot: the second, in order
    assert started_events(db) == events[:2]
    next_window(db)
    assert sweep(db) == 1
    assert started_events(db) == events
    assert refusals(db) == []
