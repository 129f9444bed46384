"""Pipedrive webhooks (v2) on the real path: an authenticated POST to the webhook function,
the inbox drained into trigger events (shadow records), then admission.

What Pipedrive sends (docs/vendors/pipedrive.md §1.1, §5; its webhooks v2 guide
https://pipedrive.readme.io/docs/guide-for-webhooks-v2 and migration guide
https://pipedrive.readme.io/docs/webhooks-v2-migration-guide): on a change, `previous` holds the
old values of only the fields that changed, plus `update_time` on every change; custom fields
nest under `custom_fields` with typed values; `meta.change_source` is `api` for a change made
through the API and `app` for the web app, and `meta.user_id` the user who made it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devstack import seed
from shared.admission import admit as admission
from shared.core.db import Database
from shared.ingest import echo
from shared.ingest.inbox import drain_inbox
from tests.ingest_support import (
    PIPEDRIVE_CREDENTIALS,
    basic_auth,
    inbox_rows,
    make_tenant,
    trigger_events,
    webhook_client,
)
from tests.ops_support import bearer, mint

OUR_USER = "12415231"  # the Pipedrive user onceflow's connection acts as (GET /v1/users/me)
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The webhook function (functions-framework's test client)."""
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")  # the tests drain the inbox themselves
    monkeypatch.setenv("PIPEDRIVE_CREDENTIALS_ACME", PIPEDRIVE_CREDENTIALS)
    yield webhook_client()


def pipedrive_connection(db: Database, *, user_id: str | None = OUR_USER) -> str:
    make_tenant(db)
    with db.transaction() as tx:
        return seed.connection(
            tx,
            "acme",
            provider="pipedrive",
            webhook_secret_env="PIPEDRIVE_CREDENTIALS_ACME",
            provider_user_id=user_id,
        )


def watching(db: Database, watch: list[str]) -> str:
    """An active workflow of acme on Pipedrive person changes (`watch` empty: every field)."""
    trigger: dict[str, Any] = {"events": ["pipedrive.contact.property_changed"]}
    if watch:
        trigger["watch"] = watch
    with db.transaction() as tx:
        return seed.workflow(tx, "acme", "on-person-change", trigger)


def person_change(
    event_id: str,
    *,
    data: dict[str, Any],
    previous: dict[str, Any],
    at: datetime = T0,
    change_source: str = "app",
    user_id: str = "777",
    attempt: int = 1,
) -> bytes:
    """A v2 `change.person` body shaped like the migration guide's examples (ids as strings,
    an ISO timestamp with milliseconds, `previous` with `update_time`)."""
    stamp = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps(
        {
            "meta": {
                "action": "change",
                "entity": "person",
                "entity_id": "8",
                "id": event_id,
                "company_id": "8087566",
                "user_id": user_id,
                "change_source": change_source,
                "attempt": attempt,
                "timestamp": stamp,
                "type": "general",
                "version": "2.0",
                "webhook_id": "42",
            },
            "data": {"id": 8, "name": "Ada", "update_time": stamp, **data},
            "previous": {"update_time": "2026-01-01T00:00:00Z", **previous},
        }
    ).encode()


def deliver(hooks: Any, db: Database, connection_id: str, body: bytes) -> dict[str, Any]:
    """POST the body as Pipedrive would (HTTP Basic), drain the inbox; the body's inbox row."""
    response = hooks.post(f"/pipedrive/{connection_id}", data=body, headers=basic_auth())
    assert response.status_code == 200, response.data
    drain_inbox(db, budget_seconds=10, until_empty=True)
    return inbox_rows(db)[-1]


def admit_last(db: Database) -> list[str | None]:
    event_id = int(trigger_events(db)[-1]["id"])
    result = admission.admit_event(db, event_id, publish=lambda ids: None)
    return [o.reason for o in result.outcomes]


def test_a_change_of_only_update_time_is_dropped_as_unchanged(hooks: Any, db: Database) -> None:
    """Every v2 change carries `update_time` in `previous`; a change where nothing else
    changed (a note re-saved, a custom field set to what it was) is no change of any field a
    workflow can watch, even one watching every field."""
    connection_id = pipedrive_connection(db)
    watching(db, [])
    row = deliver(hooks, db, connection_id, person_change("e-1", data={}, previous={}))
    assert row["outcome"] == {"produced": 0, "dropped": {"unchanged": 1}}
    assert trigger_events(db) == []


def test_a_change_reports_the_fields_that_changed_custom_fields_by_key(
    hooks: Any, db: Database
) -> None:
    connection_id = pipedrive_connection(db)
    watching(db, [])
    hashed = "3d0fa3e4c7c8d6b2a9f1e0d4c3b2a1f0e9d8c7b6"
    body = person_change(
        "e-1",
        data={"email": "ada@x.io", "custom_fields": {hashed: {"type": "varchar", "value": "VIP"}}},
        previous={"email": "old@x.io", "custom_fields": {hashed: None}},
    )
    row = deliver(hooks, db, connection_id, body)
    assert row["outcome"] == {"produced": 1, "dropped": {}}
    (event,) = trigger_events(db)
    assert event["changed_fields"] == {"email": "ada@x.io", hashed: "VIP"}
    assert event["event_type"] == "pipedrive.contact.property_changed"


