"""Shadow records: an update fires only when a watched field really changed; out-of-order and
re-announced events are dropped, and the inbox row says how many and why."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.accounts import connections
from shared.core.db import Database
from shared.ingest import inbox
from shared.ingest.shadow import Seen, judge, value_hash
from tests.ingest_support import (
    hubspot_body,
    hubspot_event,
    inbox_rows,
    make_connection,
    trigger_events,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_judge_covers_every_verdict() -> None:
    prior = Seen(value_hash("lead"), T0, "10")
    assert judge(None, Seen(value_hash("lead"), T0, "1")) == "changed"
    assert judge(prior, Seen(value_hash("customer"), T0 + timedelta(seconds=1), "11")) == (
        "changed"
    )
    assert judge(prior, Seen(value_hash("lead"), T0 + timedelta(seconds=1), "11")) == "unchanged"
    assert judge(prior, Seen(value_hash("other"), T0 - timedelta(seconds=1), "9")) == (
        "out_of_order"
    )
    assert judge(prior, Seen(value_hash("customer"), T0 + timedelta(days=1), "10")) == (
        "re_announced"
    )
    assert value_hash(1) != value_hash("1")


def deliver(db: Database, connection_id: str, *events: dict[str, Any]) -> dict[str, Any]:
    """Store a body as the webhook would, drain it, and return its inbox row."""
    with db.transaction() as tx:
        stored = inbox.store(tx, connection_id, hubspot_body(*events), {})
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    (row,) = [r for r in inbox_rows(db) if r["id"] == stored.inbox_id]
    return row


def test_changed_unchanged_out_of_order_and_re_announced(db: Database) -> None:
    conn = make_connection(db, watched_fields={"contact": ["lifecyclestage"]})
    first = deliver(db, conn, hubspot_event(1, property_value="lead", occurred_at_ms=1000))
    assert first["status"] == "processed"
    assert first["outcome"] == {"produced": 1, "dropped": {}}

    changed = deliver(db, conn, hubspot_event(2, property_value="customer", occurred_at_ms=2000))
    assert changed["outcome"] == {"produced": 1, "dropped": {}}

    same_value = deliver(db, conn, hubspot_event(3, property_value="customer", occurred_at_ms=3000))
    assert same_value["outcome"] == {"produced": 0, "dropped": {"unchanged": 1}}

    older = deliver(db, conn, hubspot_event(4, property_value="lead", occurred_at_ms=1500))
    assert older["outcome"] == {"produced": 0, "dropped": {"out_of_order": 1}}

    # HubSpot's retry of event 3 (attemptNumber bumped: a different body, same event id).
    retry = hubspot_event(3, property_value="customer", occurred_at_ms=3000)
    retry["attemptNumber"] = 1
    assert deliver(db, conn, retry)["outcome"] == {"produced": 0, "dropped": {"re_announced": 1}}

    events = trigger_events(db)
    assert [(e["event_type"], e["payload"]["eventId"]) for e in events] == [
        ("hubspot.contact.property_changed", 1),
        ("hubspot.contact.property_changed", 2),
    ]
    assert events[1]["changed_fields"] == {"lifecyclestage": "customer"}
    assert events[1]["author_id"] == "userId:42"
    assert (events[1]["record_object_type"], events[1]["record_object_id"]) == ("contact", "101")
    with db.transaction() as tx:
        shadow = tx.one("SELECT value_hash, occurred_at, last_event_id FROM shadow_records")
    assert shadow is not None
    assert bytes(shadow["value_hash"]) == hashlib.sha256(b'"customer"').digest()
    digest = hashlib.sha256(b"customer").hexdigest()[:16]
    assert (
        shadow["last_event_id"]
        == f"555:contact.property_changed:0-1/101:lifecyclestage:3000:{digest}"
    )


def test_unwatched_field_is_dropped_and_says_so(db: Database) -> None:
    conn = make_connection(db, watched_fields={"contact": ["email"]})
    row = deliver(db, conn, hubspot_event(1, property_name="phone", property_value="1"))
    assert row["outcome"] == {"produced": 0, "dropped": {"not_watched": 1}}
    assert trigger_events(db) == []
    # Created events don't depend on watched fields.
    created = deliver(db, conn, hubspot_event(2, subscription_type="contact.creation"))
    assert created["outcome"] == {"produced": 1, "dropped": {}}


def activate_workflow(db: Database, tenant: str, trigger: dict[str, Any]) -> None:
    definition = {"name": "wf", "tenant": tenant, "trigger": trigger, "steps": [{"id": "a"}]}
    with db.transaction() as tx:
        wf = tx.scalar(
            "INSERT INTO workflows (tenant_id, name) VALUES (:t, :n) RETURNING id::text",
            t=tenant,
            n=f"wf-{uuid.uuid4().hex[:8]}",
        )
        version = tx.scalar(
            "INSERT INTO workflow_versions (workflow_id, number, content_hash, definition,"
            " source_text) VALUES (CAST(:w AS uuid), 1, :h, CAST(:d AS jsonb), '')"
            " RETURNING id::text",
            w=wf,
            h=uuid.uuid4().hex * 2,
            d=json.dumps(definition),
        )
        tx.execute(
            "INSERT INTO workflow_activations (workflow_id, version_id)"
            " VALUES (CAST(:w AS uuid), CAST(:v AS uuid))",
            w=wf,
            v=version,
        )


def test_watched_fields_are_the_union_of_active_triggers_and_the_connection_setting(
    db: Database,
) -> None:
    conn = make_connection(db, watched_fields={"contact": ["email"]})
    activate_workflow(
        db,
        "acme",
        {"events": ["hubspot.deal.property_changed"], "watch": ["dealstage", "amount"]},
    )
    activate_workflow(db, "acme", {"events": ["hubspot.company.property_changed"], "watch": []})
    activate_workflow(db, "acme", {"events": ["hubspot.contact.created"], "watch": ["ignored"]})
    make_connection(db, tenant_id="globex", secret_env="OTHER")
    activate_workflow(
        db, "globex", {"events": ["hubspot.contact.property_changed"], "watch": ["x"]}
    )
    with db.transaction() as tx:
        connection = connections.get_connection(tx, conn)
        assert connection is not None
        watched = connections.watched_fields(tx, connection)
    assert watched.by_object == {
        "contact": frozenset({"email"}),
        "deal": frozenset({"dealstage", "amount"}),
        "company": frozenset({"*"}),  # a property-change trigger with no watch list: all fields
    }
    row = deliver(
        db,
        conn,
        hubspot_event(1, 7, subscription_type="deal.propertyChange", property_name="dealstage"),
        hubspot_event(2, 7, subscription_type="deal.propertyChange", property_name="closedate"),
        hubspot_event(3, 8, subscription_type="company.propertyChange", property_name="name"),
    )
    assert row["outcome"] == {"produced": 2, "dropped": {"not_watched": 1}}


def test_two_drainers_racing_on_one_field_emit_one_change(db: Database) -> None:
    import threading

    from shared.ingest.inbox import DrainPolicy, claim_rows, process_row

    conn = make_connection(db, watched_fields={"contact": ["lifecyclestage"]})
    # Two deliveries announce the same change under different event ids (first sighting). The
    # event id is not part of an event's identity (HubSpot: "not guaranteed to be unique"; the
    # journal has none, issue 26): the second is the same change, re-announced.
    for event_id in (1, 2):
        with db.transaction() as tx:
            inbox.store(
                tx, conn, hubspot_body(hubspot_event(event_id, property_value="customer")), {}
            )
    policy = DrainPolicy(batch_size=1)
    barrier = threading.Barrier(2)
    results: list[str] = []

    def drainer() -> None:
        lease = str(uuid.uuid4())
        (row,) = claim_rows(db, lease, policy)
        barrier.wait(timeout=10)
        results.append(process_row(db, row, lease, policy)[0])

    threads = [threading.Thread(target=drainer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results == ["processed", "processed"]
    outcomes = sorted((r["outcome"]["produced"], r["outcome"]["dropped"]) for r in inbox_rows(db))
    assert outcomes == [(0, {"re_announced": 1}), (1, {})]
    assert len(trigger_events(db)) == 1
