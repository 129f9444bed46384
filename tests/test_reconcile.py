"""Provider subscription reconcile: the desired union, the plan, idempotency, convergence after
drift — pure logic with an in-memory port double, the record in Postgres, and one run over
real HTTP against the fake HubSpot server through the real adapter."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import pytest

from devstack import seed
from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.accounts import provider_apps
from shared.accounts.connections import create_connection
from shared.core.db import Database
from shared.port.interface import (
    Capabilities,
    PortError,
    Record,
    SearchFilter,
    Subscription,
)
from shared.providers import connect
from shared.providers.hubspot import versions as hubspot_versions
from shared.providers.hubspot.port import HubSpotPort
from shared.publishing import subscriptions as subs
from shared.publishing import versions
from tests.blocks_support import fake_crm
from tests.examples_support import CRM_EVENT_EXAMPLES
from tests.ops_support import (
    bearer,
    install_ops_api,
    mint,
)

# The examples HubSpot webhooks start (the others need no provider subscription).
EXAMPLES = CRM_EVENT_EXAMPLES
# What the examples need from HubSpot.
EXAMPLE_KEYS = {
    ("contact", "propertyChange", "lifecyclestage"),
    ("deal", "propertyChange", "dealstage"),
    ("contact", "propertyChange", "hs_sales_email_last_replied"),
    # lead-replied-reengage's wait_for reads hs_lead_status: no trigger watches it.
    ("contact", "propertyChange", "hs_lead_status"),
    # sync-edited-contact's debounced trigger.
    ("contact", "propertyChange", "phone"),
    ("contact", "propertyChange", "jobtitle"),
    ("contact", "propertyChange", "company"),
    # deal-amount-alert's throttled trigger.
    ("deal", "propertyChange", "amount"),
    # deal-won-handoff's mode-all wait reads these: no trigger watches them.
    ("deal", "propertyChange", "contract_status"),
    ("company", "propertyChange", "billing_status"),
}
# What only deal-won-handoff's wait needs.
KICKOFF_KEYS = {
    ("deal", "propertyChange", "contract_status"),
    ("company", "propertyChange", "billing_status"),
}
# What only the deal examples need.
DEAL_KEYS = {
    ("deal", "propertyChange", "dealstage"),
    ("deal", "propertyChange", "amount"),
    *KICKOFF_KEYS,
}


class PortDouble:
    """An in-memory provider subscription list (pure-logic tests only)."""

    capabilities = Capabilities(subscription_management=True)

    def __init__(self) -> None:
        self.subs: dict[str, Subscription] = {}
        self.ids = itertools.count(100)
        self.calls: list[str] = []
        self.fail_create: set[tuple[str, str, str | None]] = set()

    def add(self, key: tuple[str, str, str | None]) -> None:
        sid = str(next(self.ids))
        self.subs[sid] = Subscription(*key, id=sid)

    def keys(self) -> list[tuple[str, str, str | None]]:
        return sorted((s.key() for s in self.subs.values()), key=str)

    def list_subscriptions(self) -> list[Subscription]:
        self.calls.append("list")
        return list(self.subs.values())

    def create_subscription(self, subscription: Subscription) -> Subscription:
        self.calls.append("create")
        if subscription.key() in self.fail_create:
            raise PortError("refused", code="invalid_request", transient=False)
        if subscription.key() in {s.key() for s in self.subs.values()}:
            raise PortError("exists", code="conflict", transient=False)
        self.add(subscription.key())
        return subscription

    def delete_subscription(self, subscription_id: str) -> None:
        self.calls.append("delete")
        if self.subs.pop(subscription_id, None) is None:
            raise PortError("gone", code="not_found", transient=False)

    def create(self, object_type: str, properties: Mapping[str, Any]) -> Record:
        raise NotImplementedError

    def update(self, object_type: str, object_id: str, properties: Mapping[str, Any]) -> Record:
        raise NotImplementedError

    def get(self, object_type: str, object_id: str, properties: Sequence[str] = ()) -> Record:
        raise NotImplementedError

    def search(
        self, object_type: str, filters: Sequence[SearchFilter], limit: int = 10
    ) -> list[Record]:
        raise NotImplementedError


TRIGGERS = [
    {"events": ["hubspot.contact.created", "pipedrive.deal.created"]},
    {"events": ["hubspot.deal.property_changed"], "watch": ["dealstage", "amount"]},
    {"events": ["hubspot.contact.property_changed", "hubspot.contact.created"], "watch": []},
    {"events": ["hubspot.company.teleported", "standard.invoice.paid"]},
]
DEFINITIONS = [{"trigger": t} for t in TRIGGERS]


def test_desired_is_the_union_of_active_triggers_for_the_provider() -> None:
    desired = subs.desired_subscriptions("hubspot", DEFINITIONS)
    assert desired.keys == {
        ("contact", "creation", None),
        ("deal", "propertyChange", "dealstage"),
        ("deal", "propertyChange", "amount"),
    }
    assert desired.unsupported == (
        "hubspot.company.teleported: hubspot has no subscription for 'teleported'",
        "hubspot.contact.property_changed (trigger): no fields to subscribe to (`watch`)",
    )
    # One webhook per (object, action) at Pipedrive: no per-field subscriptions.
    assert subs.desired_subscriptions("pipedrive", DEFINITIONS).keys == {("deal", "create", None)}


def test_plan_creates_missing_and_deletes_unneeded_and_duplicates() -> None:
    existing = [
        Subscription("contact", "creation", None, id="1"),
        Subscription("contact", "creation", None, id="2"),  # duplicate
        Subscription("company", "deletion", None, id="3"),  # no longer needed
    ]
    desired = frozenset({("contact", "creation", None), ("deal", "propertyChange", "amount")})
    plan = subs.plan_reconcile(desired, existing)
    assert [s.key() for s in plan.create] == [("deal", "propertyChange", "amount")]
    assert sorted(s.id or "" for s in plan.delete) == ["2", "3"]
    assert plan.kept == 1


def test_a_wait_subscribes_to_what_it_waits_for_even_when_no_trigger_watches_it() -> None:
    """Issue 23 item 2: subscriptions came from triggers only, so a wait_for on another
    property was never subscribed. Its `watch`, else the fields its `when` reads, are."""
    steps = [
        {
            "id": "reply",
            "type": "wait_for",
            "config": {
                "event": "hubspot.contact.property_changed",
                "when": 'event.changed_fields.hs_lead_status == "CONNECTED" && record.id != ""',
            },
        },
        {
            "id": "paid",
            "type": "wait_for",
            "config": {"event": "hubspot.deal.property_changed", "watch": ["amount"]},
        },
        {"id": "made", "type": "wait_for", "config": {"event": "hubspot.company.created"}},
        {"id": "any", "type": "wait_for", "config": {"event": "hubspot.ticket.property_changed"}},
    ]
    definition = {"trigger": {"cron": "0 9 * * *"}, "steps": steps}
    desired = subs.desired_subscriptions("hubspot", [definition])
    assert desired.keys == {
        ("contact", "propertyChange", "hs_lead_status"),
        ("deal", "propertyChange", "amount"),
        ("company", "creation", None),
    }
    assert desired.unsupported == (
        "hubspot.ticket.property_changed (steps.any): no fields to subscribe to "
        "(`watch` or `when`)",
    )


def test_apply_is_idempotent_and_converges_after_drift() -> None:
    port = PortDouble()
    port.add(("company", "creation", None))  # left over from an old workflow
    desired = subs.desired_subscriptions("hubspot", DEFINITIONS)
    first = subs.apply_plan("c1", port, desired)
    assert first.ok
    assert set(port.keys()) == desired.keys
    assert first.deleted == (("company", "creation", None),)
    port.calls.clear()
    again = subs.apply_plan("c1", port, desired)
    assert (again.created, again.deleted, again.kept) == ((), (), 3)
    assert port.calls == ["list"]  # nothing to do: no write at all
    # Drift behind onceflow's back: one deleted, one foreign added, one duplicated.
    victim = next(sid for sid, s in port.subs.items() if s.property_name == "amount")
    del port.subs[victim]
    port.add(("ticket", "creation", None))
    port.add(("contact", "creation", None))
    repaired = subs.apply_plan("c1", port, desired)
    assert repaired.ok
    assert set(port.keys()) == desired.keys
    assert len(port.subs) == len(desired.keys)


def test_a_failed_change_is_reported_and_the_rest_still_applies() -> None:
    port = PortDouble()
    port.add(("ticket", "creation", None))
    port.fail_create.add(("deal", "propertyChange", "amount"))
    result = subs.apply_plan("c1", port, subs.desired_subscriptions("hubspot", DEFINITIONS))
    assert not result.ok
    assert result.errors == ("create deal.propertyChange[amount]: refused",)
    assert result.deleted == (("ticket", "creation", None),)
    assert len(result.created) == 2


def test_a_provider_without_subscription_api_is_skipped() -> None:
    port = PortDouble()
    port.capabilities = Capabilities(subscription_management=False)
    result = subs.apply_plan("c1", port, subs.desired_subscriptions("hubspot", DEFINITIONS))
    assert result.ok
    assert result.skipped == "provider has no subscription API"
    assert port.calls == []


# ---------------------------------------------------------------- with Postgres


def _seed(db: Database, base_url: str = "http://127.0.0.1:9") -> str:
    with db.transaction() as tx:
        seed.tenant(tx, "acme", name="Acme", existing="keep")
        connection_id = str(
            tx.scalar(
                "INSERT INTO connections (tenant_id, provider, webhook_secret_env, "
                "api_credentials_env, api_base_url, provider_app_id) VALUES ('acme', 'hubspot', "
                "'FAKECRM_APP_SECRET', 'FAKECRM_TOKEN', :u, '424242') RETURNING id::text",
                u=base_url,
            )
        )
        for path in EXAMPLES:
            published = versions.publish(tx, path.read_text(), filename=str(path))
            versions.activate(
                tx,
                tenant_id="acme",
                workflow_id=published.workflow_id,
                version_id=published.version_id,
            )
    return connection_id


def test_reconcile_records_the_outcome_per_connection(db: Database) -> None:
    connection_id = _seed(db)
    port = PortDouble()
    result = subs.reconcile_connection(db, connection_id, port)
    assert result.ok
    assert set(port.keys()) == EXAMPLE_KEYS
    last = subs.last_reconcile(db, connection_id)
    assert last is not None
    assert last["ok"] is True
    assert len(last["desired"]["subscriptions"]) == len(EXAMPLE_KEYS)
    assert len(last["result"]["created"]) == len(EXAMPLE_KEYS)
    # Deactivating the workflows that watch deal stages removes what only they needed; while
    # one of them is still active its subscription stays.
    watching = (
        "deal-closed-won",
        "discount-approval",
        "deal-contacts-foreach",
        "deal-won-kickoff",
        "deal-won-handoff",
    )
    for name in watching:
        if name != watching[0]:
            assert subs.reconcile_connection(db, connection_id, port).deleted == ()
        with db.transaction() as tx:
            wf = tx.scalar("SELECT id::text FROM workflows WHERE name = :n", n=name)
            versions.deactivate(tx, tenant_id="acme", workflow_id=wf)
    result = subs.reconcile_connection(db, connection_id, port)
    gone = {("deal", "propertyChange", "dealstage"), *KICKOFF_KEYS}
    assert set(result.deleted) == gone
    assert set(port.keys()) == EXAMPLE_KEYS - gone


def test_reconcile_all_records_a_connection_whose_port_cannot_be_built(db: Database) -> None:
    good = _seed(db)
    with db.transaction() as tx:
        bad = str(
            tx.scalar(
                "INSERT INTO connections (tenant_id, provider, webhook_secret_env) "
                "VALUES ('acme', 'hubspot', 'X_SECRET') RETURNING id::text"
            )
        )
    port = PortDouble()

    def port_for(connection_id: str) -> PortDouble:
        if connection_id == bad:
            raise PortError("no credentials", code="unauthorized", transient=False)
        return port

    results = {r.connection_id: r for r in subs.reconcile_all(db, port_for)}
    assert results[good].ok
    assert not results[bad].ok
    last = subs.last_reconcile(db, bad)
    assert last is not None
    assert last["ok"] is False
    assert "no credentials" in last["result"]["errors"][0]


# ---------------------------------------------------------------- real HTTP


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch, FakeCrmConfig(token="tok", require_subscriptions=True)) as server:
        yield server


def _provider_keys(fake: FakeCrm) -> list[tuple[str, str, str | None]]:
    out = []
    for s in fake.state()["subscriptions"]:
        obj, _, kind = s["eventType"].partition(".")
        out.append((obj, kind, s.get("propertyName") or None))
    return sorted(out, key=str)


def test_reconcile_over_real_http_against_the_fake_provider(db: Database, fake: FakeCrm) -> None:
    connection_id = _seed(db, fake.url)
    first = subs.reconcile_all(db, functools.partial(connect.port_for, db))
    assert [r.ok for r in first] == [True]
    assert set(_provider_keys(fake)) == EXAMPLE_KEYS
    assert len(_provider_keys(fake)) == len(EXAMPLE_KEYS)

    again = subs.reconcile_all(db, functools.partial(connect.port_for, db))
    assert (again[0].created, again[0].deleted, again[0].kept) == ((), (), len(EXAMPLE_KEYS))

    # Drift at the provider, behind onceflow's back.
    base = fake.url + hubspot_versions.webhook_subscriptions("424242")
    headers = {"Authorization": "Bearer tok"}
    with httpx.Client(headers=headers, timeout=5) as client:
        listed = client.get(base).json()["results"]
        victim = next(
            s
            for s in listed
            if s["eventType"] == "contact.propertyChange" and s["propertyName"] == "lifecyclestage"
        )
        assert client.delete(f"{base}/{victim['id']}").status_code == 204
        foreign = client.post(base, json={"eventType": "company.deletion"})
        assert foreign.status_code == 201
    repaired = subs.reconcile_all(db, functools.partial(connect.port_for, db))[0]
    assert repaired.ok
    assert repaired.created == (("contact", "propertyChange", "lifecyclestage"),)
    assert repaired.deleted == (("company", "deletion", None),)
    assert set(_provider_keys(fake)) == EXAMPLE_KEYS
    last = subs.last_reconcile(db, connection_id)
    assert last is not None
    assert last["ok"] is True


def test_a_service_key_connection_has_no_subscriptions_to_reconcile(
    db: Database, fake: FakeCrm
) -> None:
    """Service keys "do not support webhooks": the hourly reconcile leaves such a connection
    alone instead of calling the subscriptions API with its key (refused, every hour)."""
    connection_id = _seed(db, fake.url)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET credential_kind = 'service_key' WHERE id = CAST(:c AS uuid)",
            c=connection_id,
        )
    assert subs.reconcile_all(db, connect.port_for) == []
    assert fake.state()["requests"] == []


# ---------------------------------------------------------------- per provider app


def _seed_app(db: Database, fake_url: str, *, kind: str = "public") -> tuple[str, str]:
    """One HubSpot app installed on two portals of two tenants: acme runs the contact
    workflows, globex the deal ones."""
    with db.transaction() as tx:
        provider_apps.register_app(
            tx,
            provider="hubspot",
            app_id="424242",
            kind=kind,  # type: ignore[arg-type]
            client_secret_env="FAKECRM_APP_SECRET",
            developer_credential_env="FAKECRM_DEVELOPER_KEY",
            api_base_url=fake_url,
        )
        ids = []
        for tenant, portal in (("acme", "1001"), ("globex", "2002")):
            seed.tenant(tx, tenant, existing="keep")
            ids.append(
                create_connection(
                    tx,
                    tenant_id=tenant,
                    provider="hubspot",
                    webhook_secret_env="FAKECRM_APP_SECRET",
                    api_credentials_env="FAKECRM_TOKEN",
                    api_base_url=fake_url,
                    provider_account_id=portal,
                    provider_app_id="424242",
                )
            )
        for path in EXAMPLES:
            source = path.read_text()
            tenant = "globex" if path.name.startswith(("deal-", "discount-")) else "acme"
            source = source.replace("tenant: acme", f"tenant: {tenant}")
            published = versions.publish(tx, source, filename=str(path))
            versions.activate(
                tx,
                tenant_id=tenant,
                workflow_id=published.workflow_id,
                version_id=published.version_id,
            )
    return ids[0], ids[1]


@pytest.fixture
def dev_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv("FAKECRM_DEVELOPER_KEY", "dev-key")
    config = FakeCrmConfig(token="tok", require_subscriptions=True, developer_api_key="dev-key")
    with fake_crm(monkeypatch, config) as server:
        yield server


def test_an_apps_subscriptions_are_the_union_over_its_connections(
    db: Database, dev_fake: FakeCrm
) -> None:
    """Two portals of one app: reconciling per connection made each delete what the other
    needed. Per app, the fake holds the union, and a second pass changes nothing."""
    acme, globex = _seed_app(db, dev_fake.url)
    results = subs.reconcile_all(db, functools.partial(connect.port_for, db), connect.port_for_app)
    assert [(r.connection_id, r.ok) for r in results] == [("hubspot-app:424242", True)]
    assert set(_provider_keys(dev_fake)) == EXAMPLE_KEYS
    again = subs.reconcile_all(db, functools.partial(connect.port_for, db), connect.port_for_app)
    assert (again[0].created, again[0].deleted, again[0].kept) == ((), (), len(EXAMPLE_KEYS))
    # A per-connection reconcile of one portal refuses to touch the app's subscriptions.
    skipped = subs.reconcile_connection(db, acme, connect.port_for(db, acme))
    assert skipped.skipped == "reconciled per provider app"
    assert set(_provider_keys(dev_fake)) == EXAMPLE_KEYS
    # Deactivating globex's connection drops what only globex needed.
    with db.transaction() as tx:
        tx.execute("UPDATE connections SET status = 'paused' WHERE id = CAST(:c AS uuid)", c=globex)
    after = subs.reconcile_all(db, functools.partial(connect.port_for, db), connect.port_for_app)[0]
    assert set(after.deleted) == DEAL_KEYS
    last = subs.last_app_reconcile(db, "hubspot", "424242")
    assert last is not None and last["ok"] is True


def test_the_subscriptions_api_takes_the_developer_credential_not_a_crm_token(
    dev_fake: FakeCrm,
) -> None:
    portal_token_port = HubSpotPort("tok", base_url=dev_fake.url, app_id="424242")
    try:
        with pytest.raises(PortError) as err:
            portal_token_port.list_subscriptions()
        assert err.value.code == "unauthorized"
    finally:
        portal_token_port.close()


def test_a_private_app_is_not_reconciled_through_the_api(db: Database, dev_fake: FakeCrm) -> None:
    _seed_app(db, dev_fake.url, kind="private")
    sent_before = len(dev_fake.state()["requests"])
    (result,) = subs.reconcile_all(
        db, functools.partial(connect.port_for, db), connect.port_for_app
    )
    assert result.ok and result.skipped is not None and "UI" in result.skipped
    assert len(dev_fake.state()["requests"]) == sent_before  # HubSpot was not called
    last = subs.last_app_reconcile(db, "hubspot", "424242")
    assert last is not None
    to_create = {
        (s["object_type"], s["event_kind"], s["property_name"])
        for s in last["desired"]["subscriptions"]
    }
    assert to_create == EXAMPLE_KEYS  # what the operator must create in HubSpot's UI


def test_activating_or_deactivating_through_ops_reconciles_the_app_at_once(
    db: Database, dev_fake: FakeCrm, dispatched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed_app(db, dev_fake.url)
    assert _provider_keys(dev_fake) == []  # nothing reconciled yet
    client = install_ops_api(db, dispatched, monkeypatch).test_client()
    h = bearer(mint(db, "globex"))
    with db.transaction() as tx:
        deal_workflows = [
            (r["w"], r["v"])
            for r in tx.all(
                "SELECT w.id::text AS w, v.id::text AS v FROM workflows w"
                " JOIN workflow_versions v ON v.workflow_id = w.id"
                " WHERE w.tenant_id = 'globex' ORDER BY w.name"
            )
        ]
    for wf, _ in deal_workflows:
        assert client.post(f"/v1/workflows/{wf}/deactivate", headers=h, json={}).status_code == 200
    # The app's union without globex's deal workflows, right away (acme's needs stay).
    assert set(_provider_keys(dev_fake)) == EXAMPLE_KEYS - DEAL_KEYS
    for wf, version in deal_workflows:
        answer = client.post(
            f"/v1/workflows/{wf}/activate", headers=h, json={"version_id": version}
        )
        assert answer.status_code == 200
    assert set(_provider_keys(dev_fake)) == EXAMPLE_KEYS