def test_a_stale_change_is_dropped_and_a_retry_is_re_announced(hooks: Any, db: Database) -> None:
    """Retries (3, 30, 150 s) can overtake a later first attempt: the older change arrives
    after the newer one and must not move the field back. A retry of the same event
    (`attempt` + 1, same `meta.id`, so a different body) is the same event again."""
    connection_id = pipedrive_connection(db)
    watching(db, ["email"])
    newer = person_change("e-2", data={"email": "new@x.io"}, previous={"email": "mid@x.io"}, at=T0)
    older = person_change(
        "e-1",
        data={"email": "mid@x.io"},
        previous={"email": "old@x.io"},
        at=T0 - timedelta(seconds=5),
    )
    assert deliver(hooks, db, connection_id, newer)["outcome"] == {"produced": 1, "dropped": {}}
    assert deliver(hooks, db, connection_id, older)["outcome"] == {
        "produced": 0,
        "dropped": {"out_of_order": 1},
    }
    retry = person_change(
        "e-2", data={"email": "new@x.io"}, previous={"email": "mid@x.io"}, at=T0, attempt=2
    )
    assert deliver(hooks, db, connection_id, retry)["outcome"] == {
        "produced": 0,
        "dropped": {"re_announced": 1},
    }
    assert len(trigger_events(db)) == 1


def _mark_written(db: Database, connection_id: str, fields: dict[str, Any]) -> None:
    """What crm.update commits before its request leaves (shared/blocks/crm.py `_mark_echo`)."""
    with db.transaction() as tx:
        echo.record_echo_marker(
            tx,
            connection_id=connection_id,
            object_type="contact",
            object_id="8",
            fields=fields,
            step_id=None,
            ttl_seconds=600,
        )


def test_onceflows_own_api_write_comes_back_and_is_refused_as_an_echo(
    hooks: Any, db: Database
) -> None:
    """Our write comes back as `change_source: api` by the connection's user, with
    `update_time` in `previous`: the marker rule must see only the field onceflow wrote."""
    connection_id = pipedrive_connection(db)
    watching(db, ["email"])
    _mark_written(db, connection_id, {"email": "ada@x.io"})
    body = person_change(
        "e-1",
        data={"email": "ada@x.io"},
        previous={"email": "old@x.io"},
        at=datetime.now(UTC),
        change_source="api",
        user_id=OUR_USER,
    )
    deliver(hooks, db, connection_id, body)
    assert admit_last(db) == ["echo_suppressed"]


@pytest.mark.parametrize(
    ("change_source", "user_id"),
    [("app", OUR_USER), ("api", "999")],
    ids=["our-user-in-the-web-app", "another-integration"],
)
def test_a_change_not_made_by_onceflows_api_user_is_never_an_echo(
    hooks: Any, client: Any, db: Database, change_source: str, user_id: str
) -> None:
    """The author says who made the change: the connection's user editing in the web app, or
    another user's API integration, setting the very value onceflow wrote within the
    marker's TTL, is a real change (the marker rule alone would take it for an echo). The
    operator names the connection's user when making it (ops API)."""
    make_tenant(db)
    made = client.post(
        "/v1/connections",
        headers=bearer(mint(db, None, label="ops-admin")),
        json={
            "tenant_id": "acme",
            "provider": "pipedrive",
            "webhook_secret_env": "PIPEDRIVE_CREDENTIALS_ACME",
            "provider_user_id": OUR_USER,
        },
    )
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["provider_user_id"] == OUR_USER
    connection_id = made.get_json()["id"]
    watching(db, ["email"])
    _mark_written(db, connection_id, {"email": "ada@x.io"})
    body = person_change(
        "e-1",
        data={"email": "ada@x.io"},
        previous={"email": "old@x.io"},
        at=datetime.now(UTC),
        change_source=change_source,
        user_id=user_id,
    )
    deliver(hooks, db, connection_id, body)
    assert admit_last(db) == [None]


def test_without_the_connections_user_the_marker_rule_decides_alone(
    hooks: Any, db: Database
) -> None:
    """A connection whose user onceflow never learnt (made before install recorded it) falls
    back to the marker rule: an (app) change matching a live marker is taken for an echo."""
    connection_id = pipedrive_connection(db, user_id=None)
    watching(db, ["email"])
    _mark_written(db, connection_id, {"email": "ada@x.io"})
    body = person_change(
        "e-1",
        data={"email": "ada@x.io"},
        previous={"email": "old@x.io"},
        at=datetime.now(UTC),
        change_source="app",
    )
    deliver(hooks, db, connection_id, body)
    assert admit_last(db) == ["echo_suppressed"]
