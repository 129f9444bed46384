"""Keyed concurrency (issue 29, item 3): `concurrency: {key, limit}` on a workflow — at most
`limit` runs running per key; the others wait in admission order (not refused) and start when
a run of their key ends, handed the slot by the very statement that ended it. Real Postgres,
real admission, runs ended by the real step engine."""

from __future__ import annotations

import threading
import time
from typing import Any

from shared.admission.admit import admit_event
from shared.admission.concurrency import NEXT_WAITING
from shared.admission.concurrency_start import start_granted_runs
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.core.errors import TransientError
from shared.publishing.validate import validate_text
from shared.steps.advance import advance_step
from tests.admission_support import activate_text, at_barrier, emit_event, make_tenant, refusals

WORKFLOW = """
name: per-company
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
concurrency: {key: record.company, limit: 2}
steps:
  - id: start
    type: end
"""


def limited(db: Database) -> str:
    make_tenant(db)
    return activate_text(db, WORKFLOW)


def event(db: Database, company: str, i: int) -> int:
    return emit_event(db, object_id=f"{company}-{i}", changed={"company": company})


def admit(db: Database, event_id: int) -> Any:
    for _ in range(10):
        try:
            return admit_event(db, event_id, publish=lambda ids: None)
        except TransientError:
            continue
    raise AssertionError(f"event {event_id} never decided")


def running(db: Database, company: str | None = None) -> list[int]:
    """Event ids of the running runs (of one company), in start order."""
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT r.event_id FROM workflow_runs r JOIN workflow_trigger_events e "
            "ON e.id = r.event_id WHERE r.status = 'running' "
            "AND (CAST(:c AS text) IS NULL OR e.changed_fields->>'company' = CAST(:c AS text)) "
            "ORDER BY r.created_at",
            c=company,
        )
    return [int(r["event_id"]) for r in rows]


def started(db: Database) -> list[int]:
    with db.transaction() as tx:
        rows = tx.all("SELECT event_id FROM workflow_runs ORDER BY created_at, event_id")
    return [int(r["event_id"]) for r in rows]


def end_run_of(db: Database, event_id: int) -> None:
    """The run's one step advanced by the step engine: its settle ends the run."""
    with db.transaction() as tx:
        step_id = tx.scalar(
            "SELECT CAST(s.id AS text) FROM workflow_steps s JOIN workflow_runs r "
            "ON r.id = s.run_id WHERE r.event_id = :e",
            e=event_id,
        )
    advance_step(db, step_id, dispatch=lambda ids: None)


def start_granted(db: Database) -> int:
    return start_granted_runs(db, SweepConfig(), lambda ids: None, SweepReport())


def test_runs_over_the_limit_wait_in_order_and_start_as_runs_of_their_key_end(
    db: Database,
) -> None:
    workflow_id = limited(db)
    acme = [event(db, "acme", i) for i in range(5)]
    other = event(db, "globex", 0)
    outcomes = [admit(db, e).outcome_for(workflow_id).outcome for e in [*acme, other]]
    assert outcomes == ["admitted", "admitted", "queued", "queued", "queued", "admitted"]
    assert running(db, "acme") == acme[:2] and running(db, "globex") == [other]
    assert refusals(db) == []  # waiting, not refused
    # Redelivering a waiting event changes nothing.
    assert admit(db, acme[3]).outcome_for(workflow_id).outcome == "handled"
    # Each run's end hands its slot to the oldest waiting run of its key, in that statement.
    end_run_of(db, acme[0])
    with db.transaction() as tx:
        granted = tx.all(
            "SELECT event_id FROM run_start_queue WHERE granted_at IS NOT NULL "
            "AND status = 'queued'"
        )
    assert [int(g["event_id"]) for g in granted] == [acme[2]]
    assert start_granted(db) == 1
    assert running(db, "acme") == [acme[1], acme[2]]
    end_run_of(db, other)  # another key's end grants nothing of acme's
    assert start_granted(db) == 0
    for done in (acme[1], acme[2]):
        end_run_of(db, done)
        start_granted(db)
    assert running(db, "acme") == [acme[3], acme[4]]
    assert [e for e in started(db) if e in acme] == acme  # FIFO per key
    assert refusals(db) == []


