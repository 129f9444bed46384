"""The Pipedrive adapter against the fake Pipedrive over real HTTP: records through API v2 (v1
notes), errors classified into PortError, the burst limit's 429 waited out for the time its
headers give, API-token and OAuth connections built by shared/providers/connect.py, an expired
OAuth token refreshed once under concurrency, and webhooks managed as subscriptions. Creates
kept at most once (a lost answer OUTCOME_UNKNOWN, never sent again: Pipedrive has no
idempotent create) are proven for both CRMs in tests/test_blocks_crm.py (`crm_under_test`)."""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from devstack import seed
from devstack.fakepipedrive import DeliveryPolicy, FakePipedrive, FakePipedriveConfig
from devstack.fakepipedrive.oauth import Installed
from shared.accounts import connections, oauth_tokens, provider_apps
from shared.accounts.oauth_tokens import RefreshRevoked
from shared.blocks import crm
from shared.blocks.base import BlockFailure
from shared.core.db import Database
from shared.port.interface import Association, PortError, SearchFilter, Subscription
from shared.providers import connect, registry
from shared.providers.pipedrive import oauth
from shared.providers.pipedrive.kinds import EVENT_OBJECTS
from shared.providers.pipedrive.port import PipedrivePort
from shared.publishing import subscriptions as subs
from shared.publishing import versions
from tests.blocks_support import StepRunner, seed_tenant
from tests.steps_support import TENANT

HASH = "aa0fa3b1c2d4e5f60718293a4b5c6d7e8f901234"
REDIRECT = "https://hooks.example.com/webhook/oauth/pipedrive/callback"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePipedrive]:
    monkeypatch.setenv("PIPEDRIVE_TOKEN", "pd-api-token")
    monkeypatch.setenv(oauth_tokens.TOKEN_KEK_ENV, base64.b64encode(b"k" * 32).decode())
    monkeypatch.setenv("PD_CLIENT_ID", "fake-pd-client-id")
    monkeypatch.setenv("PD_CLIENT_SECRET", "fake-pd-client-secret")
    config = FakePipedriveConfig(
        custom_fields={"person": {HASH: "varchar"}},
        delivery=DeliveryPolicy(time_factor=0.01),
    )
    connect.forget_ports()
    pd = FakePipedrive(config).start()
    try:
        yield pd
    finally:
        pd.stop()
        connect.forget_ports()


@pytest.fixture
def port(fake: FakePipedrive) -> Iterator[PipedrivePort]:
    p = PipedrivePort("pd-api-token", base_url=fake.url)
    try:
        yield p
    finally:
        p.close()


def api_connection(db: Database, fake: FakePipedrive) -> str:
    seed_tenant(db, credits=100)
    with db.transaction() as tx:
        return seed.connection(
            tx,
            TENANT,
            provider="pipedrive",
            webhook_secret_env="PIPEDRIVE_CREDENTIALS",
            api_credentials_env="PIPEDRIVE_TOKEN",
            api_base_url=fake.url,
        )


def test_the_registry_declares_pipedrive_a_crm_without_write_idempotency() -> None:
    provider = registry.get("pipedrive")
    assert provider is not None and provider.crm is not None and provider.oauth is not None
    caps = provider.crm.capabilities
    assert caps.write_idempotency is False and caps.event_author_identity is True
    assert provider.crm.label_properties["contact"] == ("name",)  # neutral kinds, as keys name them


def test_records_round_trip_through_v2_and_v1_notes(
    fake: FakePipedrive, port: PipedrivePort
) -> None:
    org = port.create("organization", {"name": "Acme"})
    person = port.create(
        "contacts",  # onceflow's name for a person is taken too (the mapping hook)
        {"name": "Ada", "email": "ada@x.io", HASH: "blue"},
        [Association("organizations", org.id)],
    )
    assert person.object_type == "contact" and person.properties["email"] == "ada@x.io"
    [stored] = fake.stored("person")
    assert stored["org_id"] == int(org.id) and stored["custom_fields"] == {HASH: "blue"}
    changed = port.update("person", person.id, {HASH: "green", "owner_id": "7"})
    assert changed.properties[HASH] == "green" and changed.properties["owner_id"] == 7
    assert port.get("persons", person.id, [HASH]).properties["name"] == "Ada"
    [found] = port.search("person", [SearchFilter("email", "EQ", "ADA@x.io")])
    assert found.id == person.id
    deal = port.create("deal", {"title": "Big"}, [Association("person", person.id)])
    task = port.create("task", {"subject": "Call"}, [Association("contact", person.id)])
    assert fake.stored("activity")[0]["participants"] == [
        {"person_id": int(person.id), "primary": True}
    ]
    note = port.create("note", {"content": "<b>hi</b>"}, [Association("deal", deal.id)])
    assert port.update("note", note.id, {"content": "bye"}).properties["content"] == "bye"
    assert task.object_type == "task"


