"""HubSpot's webhooks journal as an event source (issue 26 item 2), against the fake's journal
over real HTTP and real Postgres: entries read once after the committed offset, the offset moved
in the transaction that stores them (a reader killed between the two loses and duplicates
nothing), two readers at once (one wins each entry), a change that came by webhook and from the
journal is one event, and a gap longer than the journal's 3 days is reported, not skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from devstack import seed
from devstack.fakecrm.server import FakeCrm, FakeCrmConfig
from shared.accounts import provider_apps
from shared.accounts.client_credentials import ClientToken, ClientTokenCache
from shared.core.crashpoints import EXIT_CODE
from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.ingest import inbox, journal
from shared.normalize import UnparseableBody
from shared.ops.auth import Principal
from shared.ops.health import health_report
from shared.ops.models import SchedulerHealth
from shared.providers import connect
from shared.providers.descriptor import JournalEntry
from shared.providers.hubspot import journal as hubspot_journal
from shared.providers.registry import normalize
from shared.publishing import subscriptions, versions
from shared.sweep.catalog import default_duties
from tests.ingest_support import (
    hubspot_v3_headers,
    inbox_rows,
    make_connection,
    trigger_events,
    webhook_client,
)
from tests.ops_support import Dispatched, bearer, install_ops_api, mint

ROOT = Path(__file__).resolve().parent.parent
APP_ID = "424242"
PORTAL = 62515
CLIENT_ID = "journal-client-id"
SECRET = "journal-app-secret"  # HubSpot: the app's client secret signs webhooks too
ENV = {
    "HUBSPOT_APP_424242_CLIENT_SECRET": SECRET,
    "HUBSPOT_APP_424242_CLIENT_ID": CLIENT_ID,
    "WEBHOOK_NUDGE": "off",
}
USER = ("CRM_UI", "userId:7001")
DAY = 24 * 3600


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PUBLIC_BASE_URL", raising=False)


@pytest.fixture
def fake() -> Iterator[FakeCrm]:
    crm = FakeCrm(
        FakeCrmConfig(
            app_id=APP_ID,
            portal_id=PORTAL,
            app_secret=SECRET,
            oauth_client_id=CLIENT_ID,
            oauth_client_secret=SECRET,
        )
    ).start()
    crm.journal.portals = {PORTAL}
    yield crm
    crm.stop()


@pytest.fixture
def app(db: Database, fake: FakeCrm) -> provider_apps.ProviderApp:
    with db.transaction() as tx:
        provider_apps.register_app(
            tx,
            provider="hubspot",
            app_id=APP_ID,
            client_secret_env="HUBSPOT_APP_424242_CLIENT_SECRET",
            oauth_client_id_env="HUBSPOT_APP_424242_CLIENT_ID",
            api_base_url=fake.url,
        )
        journal.enable(tx, "hubspot", APP_ID)
        found = provider_apps.get_app(tx, "hubspot", APP_ID)
    assert found is not None
    make_connection(
        db,
        tenant_id="acme",
        app_id=APP_ID,
        portal_id=str(PORTAL),
        watched_fields={"contact": ["email", "lifecyclestage"]},
    )
    return found


def contacts(fake: FakeCrm, count: int) -> list[str]:
    first = len(fake.records("contacts"))
    return [
        fake.create_record("contacts", {"email": f"c{first + i}@x.io"}, USER).id
        for i in range(count)
    ]


def offsets(fake: FakeCrm) -> list[str]:
    return [e.offset for e in fake.journal.entries]


def stored_offsets(db: Database) -> list[str]:
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT headers->>'x-onceflow-journal-offset' AS o FROM webhook_inbox ORDER BY id"
        )
    return [r["o"] for r in rows]


def committed_offset(db: Database) -> str | None:
    with db.transaction() as tx:
        row = journal.state(tx, "hubspot", APP_ID)
    assert row is not None
    return row["last_offset"]


def event_keys(db: Database) -> list[tuple[str, str]]:
    return [(e["event_type"], e["source_event_id"]) for e in trigger_events(db)]


def test_entries_are_read_once_after_the_offset_and_become_events(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    ids = contacts(fake, 3)
    report = journal.read_journal(db, "hubspot", APP_ID)
    assert (report.stored, report.ended, report.error) == (3, True, None)
    assert stored_offsets(db) == offsets(fake)
    assert committed_offset(db) == offsets(fake)[-1]

    drained = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert drained.processed == 3
    # Each creation is two events, as its webhooks are: created, and the email it was set with.
    events = trigger_events(db)
    assert sorted((e["event_type"], e["record_object_id"]) for e in events) == sorted(
        [("hubspot.contact.created", i) for i in ids]
        + [("hubspot.contact.property_changed", i) for i in ids]
    )
    assert {e["changed_fields"].get("email") for e in events} >= {f"c{i}@x.io" for i in range(3)}

    # Idle: one call, nothing stored; later changes are read from where the last pass stopped.
    calls = len(fake.store.requests)
    again = journal.read_journal(db, "hubspot", APP_ID)
    assert (again.stored, again.ended) == (0, True)
    assert len(fake.store.requests) == calls + 1
    fake.update_record("contacts", ids[0], {"email": "new@x.io"}, USER)
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 1
    assert stored_offsets(db) == offsets(fake)
    # One client-credentials token served every pass (cached, fresh for 30 minutes).
    assert fake.journal.token_grants == 1


def test_a_reader_killed_between_storing_and_moving_the_offset_loses_and_repeats_nothing(
    db: Database, database_url: str, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    contacts(fake, 4)
    script = (
        "from shared.core.db import get_database\n"
        "from shared.ingest import journal\n"
        f"journal.read_journal(get_database(), 'hubspot', '{APP_ID}')\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=ROOT,
        env=dict(
            os.environ,
            **ENV,
            DATABASE_URL=database_url,
            NO_GCE_CHECK="true",
            ONCEFLOW_ENABLE_CRASH_POINTS="1",
            # The third entry is in the inbox, its offset not moved: killed there.
            ONCEFLOW_CRASH_POINTS="journal_after_store_before_offset:3",
        ),
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == EXIT_CODE, child.stderr.decode()[-2000:]
    # One transaction: the two entries before committed with their offset, the third not at all.
    assert stored_offsets(db) == offsets(fake)[:2]
    assert committed_offset(db) == offsets(fake)[1]

    report = journal.read_journal(db, "hubspot", APP_ID)
    assert report.stored == 2
    assert stored_offsets(db) == offsets(fake)  # each entry once, none skipped
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    keys = event_keys(db)
    assert len(keys) == 8 and len(set(keys)) == 8


def test_two_readers_at_once_one_wins_each_entry(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    contacts(fake, 1)
    entry = hubspot_journal.next_entry(app, "global", None)
    assert isinstance(entry, JournalEntry)
    barrier = threading.Barrier(2)
    results: list[inbox.Stored | None] = []

    def reader() -> None:
        barrier.wait(timeout=10)
        results.append(journal.store_entry(db, app, "global", None, entry))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 2
    assert sum(r is not None for r in results) == 1  # exactly one wins the entry
    assert stored_offsets(db) == [entry.offset]
    (row,) = inbox_rows(db)
    assert row["deliveries"] == 1  # the loser's write rolled back with it

    # Whole passes racing over many entries: every entry stored once, in order.
    contacts(fake, 12)
    reports: list[journal.PassReport] = []

    def passes() -> None:
        barrier.wait(timeout=10)
        reports.append(journal.read_journal(db, "hubspot", APP_ID))

    threads = [threading.Thread(target=passes) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(reports) == 2 and all(r.error is None for r in reports)
    assert sum(r.stored for r in reports) == 12
    assert stored_offsets(db) == offsets(fake)


def test_a_change_by_webhook_and_from_the_journal_is_one_event(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    # The same app's webhooks, delivered to the fake's sink so the test can pass them on.
    fake.config.webhook_url = f"{fake.url}/_sink/hubspot"
    (contact,) = contacts(fake, 1)
    fake.update_record("contacts", contact, {"lifecyclestage": "customer"}, USER)
    assert fake.webhooks.wait_idle(10)
    client = webhook_client()
    path = f"/hubspot/app/{APP_ID}"
    for request in fake.sink_requests():
        body = request["body"].encode()
        headers = hubspot_v3_headers(body, "https://hooks.example.com" + path, secret=SECRET)
        answer = client.post(path, data=body, headers=headers, base_url="https://hooks.example.com")
        assert answer.status_code == 200, answer.json
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    by_webhook = event_keys(db)
    assert len(by_webhook) == 3  # created, email set, lifecycle stage changed

    report = journal.read_journal(db, "hubspot", APP_ID)
    assert report.stored == 2
    drained = inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert drained.processed == 2
    assert event_keys(db) == by_webhook  # the journal's copies were the same events
    outcomes = [r["outcome"] for r in inbox_rows(db)[-2:]]
    assert sum(o["produced"] for o in outcomes) == 0
    assert sum(sum(o["dropped"].values()) for o in outcomes) == 3


def test_duplicated_journal_entries_are_one_event(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    fake.journal.duplicate_every = 1  # every entry written twice, at two offsets
    contacts(fake, 2)
    assert len(offsets(fake)) == 4
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 4
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    keys = event_keys(db)
    assert len(keys) == 4 and len(set(keys)) == 4


def advance(fake: FakeCrm, seconds: float) -> None:
    httpx.post(f"{fake.url}/_admin/journal/advance", json={"seconds": seconds}).raise_for_status()


def test_a_gap_longer_than_three_days_is_reported_and_reading_resumes_at_the_earliest(
    db: Database,
    fake: FakeCrm,
    app: provider_apps.ProviderApp,
    dispatched: Dispatched,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    contacts(fake, 1)
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 1
    lost = committed_offset(db)
    advance(fake, 2 * DAY)
    contacts(fake, 1)  # written while the reader was away; still kept when it comes back
    advance(fake, 2 * DAY)  # the offset read last is 4 days old now: gone
    contacts(fake, 1)

    report = journal.read_journal(db, "hubspot", APP_ID)
    assert (report.gaps, report.stored, report.error) == (1, 1, None)
    # Resumed at the earliest entry kept, read from there on: nothing kept is skipped.
    assert stored_offsets(db) == offsets(fake)
    with db.transaction() as tx:
        (gap,) = journal.recent_gaps(tx)
    assert (gap["lost_after"], gap["resumed_at"]) == (lost, offsets(fake)[1])
    assert "72 h" in gap["detail"]
    health = health_report(
        db,
        Principal(token_id="t", tenant_id=None, label="admin"),
        scheduler=lambda: SchedulerHealth(available=True, detail=None, jobs=[]),
    )
    assert any(f"app {APP_ID} journal global: gap detected" in p for p in health.problems)
    # Support sees it on the app: the journal's state and the gap.
    ops = install_ops_api(db, dispatched, monkeypatch).test_client()
    answer = ops.get(f"/v1/apps/hubspot/{APP_ID}", headers=bearer(mint(db, None)))
    assert answer.status_code == 200, answer.json
    (state,) = answer.json["journals"]
    assert (state["journal"], state["last_offset"], state["last_error"]) == (
        "global",
        offsets(fake)[-1],
        None,
    )
    assert [(g["lost_after"], g["resumed_at"]) for g in state["gaps"]] == [(lost, offsets(fake)[1])]


def test_the_journal_refuses_a_token_without_its_scope(fake: FakeCrm) -> None:
    token = httpx.post(
        f"{fake.url}/oauth/2026-03/token",
        data={
            "grant_type": "client_credentials",
            "client_id": CLIENT_ID,
            "client_secret": SECRET,
            "scope": "developer.webhooks_journal.subscriptions.read",
        },
    ).json()
    assert token["token_use"] == "client_credentials" and "refresh_token" not in token
    answer = httpx.get(
        f"{fake.url}/webhooks-journal/journal/2026-03/earliest",
        headers={"Authorization": f"Bearer {token['access_token']}"},
    )
    assert answer.status_code == 403
    assert httpx.get(f"{fake.url}/webhooks-journal/journal/2026-03/earliest").status_code == 401


def test_journal_subscriptions_follow_the_active_workflows_per_portal(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    """Journal subscriptions are per install: the reconcile keeps, in every portal with an
    active connection of the app, exactly what the active workflows need — through the journal's
    management API with a client-credentials token, never the legacy webhooks v3 API — and the
    journal then carries only those changes."""
    make_connection(db, tenant_id="globex", app_id=APP_ID, portal_id="7007")
    with db.transaction() as tx:
        wf = seed.workflow(
            tx,
            "acme",
            "stage",
            {"events": ["hubspot.contact.property_changed"], "watch": ["lifecyclestage"]},
        )
        seed.workflow(tx, "globex", "new-deals", {"events": ["hubspot.deal.created"]})
    results = subscriptions.reconcile_apps(db, connect.port_for_app)
    assert [(r.connection_id, r.ok, r.errors) for r in results] == [
        (f"hubspot-app:{APP_ID}", True, ())
    ]
    held = {
        (s["portalId"], s["objectTypeId"], tuple(s["actions"]), tuple(s["properties"]))
        for s in fake.journal.subscriptions.values()
    }
    assert held == {
        (portal, *key)
        for portal in (PORTAL, 7007)
        for key in (("0-1", ("UPDATE",), ("lifecyclestage",)), ("0-3", ("CREATE",), ()))
    }
    assert not any(r["path"].startswith("/webhooks/v3") for r in fake.store.requests)
    again = subscriptions.reconcile_apps(db, connect.port_for_app)[0]
    assert (again.created, again.deleted, again.kept) == ((), (), 2)

    # Only the subscribed change is journaled: the stage, not the email.
    (contact,) = contacts(fake, 1)
    fake.update_record("contacts", contact, {"lifecyclestage": "customer"}, USER)
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 1
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert [(e["event_type"], e["changed_fields"]) for e in trigger_events(db)] == [
        ("hubspot.contact.property_changed", {"lifecyclestage": "customer"})
    ]

    # A workflow deactivated: what only it needed goes, in every portal.
    with db.transaction() as tx:
        versions.deactivate(tx, tenant_id="acme", workflow_id=wf)
    after = subscriptions.reconcile_apps(db, connect.port_for_app)[0]
    assert after.deleted == (("contact", "propertyChange", "lifecyclestage"),)
    assert {s["objectTypeId"] for s in fake.journal.subscriptions.values()} == {"0-3"}


def test_a_portals_local_journal_is_read_by_its_own_offset(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    """`journal-local/2026-03/…?installPortalId=`: only that portal's entries."""
    with db.transaction() as tx:
        tx.execute("DELETE FROM provider_journals")
        journal.enable(tx, "hubspot", APP_ID, str(PORTAL))
    fake.journal.portals = {PORTAL, 7007}
    contacts(fake, 2)
    fake.create_record("contacts", {"email": "other@x.io"}, USER, portal_id=7007)
    report = journal.read_journal(db, "hubspot", APP_ID, str(PORTAL))
    assert (report.stored, report.error) == (2, None)
    mine = [e.offset for e in fake.journal.entries if e.portal == PORTAL]
    assert stored_offsets(db) == mine
    assert any("journal-local/2026-03" in r["path"] for r in fake.store.requests)