def test_slots_freed_and_taken_concurrently_never_exceed_the_limit(
    db: Database, database_url: str
) -> None:
    """Two running runs of a key, three waiting. At a barrier: both runs end (the step engine),
    two starters start what they were granted, and four new events of the key are admitted —
    while a watcher counts the key's running runs. Never more than 2; every waiting run starts
    in admission order (the queue's order: the racing four in the order admission took them);
    the new events wait behind the old ones."""
    workflow_id = limited(db)
    first = [event(db, "acme", i) for i in range(5)]
    for e in first:
        admit(db, e)
    assert running(db) == first[:2]
    late = [event(db, "acme", 10 + i) for i in range(4)]
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(len(running(db, "acme")))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        jobs: list[Any] = [
            lambda own: end_run_of(own, first[0]),
            lambda own: end_run_of(own, first[1]),
            start_granted,
            start_granted,
            *[lambda own, e=e: admit(own, e) for e in late],
        ]
        results = at_barrier(database_url, jobs)
        start_granted(db)  # what the racing starters came too early for
    finally:
        stop.set()
        watcher.join()
    assert all(r.outcome_for(workflow_id).outcome == "queued" for r in results[4:])
    assert max(seen) <= 2, max(seen)
    with db.transaction() as tx:
        slots = tx.scalar("SELECT count(*) FROM concurrency_slots")
    # The two oldest waiting were granted (their runs may start in either order: two starters).
    assert sorted(running(db, "acme")) == first[2:4] and int(slots) == 2
    # Ending the rest one by one: admission order, the late ones after the first ones.
    for e in [*first[2:], *late]:
        if e in running(db):
            end_run_of(db, e)
            start_granted(db)
    with db.transaction() as tx:
        order = tx.all(
            "SELECT event_id FROM run_start_queue WHERE event_id = ANY(:late) ORDER BY id",
            late=late,
        )
    admitted_order = [int(r["event_id"]) for r in order]  # the racing admissions' own order
    assert sorted(admitted_order) == late
    order_started = started(db)
    assert order_started[:2] == first[:2] and sorted(order_started[2:4]) == first[2:4]
    assert order_started[4:] == [first[4], *admitted_order]
    assert max(seen) <= 2


def test_the_next_waiting_run_for_a_key_is_found_by_an_index(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in tx.all(
                "EXPLAIN " + NEXT_WAITING.text,
                workflow_id="00000000-0000-4000-8000-000000000001",
                concurrency_key="key:acme",
            )
        )
    assert "run_start_queue_next_waiting" in plan and "Seq Scan" not in plan, plan


def test_concurrency_is_validated_with_file_line_and_column() -> None:
    text = """name: per-company
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  debounce: {period: 5s}
concurrency:
  key: steps.x.output
  limit: 0
steps:
  - {id: start, type: end}
"""
    report = validate_text(text, "per-company.yaml")
    found = {(p.line, p.column): p.message for p in report.errors}
    assert (8, 10) in found, found  # limit: 0
    fixed = validate_text(text.replace("limit: 0", "limit: 2"), "per-company.yaml")
    found = {(p.line, p.column): p.message for p in fixed.errors}
    assert "cannot read `steps`" in found[(7, 8)], found
    assert any("debounce can't be combined" in m and line == 6 for (line, _), m in found.items())


def test_the_limits_view_shows_what_waits_behind_a_key(db: Database, client: Any) -> None:
    from tests.ops_support import bearer, mint

    workflow_id = limited(db)
    for i in range(5):
        admit(db, event(db, "acme", i))
    got = client.get("/v1/limits", headers=bearer(mint(db, tenant="acme")))
    assert got.status_code == 200, got.get_json()
    (view,) = [i for i in got.get_json()["items"] if i["kind"] == "concurrency"]
    assert view["subject"] == f"{workflow_id}|key:acme"
    assert (view["limit"], view["admitted"], view["waiting"]) == (2, 2, 3)
    assert view["oldest_wait_seconds"] is not None and view["next_at"] is None


def test_ops_explain_says_a_waiting_run_waits_for_a_slot_of_its_key(
    db: Database, client: Any
) -> None:
    from tests.admission_support import make_connection
    from tests.ops_support import bearer, mint

    workflow_id = limited(db)
    conn = make_connection(db)
    events = [
        emit_event(db, connection_id=conn, object_id=str(i), changed={"company": "acme"})
        for i in range(3)
    ]
    for e in events:
        admit(db, e)
    got = client.get(
        f"/v1/records/explain?record_key={conn}:contact:2", headers=bearer(mint(db, "acme"))
    )
    assert got.status_code == 200, got.get_json()
    (event,) = [e for e in got.get_json()["events"] if e["event_id"] == events[2]]
    (decision,) = [d for d in event["decisions"] if d["workflow_id"] == workflow_id]
    assert decision["outcome"] == "undecided"
    assert "at most 2 run(s) at once" in decision["explanation"]
    assert "not refused" in decision["explanation"]