@pytest.mark.parametrize(
    ("action", "code", "transient"),
    [
        ("error_500", "unavailable", True),
        ("error_503", "unavailable", True),
        ("error_402", "unauthorized", False),
        ("feature_capping", "invalid_request", False),
        ("cloudflare_403", "rate_limited", True),
        ("reset", "connection_reset", True),
    ],
)
def test_failures_are_classified(
    fake: FakePipedrive, port: PipedrivePort, action: str, code: str, transient: bool
) -> None:
    fake.add_fault(action)
    with pytest.raises(PortError) as err:
        port.create("deal", {"title": "x"})
    assert (err.value.code, err.value.transient) == (code, transient)


def test_permanent_answers_carry_pipedrives_message(
    fake: FakePipedrive, port: PipedrivePort
) -> None:
    with pytest.raises(PortError) as bad:
        port.create("deal", {"value": 3})
    assert (bad.value.code, bad.value.transient, bad.value.status) == (
        "invalid_request",
        False,
        400,
    )
    assert "title: Required" in str(bad.value)
    with pytest.raises(PortError) as missing:
        port.get("deal", "999")
    assert missing.value.code == "not_found" and not missing.value.transient
    wrong = PipedrivePort("wrong", base_url=fake.url)
    with pytest.raises(PortError) as unauthorized:
        wrong.get("deal", "1")
    wrong.close()
    assert unauthorized.value.code == "unauthorized"
    with pytest.raises(PortError) as unsupported:
        port.search("deal", [SearchFilter("value", "GT", 3)])
    assert unsupported.value.code == "invalid_request"


def test_a_429_is_retried_after_the_time_its_burst_headers_give(
    db: Database, fake: FakePipedrive
) -> None:
    """Another instance spent the token's burst window: this step's create gets a real 429,
    fails transient with the `x-ratelimit-reset` wait and its mark withdrawn, and the retry
    after that wait creates the deal once."""
    fake.config.burst_api_token = 3
    fake.config.burst_window_seconds = 4  # Pipedrive's is 2 s: wider, so a slow machine can't
    connection_id = api_connection(db, fake)  # let the window roll before the step's call
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    config = {"object_type": "deals", "properties": {"title": "Big"}}
    # Spent right before the step's call (not before the setup above), so a loaded machine's
    # slow setup can't let the window roll first.
    for _ in range(3):  # another instance, same token
        httpx.get(f"{fake.url}/v1/users/me", headers={"x-api-token": "pd-api-token"})
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, config)
    limited = [r for r in fake.requests if r["status"] == 429]
    assert len(limited) == 1, err.value
    assert err.value.error_class == "transient"
    assert err.value.retry_after is not None and 1 <= err.value.retry_after <= 4
    assert not step.side_effect_started()  # a 429 is provably not applied
    time.sleep(err.value.retry_after)
    step.run(crm.CREATE, config)
    assert [d["title"] for d in fake.stored("deal")] == ["Big"]


def test_the_port_refuses_locally_while_the_headers_say_the_window_is_spent(
    fake: FakePipedrive, port: PipedrivePort
) -> None:
    fake.config.burst_api_token = 2
    fake.config.burst_window_seconds = 10  # both calls surely in one window
    port.create("deal", {"title": "a"})
    port.create("deal", {"title": "b"})  # remaining: 0
    with pytest.raises(PortError) as err:
        port.create("deal", {"title": "c"})
    assert err.value.code == "rate_limited" and err.value.retry_after is not None
    assert not [r for r in fake.requests if r["status"] == 429]  # no request spent on it
    assert port.rate_limit.max == 2 and port.rate_limit.extra["daily_requests_left"] is not None


def test_a_spent_search_window_holds_back_searches_only(
    fake: FakePipedrive, port: PipedrivePort
) -> None:
    fake.config.burst_search = 1
    fake.config.burst_window_seconds = 10
    person = port.create("person", {"name": "Ada"})
    port.search("person", [SearchFilter("name", "EQ", "Ada")])  # search's window: spent
    with pytest.raises(PortError) as err:
        port.search("person", [SearchFilter("name", "EQ", "Ada")])
    assert err.value.code == "rate_limited"
    assert port.get("person", person.id).id == person.id  # other calls go on


def test_a_spent_daily_budget_waits_until_midnight(
    fake: FakePipedrive, port: PipedrivePort
) -> None:
    fake.config.daily_budget = 1
    fake.config.token_budget_headers = True
    port.create("deal", {"title": "a"})  # costs 5 > 1: the budget is spent
    other = PipedrivePort("pd-api-token", base_url=fake.url)
    with pytest.raises(PortError) as err:
        other.get("deal", "1")
    other.close()
    assert err.value.code == "rate_limited" and err.value.retry_after is not None
    assert err.value.retry_after > 2  # not the burst window: until the daily reset


