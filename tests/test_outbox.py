"""The outbox: `emit` in the caller's transaction, and publishing ids to the real Pub/Sub
emulator with a fenced hold."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from shared.core.db import Database
from shared.core.errors import PermanentError
from shared.core.pubsub import TRIGGER_EVENTS, get_publisher
from shared.ingest import outbox
from shared.ingest.outbox import (
    PAYLOAD_LIMIT_BYTES,
    PublishPolicy,
    TriggerEvent,
    claim_batch,
    emit,
    mark_published,
    publish_outbox,
)
from tests.ingest_support import make_tenant, trigger_events
from tests.pubsub_emulator import (
    PubsubProject,
)


def event(n: int = 0, **extra: Any) -> TriggerEvent:
    fields: dict[str, Any] = {
        "tenant_id": "acme",
        "event_type": "app.invoice.paid",
        "payload": {"n": n},
    }
    fields.update(extra)
    return TriggerEvent(**fields)


def test_emit_commits_with_the_domain_write_and_a_rollback_leaves_no_event(
    db: Database,
) -> None:
    make_tenant(db)
    with db.transaction() as tx:
        tx.execute("CREATE TABLE invoices (id int PRIMARY KEY, paid boolean)")
    with db.transaction() as tx:
        tx.execute("INSERT INTO invoices VALUES (1, true)")
        event_id = emit(tx, event(1, record_object_type="invoice", record_object_id="1"))
    assert event_id is not None
    with pytest.raises(PermanentError, match="fails after emitting"), db.transaction() as tx:
        tx.execute("INSERT INTO invoices VALUES (2, true)")
        emit(tx, event(2))
        raise RuntimeError("the application's transaction fails after emitting")
    rows = trigger_events(db)
    assert [(r["id"], r["payload"], r["published_at"]) for r in rows] == [
        (event_id, {"n": 1}, None)
    ]
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM invoices") == 1


def test_emit_refuses_malformed_events(db: Database) -> None:
    make_tenant(db)
    with db.transaction() as tx:
        with pytest.raises(PermanentError):
            emit(tx, event(event_type="NotDotted"))
        with pytest.raises(PermanentError):
            emit(tx, event(record_object_type="contact"))


def test_payload_over_64_kib_is_truncated_and_flagged(db: Database) -> None:
    make_tenant(db)
    big = {"notes": 'é"x' * 40_000}
    with db.transaction() as tx:
        emit(tx, event(payload=big))
        emit(tx, event(payload={"small": True}))
        sizes = tx.all(
            "SELECT octet_length(payload::text) AS size, payload_truncated, payload"
            " FROM workflow_trigger_events ORDER BY id"
        )
    assert sizes[0]["payload_truncated"] is True
    assert sizes[0]["size"] <= PAYLOAD_LIMIT_BYTES + 64  # jsonb's text form adds spaces
    assert sizes[0]["payload"]["truncated"] is True
    assert sizes[0]["payload"]["prefix"].startswith('{"notes":"é')
    assert sizes[1]["payload_truncated"] is False


def test_nul_characters_do_not_break_the_insert(db: Database) -> None:
    make_tenant(db)
    with db.transaction() as tx:
        assert emit(tx, event(payload={"a\x00": "b\x00c"}, changed_fields={"f": "\x00"}))


def test_same_source_event_id_on_a_connection_is_one_event(db: Database) -> None:
    from tests.ingest_support import make_connection

    conn = make_connection(db)
    with db.transaction() as tx:
        first = emit(tx, event(connection_id=conn, source_event_id="42"))
        again = emit(tx, event(connection_id=conn, source_event_id="42"))
        other = emit(tx, event(connection_id=conn, source_event_id="43"))
    assert first is not None and other is not None and again is None


def test_an_applications_emit_without_a_connection_is_deduplicated_too(db: Database) -> None:
    """emit() by the embedding application names no connection; its source key must still
    make a second emit of the same occurrence a no-op (NULL connection ids were distinct in
    the first release's unique index), within the tenant only."""
    make_tenant(db)
    make_tenant(db, "globex")
    with db.transaction() as tx:
        first = emit(tx, event(source_event_id="invoice-7"))
        again = emit(tx, event(source_event_id="invoice-7"))
        other_tenant = emit(tx, event(tenant_id="globex", source_event_id="invoice-7"))
    assert first is not None and again is None and other_tenant is not None


def emit_many(db: Database, n: int) -> list[int]:
    make_tenant(db)
    with db.transaction() as tx:
        ids = [emit(tx, event(i)) for i in range(n)]
    return [i for i in ids if i is not None]


def test_publish_outbox_sends_ids_and_marks_them(db: Database, pubsub: PubsubProject) -> None:
    ids = emit_many(db, 5)
    report = publish_outbox(db, budget_seconds=30, until_empty=True)
    assert (report.claimed, report.published) == (5, 5)
    assert sorted(pubsub.pull_ids(TRIGGER_EVENTS, count=5)) == ids
    assert all(r["published_at"] is not None for r in trigger_events(db))
    assert publish_outbox(db, budget_seconds=30, until_empty=True).claimed == 0


def test_two_publishers_at_a_barrier_never_share_a_row(db: Database, pubsub: PubsubProject) -> None:
    ids = emit_many(db, 200)
    barrier = threading.Barrier(2)
    holds: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    policy = PublishPolicy(batch_size=17)
    publisher = get_publisher()

    def publisher_loop(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            first = True
            while True:
                hold = str(uuid.uuid4())
                claimed = claim_batch(db, hold, limit=policy.batch_size, hold_seconds=60)
                if not claimed:
                    return
                holds[n].extend(claimed)
                if first:
                    # Both hold a live batch before either publishes: otherwise a publisher
                    # scheduled first can drain all 200 rows (a publish takes a millisecond or
                    # two) before the other claims once, and the test proves nothing.
                    barrier.wait(timeout=10)
                    first = False
                publisher.publish_many(TRIGGER_EVENTS, [{"event_id": i} for i in claimed])
                assert mark_published(db, hold, claimed) == len(claimed)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publisher_loop, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert holds[0] and holds[1]
    assert set(holds[0]).isdisjoint(holds[1])
    assert sorted(holds[0] + holds[1]) == ids
    received = pubsub.drain(TRIGGER_EVENTS)
    assert sorted(m["event_id"] for m in received) == ids  # each exactly once


def test_crash_after_publish_before_mark_republishes_after_the_hold_expires(
    db: Database, pubsub: PubsubProject
) -> None:
    ids = emit_many(db, 3)
    crashed_hold = str(uuid.uuid4())
    claimed = claim_batch(db, crashed_hold, limit=10, hold_seconds=60)
    get_publisher().publish_many(TRIGGER_EVENTS, [{"event_id": i} for i in claimed])
    # ...the publisher dies here, before marking. While its hold is live nobody re-sends:
    assert publish_outbox(db, budget_seconds=30, until_empty=True).claimed == 0
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_trigger_events SET hold_expires_at = now() - interval '1 s'")
    report = publish_outbox(db, budget_seconds=30, until_empty=True)
    assert report.published == 3
    received = sorted(m["event_id"] for m in pubsub.drain(TRIGGER_EVENTS))
    assert received == sorted(ids + ids)  # the duplicate downstream is expected, no loss
    # The stale publisher comes back and tries to mark: its hold is gone.
    assert mark_published(db, crashed_hold, claimed) == 0


def test_stale_publisher_cannot_mark_rows_taken_over(db: Database) -> None:
    ids = emit_many(db, 2)
    stale = str(uuid.uuid4())
    assert claim_batch(db, stale, limit=10, hold_seconds=60) == ids
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_trigger_events SET hold_expires_at = now() - interval '1 s'")
    fresh = str(uuid.uuid4())
    assert claim_batch(db, fresh, limit=10, hold_seconds=60) == ids
    assert mark_published(db, stale, ids) == 0
    assert all(r["published_at"] is None for r in trigger_events(db))
    assert mark_published(db, fresh, ids) == 2


def test_failed_publish_releases_the_hold_and_marks_nothing(
    db: Database, pubsub: PubsubProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    emit_many(db, 2)
    # A topic that doesn't exist in the emulator: every publish future fails.
    from shared.core import pubsub as pubsub_mod

    missing = pubsub_mod.Publisher(f"nowhere-{uuid.uuid4().hex[:8]}")
    report = publish_outbox(db, budget_seconds=30, until_empty=True, publisher=missing)
    assert report.failed_batches == 1 and report.published == 0
    rows = trigger_events(db)
    assert all(r["published_at"] is None and r["publish_hold"] is None for r in rows)
    assert publish_outbox(db, budget_seconds=30, until_empty=True).published == 2


def test_claim_reads_the_partial_unpublished_index(db: Database) -> None:
    emit_many(db, 3)
    with db.transaction() as tx:
        tx.execute("ANALYZE workflow_trigger_events")
        tx.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in tx.all(
                "EXPLAIN "
                + outbox.CLAIM.text.replace(":hold_id", "gen_random_uuid()")
                .replace(":hold_seconds", "60")
                .replace(":limit", "10")
            )
        )
    assert "workflow_trigger_events_unpublished" in plan


def test_publish_outbox_entry_point_publishes_within_its_budget(
    db: Database, pubsub: PubsubProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functions_framework

    from tests.conftest import ROOT

    ids = emit_many(db, 3)
    monkeypatch.setenv("PUBLISH_BUDGET_SECONDS", "0.3")
    app = functions_framework.create_app("publish_outbox", str(ROOT / "main.py"), "http")
    response = app.test_client().post("/")
    assert response.status_code == 200
    assert response.json["published"] == 3
    assert sorted(pubsub.pull_ids(TRIGGER_EVENTS, count=3)) == ids


def test_publish_many_splits_at_the_request_limit_and_loses_nothing(pubsub: PubsubProject) -> None:
    # One more message than a Publish request may carry: two requests, every id back in order.
    from shared.core import pubsub as pubsub_mod

    count = pubsub_mod.MAX_MESSAGES_PER_REQUEST + 1
    ids = get_publisher().publish_many(TRIGGER_EVENTS, [{"event_id": i} for i in range(count)])
    assert len(ids) == count and len(set(ids)) == count
    received = pubsub.drain(TRIGGER_EVENTS)
    assert sorted(m["event_id"] for m in received) == list(range(count))


def test_an_idle_scheduled_publish_ends_at_once(db: Database, pubsub: PubsubProject) -> None:
    # With its default 50 s budget, a tick that finds nothing unpublished ends (issue 27).
    import time

    import functions_framework

    from tests.conftest import ROOT

    app = functions_framework.create_app("publish_outbox", str(ROOT / "main.py"), "http")
    started = time.monotonic()
    response = app.test_client().post("/")
    assert response.status_code == 200 and response.json["claimed"] == 0
    assert time.monotonic() - started < 5