def test_a_cancel_hands_the_slot_over_and_the_sweeps_repair_starts_the_run(
    db: Database,
) -> None:
    """Whatever statement ends a run frees its slot: an ops cancel (no step function sees it)
    hands the slot to the next waiting run in the cancel's statement, and the sweep's repair
    (the catalog's own, by the due index) starts that run."""
    from shared.steps.cancel import cancel_run
    from shared.sweep.catalog import REPAIRS

    limited(db)
    events = [event(db, "acme", i) for i in range(3)]
    for e in events:
        admit(db, e)
    with db.transaction() as tx:
        run_id = tx.scalar(
            "SELECT CAST(id AS text) FROM workflow_runs WHERE event_id = :e", e=events[0]
        )
    assert cancel_run(db, run_id, by="test", reason="slot handover") is not None
    with db.transaction() as tx:
        due = tx.scalar(
            "SELECT event_id FROM run_start_queue "
            "WHERE granted_at IS NOT NULL AND status = 'queued'"
        )
    assert due == events[2]
    assert start_granted_runs in REPAIRS
    report = SweepReport()
    start_granted_runs(db, SweepConfig(), lambda ids: None, report)
    assert report.runs_started_from_queue == 1
    assert running(db, "acme") == [events[1], events[2]]


def test_a_raised_limit_serves_the_waiting_runs_first(db: Database) -> None:
    """Limit 2, two running, three waiting; a new version raises it to 3. The next event of
    the key grants the free slot to the oldest waiting run (started by the repair) and waits
    behind the others itself: no new event overtakes a waiting one."""
    workflow_id = limited(db)
    events = [event(db, "acme", i) for i in range(5)]
    for e in events:
        admit(db, e)
    activate_text(db, WORKFLOW.replace("limit: 2", "limit: 3"))
    late = event(db, "acme", 9)
    assert admit(db, late).outcome_for(workflow_id).outcome == "queued"
    assert start_granted(db) == 1
    assert running(db, "acme") == events[:3]


def test_the_ops_page_shows_a_keys_limit_running_and_waiting(db: Database, client: Any) -> None:
    from tests.ops_support import mint

    workflow_id = limited(db)
    for i in range(4):
        admit(db, event(db, "acme", i))
    assert client.post("/ui/login", data={"token": mint(db, "acme")}).status_code == 303
    page = client.get("/ui").get_data(as_text=True)
    row = page.split('class="limit-concurrency"')[1].split("</tr>")[0]
    assert f"{workflow_id}|key:acme" in row
    assert "2 at once" in row and "<td>2</td>" in row and "2 events" in row


def test_a_kill_after_a_runs_end_and_before_the_next_start_loses_nothing(
    db: Database, database_url: str
) -> None:
    """A real step process ends a run of the key (its settle commits, handing the slot over)
    and is killed before it starts the granted run. The grant is committed with the end: the
    sweep's repair starts that run, once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from shared.core.crashpoints import EXIT_CODE

    limited(db)
    events = [event(db, "acme", i) for i in range(3)]
    for e in events:
        admit(db, e)
    with db.transaction() as tx:
        step_id = tx.scalar(
            "SELECT CAST(s.id AS text) FROM workflow_steps s JOIN workflow_runs r "
            "ON r.id = s.run_id WHERE r.event_id = :e",
            e=events[0],
        )
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS="after_commit_before_publish:1",
    )
    script = (
        "from shared.core.db import get_database\n"
        "from shared.steps.advance import advance_step\n"
        f"advance_step(get_database(), {step_id!r}, dispatch=lambda ids: None)\n"
        "print('survived')\n"
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
    assert running(db, "acme") == [events[1]]  # ended, and the next not started yet
    assert start_granted(db) == 1 and start_granted(db) == 0
    assert running(db, "acme") == [events[1], events[2]]


def test_a_granted_start_that_is_refused_passes_its_slot_on(db: Database) -> None:
    """The workflow's breaker opened while runs waited: each granted start is refused
    `workflow_paused` (a wait is no way around the breaker) and hands its slot to the next
    waiting run in the same transaction, so no slot is left held by a run that never started."""
    from shared.steps.cancel import cancel_run

    workflow_id = limited(db)
    events = [event(db, "acme", i) for i in range(5)]
    for e in events:
        admit(db, e)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_breakers (workflow_id, state, opened_at, reason)"
            " VALUES (CAST(:w AS uuid), 'open', now(), '10 runs failed in a row')",
            w=workflow_id,
        )
        run_id = tx.scalar(
            "SELECT CAST(id AS text) FROM workflow_runs WHERE event_id = :e", e=events[0]
        )
    cancel_run(db, run_id, by="test", reason="free a slot")
    assert start_granted(db) == 3
    assert {f["event_id"]: f["reason"] for f in refusals(db)} == dict.fromkeys(
        events[2:], "workflow_paused"
    )
    with db.transaction() as tx:
        slots = tx.all("SELECT CAST(run_id AS text) AS run_id FROM concurrency_slots")
        held_by = tx.scalar(
            "SELECT CAST(id AS text) FROM workflow_runs WHERE event_id = :e", e=events[1]
        )
    assert [s["run_id"] for s in slots] == [held_by]