def test_an_expired_token_or_download_link_skips_nothing(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    contacts(fake, 1)
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 1
    # HubSpot expired the token before our cache thought it would: a 401, a new token, on.
    fake.journal.token_seconds = 600
    fake.journal.tokens.clear()
    contacts(fake, 1)
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 1
    assert fake.journal.token_grants == 2
    # Links that are already expired when fetched: the pass fails, the offset stays.
    fake.journal.link_seconds = 0
    contacts(fake, 1)
    stuck = journal.read_journal(db, "hubspot", APP_ID)
    assert stuck.stored == 0 and stuck.error is not None and "link" in stuck.error
    with db.transaction() as tx:
        row = journal.state(tx, "hubspot", APP_ID)
    assert row is not None and row["last_error"] == stuck.error
    fake.journal.link_seconds = 300
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 1
    assert stored_offsets(db) == offsets(fake)


def test_client_tokens_are_fetched_again_before_they_expire() -> None:
    now = [0.0]
    cache = ClientTokenCache(margin_seconds=300, clock=lambda: now[0])
    issued: list[str] = []

    def fetch() -> ClientToken:
        issued.append(f"t{len(issued)}")
        return ClientToken(issued[-1], 1800)

    assert cache.token("app", fetch) == "t0"
    now[0] = 1499.0  # 301 s left: still used
    assert cache.token("app", fetch) == "t0"
    now[0] = 1501.0  # less than the margin left: a new one before it expires
    assert cache.token("app", fetch) == "t1"
    cache.forget("app", "t0")  # an old token refused: the current one stays
    assert cache.token("app", fetch) == "t1"
    cache.forget("app", "t1")
    assert cache.token("app", fetch) == "t2"


def test_the_sweep_duty_reads_every_journal_and_drains_what_it_stored(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    (duty,) = [d for d in default_duties(SweepConfig()) if d.name == "read_provider_journals"]
    contacts(fake, 2)
    summary = duty.run(db)
    assert (summary["journals"], summary["stored"], summary["failed"]) == (1, 2, 0)
    assert [r["status"] for r in inbox_rows(db)] == ["processed", "processed"]
    assert len(trigger_events(db)) == 4
    calls = len(fake.store.requests)
    assert duty.run(db)["stored"] == 0
    assert len(fake.store.requests) == calls + 1  # idle: one cheap call


def test_journal_events_of_a_portal_not_connected_yet_are_rerouted_once_it_is(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    """The unrouted path of app webhooks serves the journal too: its events are kept in the
    webhook shape, so the sweep's re-route normalizes them as the drain did."""
    fake.journal.portals = {PORTAL, 7007}
    fake.create_record("contacts", {"email": "early@x.io"}, USER, portal_id=7007)
    assert journal.read_journal(db, "hubspot", APP_ID).stored == 1
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    assert trigger_events(db) == []
    globex = make_connection(
        db,
        tenant_id="globex",
        app_id=APP_ID,
        portal_id="7007",
        watched_fields={"contact": ["email"]},
    )
    assert inbox.reroute_unrouted(db) == {"rerouted": 2, "events": 2}
    assert sorted((str(e["connection_id"]), e["event_type"]) for e in trigger_events(db)) == [
        (globex, "hubspot.contact.created"),
        (globex, "hubspot.contact.property_changed"),
    ]


def test_entry_files_of_other_shapes_are_read_defensively() -> None:
    """The file's contents are not documented (docs/vendors/hubspot-2026.md 2.5): a list or an
    object, changes as a map or a list, times as ISO or ms, values wrapped or bare; the portal
    of a local journal when the event names none; an unknown action kept under its own name."""
    headers = {"x-onceflow-journal-offset": "off-1", "x-onceflow-journal": "555"}
    body = json.dumps(
        [
            {
                "action": "UPDATE",
                "objectTypeId": "0-3",
                "objectId": 9,
                "occurredAt": 1_700_000_000_123,
                "propertyChanges": [
                    {"propertyName": "amount", "value": 10},
                    {"name": "dealstage", "newValue": "won"},
                ],
            },
            {
                "action": "MERGE",
                "objectTypeId": "0-1",
                "objectId": 4,
                "occurredAt": "2023-11-14T22:13:20.5Z",
                "portalId": 556,
            },
            {"action": "APP_INSTALL", "type": "APP_LIFECYCLE_EVENT", "occurredAt": 5},
        ]
    ).encode()
    events = normalize("hubspot", body, headers)  # in the order they occurred
    assert [(e.event_type, dict(e.changed_fields)) for e in events] == [
        ("hubspot.app_lifecycle_event.app_install", {}),
        ("hubspot.deal.property_changed", {"amount": "10"}),
        ("hubspot.deal.property_changed", {"dealstage": "won"}),
        ("hubspot.contact.merged", {}),
    ]
    assert [e.payload.get("portalId") for e in events] == ["555", "555", "555", 556]
    assert events[3].occurred_at == datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC)
    assert events[1].payload["eventId"] == "off-1#0"
    # A webhook-shaped file and a wrapped one read the same.
    wrapped = json.dumps(
        {"offset": "off-2", "journalEvents": [json.loads(body)[0]], "publishedAt": "x"}
    ).encode()
    again = normalize("hubspot", wrapped, {**headers, "x-onceflow-journal-offset": "off-2"})
    assert [e.source_event_id for e in again] == [e.source_event_id for e in events[1:3]]
    with pytest.raises(UnparseableBody):
        normalize("hubspot", b"not json", headers)
    with pytest.raises(UnparseableBody):
        normalize("hubspot", b'{"journalEvents": []}', headers)


def test_a_project_app_reading_the_journal_has_no_project_drift(
    db: Database, fake: FakeCrm, app: provider_apps.ProviderApp
) -> None:
    """Journal subscriptions are made per install through the management API and "don't work
    with the feature component functionality" (docs/vendors/hubspot-2026.md 2.1): a project
    app that reads the journal declares no webhook components, so what its workflows need is
    not drift — the journal reconcile creates it."""
    with db.transaction() as tx:
        provider_apps.register_app(
            tx,
            provider="hubspot",
            app_id=APP_ID,
            client_secret_env="HUBSPOT_APP_424242_CLIENT_SECRET",
            oauth_client_id_env="HUBSPOT_APP_424242_CLIENT_ID",
            api_base_url=fake.url,
            platform="project",
        )
        seed.workflow(tx, "acme", "new-deals", {"events": ["hubspot.deal.created"]})
    assert subscriptions.project_drift(db, None) == []
    assert subscriptions.project_drift(db, "acme") == []
    (result,) = subscriptions.reconcile_apps(db, connect.port_for_app)
    assert result.ok and result.created == (("deal", "creation", None),)
