"""Draining the inbox: leases, one transaction per batch with a savepoint per row, retries
with backoff, dead, rejected, and two drainers racing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pg8000.dbapi
import pytest

from shared.core.db import Database, SessionLimits, connector_from_env
from shared.ingest import inbox
from shared.ingest.inbox import DrainPolicy, backoff_seconds, claim_rows, process_row
from tests.ingest_support import (
    hubspot_body,
    hubspot_event,
    inbox_rows,
    make_connection,
    trigger_events,
)
from tests.pubsub_emulator import PubsubProject


def store(db: Database, connection_id: str, body: bytes) -> int:
    with db.transaction() as tx:
        return inbox.store(tx, connection_id, body, {}).inbox_id


def created(event_id: int, object_id: int = 1) -> bytes:
    return hubspot_body(hubspot_event(event_id, object_id, subscription_type="contact.creation"))


def test_drain_turns_rows_into_events_and_stamps_them(db: Database) -> None:
    conn = make_connection(db)
    ids = [store(db, conn, created(i, i)) for i in range(1, 4)]
    report = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert (report.processed, report.events) == (3, 3)
    rows = inbox_rows(db)
    assert [(r["id"], r["status"], r["attempts"], r["lease_id"]) for r in rows] == [
        (i, "processed", 1, None) for i in ids
    ]
    assert [e["inbox_id"] for e in trigger_events(db)] == ids
    # Running it again changes nothing.
    assert inbox.drain_inbox(db, budget_seconds=10, until_empty=True).claimed == 0
    assert len(trigger_events(db)) == 3


def test_events_sharing_an_event_id_are_both_kept_and_a_retry_is_still_one(
    db: Database,
) -> None:
    """eventId is not unique at HubSpot: two creations with eventId 5 on different contacts are
    two events; HubSpot's retry of the first (attemptNumber 1: a different body, so a new inbox
    row) is recognised at the outbox and produces nothing."""
    conn = make_connection(db)
    first = hubspot_event(5, 1, subscription_type="contact.creation")
    store(db, conn, hubspot_body(first, hubspot_event(5, 2, subscription_type="contact.creation")))
    store(db, conn, hubspot_body({**first, "attemptNumber": 1}))
    report = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert (report.processed, report.events) == (2, 2)
    assert [e["record_object_id"] for e in trigger_events(db)] == ["1", "2"]
    assert inbox_rows(db)[1]["outcome"] == {"produced": 0, "dropped": {"re_announced": 1}}


def test_unparseable_verified_body_is_rejected_and_never_retried(db: Database) -> None:
    conn = make_connection(db)
    row_id = store(db, conn, b'{"not": "an array"}')
    report = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert report.rejected == 1
    (row,) = inbox_rows(db)
    assert (row["id"], row["status"]) == (row_id, "rejected")
    assert "HubSpot event array" in row["last_error"]
    assert inbox.drain_inbox(db, budget_seconds=10, until_empty=True).claimed == 0


def test_crashed_drainers_lease_expires_and_the_stale_drainer_writes_nothing(
    db: Database,
) -> None:
    conn = make_connection(db)
    store(db, conn, created(1))
    policy = DrainPolicy(lease_seconds=60)
    stale_lease = str(uuid.uuid4())
    (claimed,) = claim_rows(db, stale_lease, policy)  # ...and then the drainer "crashes"
    assert claim_rows(db, str(uuid.uuid4()), policy) == []  # leased: nobody else takes it
    with db.transaction() as tx:  # the lease runs out
        tx.execute("UPDATE webhook_inbox SET next_attempt_at = now() - interval '1 second'")
    new_lease = str(uuid.uuid4())
    (reclaimed,) = claim_rows(db, new_lease, policy)
    assert reclaimed.attempts == 2
    # The stale drainer wakes up: its lease is gone, so it writes nothing at all.
    assert process_row(db, claimed, stale_lease, policy) == ("lease_lost", 0)
    assert trigger_events(db) == []
    assert process_row(db, reclaimed, new_lease, policy) == ("processed", 1)
    assert inbox_rows(db)[0]["status"] == "processed"


def test_a_poisoned_row_in_a_batch_goes_dead_alone_and_the_others_drain(db: Database) -> None:
    """Three rows, one batch, one transaction: the middle row's second event can't be stored
    (a NUL in its object id, which Postgres text refuses: a permanent error after the row's
    first event was already written). Its savepoint rolls the row back whole and it is marked
    dead with the reason; the rows before and after it are processed in the same commit."""
    conn = make_connection(db)
    first = store(db, conn, created(1, 1))
    poisoned = store(
        db,
        conn,
        hubspot_body(
            hubspot_event(2, 10, subscription_type="contact.creation"),
            {**hubspot_event(3, 11, subscription_type="contact.creation"), "objectId": "11\x00"},
        ),
    )
    last = store(db, conn, created(4, 4))
    report = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert (report.claimed, report.processed, report.dead, report.events) == (3, 2, 1, 2)
    rows = {r["id"]: r for r in inbox_rows(db)}
    assert (rows[first]["status"], rows[last]["status"]) == ("processed", "processed")
    assert rows[poisoned]["status"] == "dead"
    assert "0x00" in rows[poisoned]["last_error"]
    # Nothing of the poisoned row survives, not even its good first event.
    assert [(e["inbox_id"], e["record_object_id"]) for e in trigger_events(db)] == [
        (first, "1"),
        (last, "4"),
    ]
    # One transaction for the batch: now() is the transaction's start, the same for all.
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(DISTINCT finished_at) FROM webhook_inbox") == 1


@pytest.fixture
def impatient_db(database_url: str) -> Iterator[Database]:
    """A pool whose sessions give up on a lock after 100 ms (SQLSTATE 55P03: transient)."""
    database = Database(
        connector_from_env({"DATABASE_URL": database_url}),
        pool_size=4,
        limits=SessionLimits(lock_timeout_ms=100),
    )
    yield database
    database.close()


def test_transient_failures_back_off_then_go_dead_with_the_error(
    db: Database, impatient_db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = make_connection(db)
    row_id = store(db, conn, created(1))
    policy = DrainPolicy(max_attempts=3, backoff_base_seconds=10, backoff_cap_seconds=15)
    assert [backoff_seconds(a, policy) for a in (1, 2, 3, 4)] == [10, 15, 15, 15]
    blocker = pg8000.dbapi.connect(**_kwargs(database_url))
    try:
        # Another session holds the outbox table: every attempt times out on its insert.
        blocker.cursor().execute("LOCK TABLE workflow_trigger_events IN EXCLUSIVE MODE")
        delays = []
        for attempt in (1, 2, 3):
            report = inbox.drain_inbox(
                impatient_db, budget_seconds=10, until_empty=True, policy=policy
            )
            (row,) = inbox_rows(db)
            if attempt < 3:
                assert report.retried == 1
                assert row["status"] == "pending" and row["attempts"] == attempt
                assert "lock" in row["last_error"]
                with db.transaction() as tx:
                    delays.append(
                        tx.scalar(
                            "SELECT extract(epoch FROM next_attempt_at - now())::float"
                            " FROM webhook_inbox"
                        )
                    )
                    tx.execute("UPDATE webhook_inbox SET next_attempt_at = now()")  # time passes
            else:
                assert report.dead == 1
                assert (row["id"], row["status"], row["attempts"]) == (row_id, "dead", 3)
                assert "lock" in row["last_error"]
                # The line the dead-letter alert counts (infra/monitoring.tf).
                dead = [
                    r
                    for r in caplog.records
                    if getattr(r, "event", None) == "dead_lettered"
                    and r.event_fields["kind"] == "inbox_row"
                ]
                assert len(dead) == 1 and "lock" in dead[0].event_fields["reason"]
        assert 9 < delays[0] <= 10 and 14 < delays[1] <= 15
        blocker.rollback()
    finally:
        blocker.close()
    # Each failed attempt rolled back whole: no event, no shadow state.
    assert trigger_events(db) == []
    assert inbox.drain_inbox(db, budget_seconds=10, until_empty=True).claimed == 0


def _kwargs(url: str) -> dict[str, Any]:
    from shared.core.db import parse_database_url

    return parse_database_url(url)


def test_two_drainers_at_a_barrier_never_process_a_row_twice(db: Database) -> None:
    conn = make_connection(db)
    for i in range(60):
        store(db, conn, created(i, i))
    policy = DrainPolicy(batch_size=7)
    barrier = threading.Barrier(2)
    # Both drainers hold a claimed batch before either processes anything: the claims really
    # overlap in time on every run, however the machine schedules the two threads.
    first_claims = threading.Barrier(2)
    claimed: list[list[int]] = [[], []]
    results: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def drainer(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            first = True
            while True:
                lease = str(uuid.uuid4())
                rows = claim_rows(db, lease, policy)
                if first:
                    first_claims.wait(timeout=10)
                    first = False
                if not rows:
                    return
                claimed[n].extend(r.id for r in rows)
                for row in rows:
                    results[n].append(process_row(db, row, lease, policy)[0])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drainer, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert set(claimed[0]).isdisjoint(claimed[1])
    assert len(claimed[0]) + len(claimed[1]) == 60
    assert claimed[0] and claimed[1]  # both really worked
    assert set(results[0] + results[1]) == {"processed"}
    events = trigger_events(db)
    assert len(events) == 60 == len({e["inbox_id"] for e in events})
    assert {r["attempts"] for r in inbox_rows(db)} == {1}


def test_scheduled_drain_keeps_polling_until_its_budget_ends(db: Database) -> None:
    conn = make_connection(db)
    ticks = iter([0.0, 0.0, 0.5, 0.9, 1.2, 99.0])

    def clock() -> float:
        return next(ticks)

    store(db, conn, created(1))
    policy = DrainPolicy(idle_poll_seconds=0.01)
    report = inbox.drain_inbox(db, budget_seconds=1.0, policy=policy, clock=clock)
    assert report.processed == 1


def test_drain_inbox_entry_point_drains_within_its_budget(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functions_framework

    from tests.conftest import ROOT

    conn = make_connection(db)
    store(db, conn, created(1))
    store(db, conn, b"garbage")
    monkeypatch.setenv("DRAIN_BUDGET_SECONDS", "0.3")
    app = functions_framework.create_app("drain_inbox", str(ROOT / "main.py"), "http")
    response = app.test_client().post("/")
    assert response.status_code == 200
    assert response.json["processed"] == 1 and response.json["rejected"] == 1
    assert [r["status"] for r in inbox_rows(db)] == ["processed", "rejected"]


def test_an_idle_scheduled_drain_ends_at_once(db: Database) -> None:
    # With its default 50 s budget, a tick that finds nothing claimable ends (issue 27).
    import time

    import functions_framework

    from tests.conftest import ROOT

    app = functions_framework.create_app("drain_inbox", str(ROOT / "main.py"), "http")
    started = time.monotonic()
    response = app.test_client().post("/")
    assert response.status_code == 200 and response.json["processed"] == 0
    assert time.monotonic() - started < 5


def test_the_scheduled_drain_publishes_the_events_it_committed(
    db: Database, pubsub: PubsubProject
) -> None:
    # Push, not poll (issue 27): the drain's events don't wait for the next publish_outbox tick.
    import functions_framework

    from shared.core.pubsub import TRIGGER_EVENTS
    from tests.conftest import ROOT

    store(db, make_connection(db), created(1))
    app = functions_framework.create_app("drain_inbox", str(ROOT / "main.py"), "http")
    assert app.test_client().post("/").json["events"] == 1
    (event,) = trigger_events(db)
    assert event["published_at"] is not None
    assert pubsub.pull_ids(TRIGGER_EVENTS, count=1) == [event["id"]]


def test_a_drain_killed_between_its_commit_and_its_publish_is_published_by_the_schedule(
    db: Database, database_url: str, pubsub: PubsubProject
) -> None:
    # The safety net: a drain process dies after committing its events, before publishing
    # them (a SIGKILL, an instance reclaimed); the scheduled publisher sends them.
    import os
    import subprocess
    import sys

    import functions_framework

    from shared.core.crashpoints import EXIT_CODE
    from shared.core.pubsub import TRIGGER_EVENTS
    from tests.conftest import ROOT

    store(db, make_connection(db), created(1))
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS="drain_after_commit_before_publish",
    )
    script = (
        "from shared.core.db import get_database\n"
        "from shared.ingest.inbox import drain_and_publish\n"
        "drain_and_publish(get_database(), budget_seconds=30)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, cwd=ROOT, capture_output=True
    )
    assert child.returncode == EXIT_CODE, child.stderr.decode()[-2000:]
    (event,) = trigger_events(db)
    assert inbox_rows(db)[0]["status"] == "processed" and event["published_at"] is None
    app = functions_framework.create_app("publish_outbox", str(ROOT / "main.py"), "http")
    assert app.test_client().post("/").json["published"] == 1
    assert pubsub.pull_ids(TRIGGER_EVENTS, count=1) == [event["id"]]
    assert trigger_events(db)[0]["published_at"] is not None