def oauth_connection(db: Database, fake: FakePipedrive) -> str:
    seed_tenant(db, credits=100)
    grant = fake.issue_grant(REDIRECT)
    with db.transaction() as tx:
        provider_apps.register_app(
            tx,
            provider="pipedrive",
            app_id="4243",
            client_secret_env="PD_CLIENT_SECRET",
            api_base_url=fake.url,
            oauth_client_id_env="PD_CLIENT_ID",
        )
        connection_id = connections.create_connection(
            tx,
            tenant_id=TENANT,
            provider="pipedrive",
            webhook_secret_env="PIPEDRIVE_CREDENTIALS",
            api_base_url=fake.url,
            provider_account_id=str(fake.config.company_id),
            provider_app_id="4243",
        )
        oauth_tokens.store_grant(tx, connection_id, grant, oauth_tokens.TOKEN_KEK_ENV)
    return connection_id


def test_an_expired_oauth_token_is_refreshed_once_under_concurrency(
    db: Database, fake: FakePipedrive
) -> None:
    connection_id = oauth_connection(db, fake)
    port = connect.port_for(db, connection_id)
    made = port.create("deal", {"title": "before"})
    httpx.post(f"{fake.url}/_admin/oauth/expire")  # Pipedrive expires it; our row says fresh
    barrier = threading.Barrier(4)
    results: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        barrier.wait()
        try:
            results.append(connect.port_for(db, connection_id).get("deal", made.id).id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and results == [made.id] * 4
    assert fake.oauth.refreshes == 1
    changes = [r for r in fake.requests if r.get("user_id") == fake.config.oauth_user_id]
    assert changes  # the app acts as the installing user


def deal_calls(fake: FakePipedrive) -> list[tuple[str, object]]:
    with fake.lock:
        return [(r["method"], r["status"]) for r in fake.requests if "/deals" in r["path"]]


def test_a_token_that_expires_mid_run_is_refreshed_once_and_the_call_retried_once(
    db: Database, fake: FakePipedrive
) -> None:
    connection_id = oauth_connection(db, fake)
    port = connect.port_for(db, connection_id)
    port.create("deal", {"title": "before"})
    httpx.post(f"{fake.url}/_admin/oauth/expire")
    port.create("deal", {"title": "after"})
    assert fake.oauth.refreshes == 1
    assert deal_calls(fake) == [("POST", 200), ("POST", 401), ("POST", 200)]
    assert [d["title"] for d in fake.stored("deal")] == ["before", "after"]  # one each


def test_a_second_401_fails_clearly_instead_of_looping(db: Database, fake: FakePipedrive) -> None:
    connection_id = oauth_connection(db, fake)
    fake.oauth.access_seconds = 0  # every token it issues from now on is dead on arrival
    httpx.post(f"{fake.url}/_admin/oauth/expire")
    with pytest.raises(PortError) as failed:
        connect.port_for(db, connection_id).create("deal", {"title": "x"})
    assert (failed.value.code, failed.value.transient, failed.value.status) == (
        "unauthorized",
        False,
        401,
    )
    assert deal_calls(fake) == [("POST", 401), ("POST", 401)]
    assert fake.stored("deal") == []


def test_an_uninstalled_app_fails_with_needs_reauthorization(
    db: Database, fake: FakePipedrive
) -> None:
    connection_id = oauth_connection(db, fake)
    port = connect.port_for(db, connection_id)
    httpx.post(f"{fake.url}/_admin/oauth/uninstall")  # Pipedrive: "Invalid grant" from now on
    with pytest.raises(PortError) as failed:
        port.create("deal", {"title": "x"})
    assert failed.value.code == "unauthorized" and "install the app again" in str(failed.value)
    with db.transaction() as tx:
        status = tx.scalar(
            "SELECT status FROM connections WHERE id = CAST(:c AS uuid)", c=connection_id
        )
    assert status == "needs_reauthorization"


def test_the_install_exchange_and_a_revoked_refresh(fake: FakePipedrive) -> None:
    url = oauth.authorize_url(client_id="cid", redirect_uri=REDIRECT, scopes=["x"], state="s")
    assert url.startswith("https://oauth.pipedrive.com/oauth/authorize?") and "scope" not in url
    code = fake.oauth.authorize(
        Installed(fake.config.oauth_user_id, fake.config.company_id), REDIRECT
    )
    grant = oauth.exchange_code(
        client_id="fake-pd-client-id",
        client_secret="fake-pd-client-secret",
        redirect_uri=REDIRECT,
        code=code,
        base_url=fake.url,
    )
    assert oauth.token_account(grant.access_token, base_url=fake.url).account_id == str(
        fake.config.company_id
    )
    refresh = oauth.pipedrive_refresher(
        client_id="fake-pd-client-id", client_secret="fake-pd-client-secret", base_url=fake.url
    )
    assert refresh(grant.refresh_token).refresh_token == grant.refresh_token
    httpx.post(f"{fake.url}/_admin/oauth/uninstall")
    with pytest.raises(RefreshRevoked):
        refresh(grant.refresh_token)


def test_webhooks_are_subscriptions_of_this_ports_url(fake: FakePipedrive) -> None:
    port = PipedrivePort(
        "pd-api-token",
        base_url=fake.url,
        webhook_url="https://hooks.example.com/webhook/pipedrive/c1",
        webhook_auth=("onceflow", "s3cret"),
    )
    made = port.create_subscription(Subscription("contact", "change", "email"))
    assert (made.object_type, made.event_kind) == ("contact", "change")  # as events name it
    [hook] = fake.webhooks.values()
    assert hook["http_auth_user"] == "onceflow" and hook["version"] == "2.0"
    httpx.post(
        f"{fake.url}/v1/webhooks",
        headers={"x-api-token": "pd-api-token"},
        json={
            "subscription_url": "https://other.example",
            "event_action": "*",
            "event_object": "*",
        },
    )
    assert [s.id for s in port.list_subscriptions()] == [made.id]  # not the other integration's
    port.delete_subscription(str(made.id))
    assert port.list_subscriptions() == []
    port.target_webhooks("https://hooks.example.com/webhook/pipedrive/c1", "no-colon-secret")
    with pytest.raises(PortError, match="user:password"):  # Basic could never verify it
        port.create_subscription(Subscription("deal", "create"))
    port.close()


RECONCILED = """
name: pd-reconcile
tenant: acme
trigger:
  events: [pipedrive.contact.property_changed, pipedrive.deal.created]
  watch: [name, email]
steps:
  - id: s0
    type: end
"""


def test_the_reconcile_creates_and_repairs_the_connections_webhooks(
    db: Database, fake: FakePipedrive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through shared/publishing/subscriptions.py with the port connect.py builds: one webhook
    per (object, action) — no per-field subscriptions — delivering to the connection's own URL
    with its webhook secret as HTTP Basic; a second reconcile has nothing to do; a webhook
    Pipedrive deleted (3 days without a successful delivery) is created again."""
    monkeypatch.setenv("PUBLIC_BASE_URL", "https://hooks.example.com/webhook")
    monkeypatch.setenv("PIPEDRIVE_CREDENTIALS", "onceflow:s3cret")
    connection_id = api_connection(db, fake)
    with db.transaction() as tx:
        published = versions.publish(tx, RECONCILED, filename="pd-reconcile.yaml")
        versions.activate(
            tx,
            tenant_id=TENANT,
            workflow_id=published.workflow_id,
            version_id=published.version_id,
        )
    first = subs.reconcile_connection_with(
        db, connection_id, functools.partial(connect.port_for, db)
    )
    assert first.ok, first.errors
    assert sorted(first.created) == [("contact", "change", None), ("deal", "create", None)]
    hooks = sorted(fake.webhooks.values(), key=lambda w: str(w["event_object"]))
    assert [(w["event_object"], w["event_action"]) for w in hooks] == [
        ("deal", "create"),
        ("person", "change"),
    ]
    assert {w["subscription_url"] for w in hooks} == {
        f"https://hooks.example.com/webhook/pipedrive/{connection_id}"
    }
    assert {(w["http_auth_user"], w["http_auth_password"]) for w in hooks} == {
        ("onceflow", "s3cret")
    }
    again = subs.reconcile_connection_with(
        db, connection_id, functools.partial(connect.port_for, db)
    )
    assert (again.created, again.deleted, again.kept) == ((), (), 2)
    with fake.lock:  # Pipedrive deletes a webhook after 3 days without a successful delivery
        del fake.webhooks[hooks[1]["id"]]
    repaired = subs.reconcile_connection_with(
        db, connection_id, functools.partial(connect.port_for, db)
    )
    assert repaired.created == (("contact", "change", None),) and repaired.kept == 1
    assert len(fake.webhooks) == 2


def test_listed_webhooks_name_their_object_as_the_events_do() -> None:
    """The port's EVENT_OBJECTS and the normaliser agree, or the reconcile would never
    converge (desired keys come from event types, listed ones from the port)."""
    for entity in ("person", "organization", "deal", "activity", "note"):
        body = {
            "meta": {"action": "create", "entity": entity, "entity_id": "1", "id": "e"}
            | {"timestamp": "2026-12-03T10:00:00.000Z"},
            "data": {"id": 1},
            "previous": None,
        }
        (event,) = registry.normalize("pipedrive", json.dumps(body).encode(), {})
        assert event.object_type == EVENT_OBJECTS.get(entity, entity)
