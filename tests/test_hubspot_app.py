"""One webhook URL per HubSpot app: a batch mixing portals is verified against the app, stored
once, and each event routed to its connection by (appId, portalId) when drained; events of
portals nobody connected are recorded per app and acknowledged (issue 13, item 1).

HubSpot: "The webhooks API is configured for a public app, not individual accounts. Any account
that installs your app ... will be subscribed to its webhook subscriptions", and every event
carries `portalId` and `appId` (https://developers.hubspot.com/docs/api/webhooks)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.accounts import provider_apps
from shared.core.db import Database
from shared.core.errors import ConflictError
from shared.ingest import inbox
from tests.ingest_support import (
    hubspot_body,
    hubspot_event,
    hubspot_v3_headers,
    inbox_rows,
    make_connection,
    trigger_events,
    webhook_client,
)
from tests.ops_support import (
    bearer,
    install_ops_api,
    mint,
)

BASE = "https://hooks.example.com"
APP_ID = "77"
APP_SECRET = "app-77-client-secret"
OTHER_APP_SECRET = "app-88-client-secret"
PATH = f"/hubspot/app/{APP_ID}"


@pytest.fixture(scope="module")
def client() -> Any:
    return webhook_client()


@pytest.fixture
def ops_client(db: Database, dispatched: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    return install_ops_api(db, dispatched, monkeypatch).test_client()


@pytest.fixture(autouse=True)
def app_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")
    monkeypatch.delenv("PUBLIC_BASE_URL", raising=False)
    monkeypatch.setenv("HUBSPOT_APP_77_SECRET", APP_SECRET)
    monkeypatch.setenv("HUBSPOT_APP_88_SECRET", OTHER_APP_SECRET)


@pytest.fixture
def app(db: Database) -> provider_apps.ProviderApp:
    with db.transaction() as tx:
        for app_id in (APP_ID, "88"):
            provider_apps.register_app(
                tx,
                provider="hubspot",
                app_id=app_id,
                client_secret_env=f"HUBSPOT_APP_{app_id}_SECRET",
            )
        found = provider_apps.get_app(tx, "hubspot", APP_ID)
    assert found is not None
    return found


def event(event_id: int, portal: int, object_id: int = 101, app_id: int = 77) -> dict[str, Any]:
    e = hubspot_event(event_id, object_id, subscription_type="contact.creation")
    e.update(portalId=portal, appId=app_id)
    return e


def post(client: Any, body: bytes, secret: str = APP_SECRET, path: str = PATH) -> Any:
    headers = hubspot_v3_headers(body, BASE + path, secret=secret)
    return client.post(path, data=body, headers=headers, base_url=BASE)


def unrouted(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT app_id, account_id, reason, deliveries, event_type"
            " FROM unrouted_provider_events ORDER BY id"
        )


def test_a_mixed_batch_is_stored_once_and_routed_per_portal(
    client: Any, db: Database, app: provider_apps.ProviderApp
) -> None:
    acme = make_connection(db, tenant_id="acme", app_id=APP_ID, portal_id="1001")
    globex = make_connection(db, tenant_id="globex", app_id=APP_ID, portal_id="2002")
    batch = [event(1, 1001, 11), event(1, 2002, 22), event(2, 3003, 33), event(3, 1001, 12)]
    response = post(client, hubspot_body(*batch))
    assert response.status_code == 200, response.json
    (row,) = inbox_rows(db)  # stored once, as HubSpot sent it
    assert row["connection_id"] is None

    report = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert (report.processed, report.events) == (1, 3)
    routed = sorted((str(e["connection_id"]), e["record_object_id"]) for e in trigger_events(db))
    assert routed == sorted([(acme, "11"), (acme, "12"), (globex, "22")])
    tenants = {e["record_object_id"]: e["tenant_id"] for e in trigger_events(db)}
    assert tenants == {"11": "acme", "12": "acme", "22": "globex"}
    assert inbox_rows(db)[0]["outcome"] == {"produced": 3, "dropped": {"unrouted": 1}}
    assert unrouted(db) == [
        {
            "app_id": APP_ID,
            "account_id": "3003",
            "reason": "no_live_connection",
            "deliveries": 1,
            "event_type": "hubspot.contact.created",
        }
    ]

    # HubSpot retries the batch (attemptNumber bumped: new bytes, a new inbox row): nothing
    # runs twice, and the unrouted event counts one more delivery instead of a second row.
    retry = [{**e, "attemptNumber": 1} for e in batch]
    assert post(client, hubspot_body(*retry)).status_code == 200
    again = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert (again.processed, again.events) == (1, 0)
    assert len(trigger_events(db)) == 3
    assert [r["deliveries"] for r in unrouted(db)] == [2]
    with db.transaction() as tx:
        summary = provider_apps.unrouted_summary(tx, "hubspot", APP_ID)
    assert [(s["account_id"], s["events"], s["deliveries"]) for s in summary] == [("3003", 1, 2)]
    assert summary[0]["explanation"] == "the portal has no live connection for this app"


def test_a_batch_of_unknown_portals_only_is_acknowledged_and_recorded(
    client: Any, db: Database, app: provider_apps.ProviderApp
) -> None:
    body = hubspot_body(
        event(1, 4004), event(2, 4004, 102, app_id=88), {**event(3, 1), "portalId": None}
    )
    assert post(client, body).status_code == 200
    report = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert (report.processed, report.events, report.dead) == (1, 0, 0)
    assert sorted((r["account_id"], r["reason"]) for r in unrouted(db)) == [
        ("", "no_account"),
        ("4004", "no_live_connection"),
        ("4004", "other_app"),
    ]


def test_events_that_arrived_before_the_portals_connection_are_rerouted_once_it_exists(
    client: Any, db: Database, app: provider_apps.ProviderApp
) -> None:
    """Issue 23 item 16: HubSpot installs the app on a portal at consent, and sends its events
    from then on; the portal's connection appears later (when the install is confirmed). The
    events that arrived meanwhile were recorded as unrouted and could never be routed. Now the
    sweep's duty drains them into the new connection's trigger events, exactly once; an event
    from long before this install (the portal kept the app after an older connection ended)
    stays for ops."""
    from shared.ingest.inbox import reroute_unrouted as reroute_unrouted_app_events
    from shared.sweep.catalog import default_duties

    assert post(client, hubspot_body(event(1, 3003, 31), event(2, 3003, 32))).status_code == 200
    assert post(client, hubspot_body(event(3, 3003, 33))).status_code == 200
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert [r["reason"] for r in unrouted(db)] == ["no_live_connection"] * 3
    with db.transaction() as tx:  # event 3 came long before this install
        tx.execute(
            "UPDATE unrouted_provider_events SET first_seen_at = now() - interval '3 hours',"
            " last_seen_at = now() - interval '3 hours' WHERE payload->>'objectId' = '33'"
        )
    assert trigger_events(db) == []

    connection = make_connection(db, tenant_id="globex", app_id=APP_ID, portal_id="3003")
    assert reroute_unrouted_app_events(db) == {"rerouted": 2, "events": 2}
    events = trigger_events(db)
    assert sorted(
        (str(e["connection_id"]), e["tenant_id"], e["record_object_id"]) for e in events
    ) == [
        (connection, "globex", "31"),
        (connection, "globex", "32"),
    ]
    assert reroute_unrouted_app_events(db) == {"rerouted": 0, "events": 0}  # once
    assert len(trigger_events(db)) == 2
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT source_event_id, rerouted_to::text AS rerouted_to"
            " FROM unrouted_provider_events ORDER BY id"
        )
    assert [r["rerouted_to"] for r in rows] == [connection, connection, None]
    with db.transaction() as tx:  # ops still sees the one nobody took
        summary = provider_apps.unrouted_summary(tx, "hubspot", APP_ID)
    assert [(s["account_id"], s["events"]) for s in summary] == [("3003", 1)]
    assert "reroute_unrouted_app_events" in {d.name for d in default_duties()}


def test_two_sweeps_rerouting_at_once_route_each_event_once(
    client: Any, db: Database, app: provider_apps.ProviderApp
) -> None:
    import threading

    from shared.ingest.inbox import reroute_unrouted

    assert (
        post(client, hubspot_body(*[event(i, 3003, 30 + i) for i in range(6)])).status_code == 200
    )
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    make_connection(db, tenant_id="globex", app_id=APP_ID, portal_id="3003")
    barrier = threading.Barrier(2)
    results: list[dict[str, int]] = []

    def sweep() -> None:
        barrier.wait()
        results.append(reroute_unrouted(db, batch=4))

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    results.append(reroute_unrouted(db))  # whatever a batch left
    assert sum(r["rerouted"] for r in results) == 6
    assert sorted(e["record_object_id"] for e in trigger_events(db)) == [
        str(30 + i) for i in range(6)
    ]


def test_a_signature_of_another_app_is_refused_and_nothing_is_stored(
    client: Any, db: Database, app: provider_apps.ProviderApp
) -> None:
    make_connection(db, app_id=APP_ID, portal_id="1001")
    body = hubspot_body(event(1, 1001))
    response = post(client, body, secret=OTHER_APP_SECRET)
    assert response.status_code == 401
    assert response.json == {"error": "invalid_signature", "check": "hubspot_v3_mismatch"}
    assert post(client, body, path="/hubspot/app/99").status_code == 404  # no such app
    assert post(client, body, path="/hubspot/app/not-a-number").status_code == 404
    assert inbox_rows(db) == []


def test_one_live_connection_per_app_and_portal(
    db: Database, app: provider_apps.ProviderApp
) -> None:
    make_connection(db, tenant_id="acme", app_id=APP_ID, portal_id="1001")
    with pytest.raises(ConflictError):
        make_connection(db, tenant_id="globex", app_id=APP_ID, portal_id="1001")


def test_ops_shows_the_operator_which_portals_nobody_takes(
    client: Any, db: Database, app: provider_apps.ProviderApp, ops_client: Any
) -> None:
    make_connection(db, tenant_id="acme", app_id=APP_ID, portal_id="1001")
    assert post(client, hubspot_body(event(1, 1001), event(2, 3003))).status_code == 200
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    operator = ops_client.get(f"/v1/apps/hubspot/{APP_ID}", headers=bearer(mint(db, None)))
    assert operator.status_code == 200, operator.get_json()
    report = operator.get_json()
    assert [(u["account_id"], u["reason"], u["events"]) for u in report["unrouted"]] == [
        ("3003", "no_live_connection", 1)
    ]
    # An app spans tenants: a tenant's token sees no app at all.
    tenant = ops_client.get(f"/v1/apps/hubspot/{APP_ID}", headers=bearer(mint(db, "acme")))
    assert tenant.status_code == 404


def test_a_dead_app_row_is_listed_and_requeued_for_the_operator_only(
    client: Any, db: Database, app: provider_apps.ProviderApp, ops_client: Any
) -> None:
    assert post(client, hubspot_body(event(1, 1001))).status_code == 200
    (row,) = inbox_rows(db)
    with db.transaction() as tx:  # what running out of transient attempts leaves behind
        tx.execute(
            "UPDATE webhook_inbox SET status = 'dead', finished_at = now(), last_error = 'x'"
            " WHERE id = :id",
            id=row["id"],
        )
    make_connection(db, tenant_id="acme", app_id=APP_ID, portal_id="1001")
    operator, tenant = bearer(mint(db, None)), bearer(mint(db, "acme"))
    listed = ops_client.get("/v1/inbox/stuck", headers=operator).get_json()["rows"]
    assert [(r["id"], r["app_id"], r["connection_id"]) for r in listed] == [
        (row["id"], APP_ID, None)
    ]
    assert ops_client.get("/v1/inbox/stuck", headers=tenant).get_json()["rows"] == []
    path = f"/v1/inbox/{row['id']}/requeue"
    assert ops_client.post(path, headers=tenant, json={}).status_code == 404
    assert ops_client.post(path, headers=operator, json={}).status_code == 200
    assert inbox.drain_inbox(db, budget_seconds=10, until_empty=True).events == 1
