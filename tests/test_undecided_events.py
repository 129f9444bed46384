"""Every published trigger event reaches a decision or an explanation, whatever the transport
did with its message: the sweep publishes undecided events again and, at its cap, gives them
up as undelivered, visibly; ops re-queues them, and dead inbox rows too (real Postgres)."""

from __future__ import annotations

from typing import Any

from shared.admission.admit import admit_event
from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.sweep.loop import run_sweep
from tests.admission_support import (
    Published,
    bind_workflow,
    emit_event,
    make_connection,
    make_tenant,
)
from tests.ops_support import (
    bearer,
    mint,
)
from tests.pubsub_emulator import PubsubProject

CFG = SweepConfig(batch=50, redeliver_events_after_seconds=60, max_event_redeliveries=2)


def published_long_ago(db: Database, *event_ids: int, minutes: int = 10) -> None:
    """As publish_outbox leaves a row after publishing it, minutes ago."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_trigger_events SET published_at = now() - make_interval(mins => :m)"
            " WHERE id = ANY(CAST(:ids AS bigint[]))",
            m=minutes,
            ids=list(event_ids),
        )


def event_row(db: Database, event_id: int) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one(
            "SELECT published_at, decided_at, redeliveries, undelivered_at, undelivered_reason"
            " FROM workflow_trigger_events WHERE id = :e",
            e=event_id,
        )
    assert row is not None
    return row


def sweep(db: Database) -> Any:
    return run_sweep(db, 0, config=CFG, dispatch=lambda ids: None, duties=[])


def test_a_published_event_never_decided_is_published_again_then_given_up(db: Database) -> None:
    make_tenant(db)
    conn = make_connection(db)
    bind_workflow(db, "wf")
    lost = emit_event(db, connection_id=conn)
    decided = emit_event(db, connection_id=conn, object_id="202")
    recent = emit_event(db, connection_id=conn, object_id="303")
    admit_event(db, decided, publish=Published())
    published_long_ago(db, lost, decided)
    published_long_ago(db, recent, minutes=0)

    for n in (1, 2):
        report = sweep(db)
        assert (report.events_requeued, report.events_undelivered) == (1, 0)
        row = event_row(db, lost)
        # Back in the outbox: the publisher's claim takes rows whose published_at is NULL.
        assert row["published_at"] is None and row["redeliveries"] == n
        assert sweep(db).events_requeued == 0  # not published again yet: nothing to do
        published_long_ago(db, lost)
    report = sweep(db)
    assert (report.events_requeued, report.events_undelivered) == (0, 1)
    row = event_row(db, lost)
    assert row["undelivered_at"] is not None and row["published_at"] is not None
    assert "admission never committed a decision" in row["undelivered_reason"]
    assert (sweep(db).events_requeued, sweep(db).events_undelivered) == (0, 0)
    # Decided and recently published events were never touched.
    assert event_row(db, decided)["redeliveries"] == 0
    assert event_row(db, recent)["redeliveries"] == 0


def test_the_sweeps_undecided_query_reads_its_partial_index(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in tx.all(
                "EXPLAIN SELECT id FROM workflow_trigger_events WHERE decided_at IS NULL"
                " AND undelivered_at IS NULL AND published_at IS NOT NULL"
                " AND published_at < now() - interval '1 minute' ORDER BY published_at LIMIT 50"
            )
        )
    assert "workflow_trigger_events_undecided" in plan, plan


def test_ops_explains_an_undelivered_event_and_requeues_it(
    db: Database, client: Any, dispatched: Any
) -> None:
    make_tenant(db)
    conn = make_connection(db)
    wf = bind_workflow(db, "wf")
    lost = emit_event(db, connection_id=conn)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_trigger_events SET published_at = now(), redeliveries = 5,"
            " undelivered_at = now(), undelivered_reason = 'published 6 times and admission"
            " never committed a decision' WHERE id = :e",
            e=lost,
        )
    token = mint(db, tenant="acme")
    got = client.get(f"/v1/records/explain?record_key={conn}:contact:101", headers=bearer(token))
    assert got.status_code == 200, got.get_json()
    (event,) = got.get_json()["events"]
    (decision,) = event["decisions"]
    assert decision["workflow_id"] == wf and decision["outcome"] == "undelivered"
    assert f"/v1/events/{lost}/requeue" in decision["explanation"]
    assert event["redeliveries"] == 5 and event["undelivered_at"] is not None

    make_tenant(db, "globex")
    other = mint(db, tenant="globex")
    assert client.post(f"/v1/events/{lost}/requeue", headers=bearer(other)).status_code == 404
    done = client.post(f"/v1/events/{lost}/requeue", headers=bearer(token))
    assert done.status_code == 200, done.get_json()
    row = event_row(db, lost)
    assert row["published_at"] is None and row["undelivered_at"] is None
    assert row["redeliveries"] == 0
    # Decided now: a second requeue finds nothing to do.
    admit_event(db, lost, publish=Published())
    assert client.post(f"/v1/events/{lost}/requeue", headers=bearer(token)).status_code == 404


def test_dead_inbox_rows_are_listed_explained_and_requeued(
    db: Database, client: Any, dispatched: Any
) -> None:
    make_tenant(db)
    conn = make_connection(db)
    with db.transaction() as tx:
        dead = tx.scalar(
            "INSERT INTO webhook_inbox (connection_id, body_sha256, body, status, attempts,"
            " finished_at, last_error) VALUES (:c, '\\x01', '\\x5b5d', 'dead', 8, now(),"
            " 'database unavailable') RETURNING id",
            c=conn,
        )
        rejected = tx.scalar(
            "INSERT INTO webhook_inbox (connection_id, body_sha256, body, status, finished_at,"
            " last_error) VALUES (:c, '\\x02', '\\x7b', 'rejected', now(), 'not JSON')"
            " RETURNING id",
            c=conn,
        )
    token = mint(db, tenant="acme")
    listed = client.get("/v1/inbox/stuck", headers=bearer(token)).get_json()["rows"]
    assert [(r["id"], r["status"]) for r in listed] == [(rejected, "rejected"), (dead, "dead")]
    assert "re-queue it" in listed[1]["explanation"]
    explained = client.get(
        f"/v1/records/explain?record_key={conn}:contact:101", headers=bearer(token)
    ).get_json()
    assert {r["id"] for r in explained["stuck_inbox"]} == {dead, rejected}
    # A rejected body can never parse: not re-queued.
    assert client.post(f"/v1/inbox/{rejected}/requeue", headers=bearer(token)).status_code == 404
    assert client.post(f"/v1/inbox/{dead}/requeue", headers=bearer(token)).status_code == 200
    with db.transaction() as tx:
        row = tx.one(
            "SELECT status, attempts, finished_at FROM webhook_inbox WHERE id = :i", i=dead
        )
    assert row == {"status": "pending", "attempts": 0, "finished_at": None}
    assert client.post(f"/v1/inbox/{dead}/requeue", headers=bearer(token)).status_code == 404
    assert client.post("/v1/inbox/abc/requeue", headers=bearer(token)).status_code == 404


def test_the_sweep_publishes_a_requeued_event_right_after_its_pass(
    db: Database, pubsub: PubsubProject
) -> None:
    # Push, not poll (issue 27): what the sweep put back in the outbox goes out in the same
    # invocation, not at the next publish_outbox tick.
    from shared.core.pubsub import TRIGGER_EVENTS
    from shared.sweep.loop import publish_committed_events

    make_tenant(db)
    lost = emit_event(db, connection_id=make_connection(db))
    published_long_ago(db, lost)
    report = run_sweep(
        db,
        0,
        config=CFG,
        dispatch=lambda ids: None,
        duties=[],
        publish_events=publish_committed_events,
    )
    assert report.events_requeued == 1
    row = event_row(db, lost)
    assert row["published_at"] is not None and row["redeliveries"] == 1
    assert pubsub.pull_ids(TRIGGER_EVENTS, count=1) == [lost]
