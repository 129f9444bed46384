"""The CRM port of an OAuth connection (a public app installed on a portal), against the fake
over real HTTP: it acts with the sealed grant's access token, refreshes it before it expires,
refreshes once and retries once when HubSpot answers 401 (a token that expired mid-run), fails
clearly on a second 401 instead of looping, and a revoked grant fails with needs_reauthorization.
A private app's static token keeps working beside it."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.accounts import connections, oauth_tokens, provider_apps
from shared.accounts.oauth_tokens import Grant
from shared.core.db import Database
from shared.port.interface import PortError
from shared.providers import connect
from shared.providers.hubspot import oauth as hubspot_oauth
from shared.providers.hubspot import versions
from tests.ingest_support import make_tenant

APP_ID = "424242"
PORTAL = 2002
REDIRECT = "https://hooks.example.com/webhook/oauth/hubspot/callback"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv(oauth_tokens.TOKEN_KEK_ENV, base64.b64encode(b"k" * 32).decode())
    monkeypatch.setenv("APP_CLIENT_ID", "fake-client-id")
    monkeypatch.setenv("APP_SECRET", "fake-client-secret")  # signatures and OAuth: one secret
    monkeypatch.setenv("PRIVATE_APP_TOKEN", "private-token")
    crm = FakeCrm(FakeCrmConfig(app_id=APP_ID, token="private-token")).start()
    connect.forget_ports()
    try:
        yield crm
    finally:
        connect.forget_ports()
        crm.stop()


def installed(db: Database, fake: FakeCrm) -> tuple[str, Grant]:
    """Portal 2002 installed the app: its connection with the grant the fake issued."""
    make_tenant(db, "acme")
    grant = fake.issue_grant(PORTAL, REDIRECT)
    with db.transaction() as tx:
        provider_apps.register_app(
            tx,
            provider="hubspot",
            app_id=APP_ID,
            client_secret_env="APP_SECRET",
            api_base_url=fake.url,
            oauth_client_id_env="APP_CLIENT_ID",
        )
        connection_id = connections.create_connection(
            tx,
            tenant_id="acme",
            provider="hubspot",
            webhook_secret_env="APP_SECRET",
            api_base_url=fake.url,
            provider_account_id=str(PORTAL),
            provider_app_id=APP_ID,
        )
        oauth_tokens.store_grant(tx, connection_id, grant, oauth_tokens.TOKEN_KEK_ENV)
    return connection_id, grant


def crm_calls(fake: FakeCrm) -> list[tuple[str, object]]:
    with fake.store.lock:
        return [
            (r["method"], r["status"])
            for r in fake.store.requests
            if str(r["path"]).startswith("/crm/")
        ]


def test_an_oauth_connection_acts_with_its_grant_in_its_portal(db: Database, fake: FakeCrm) -> None:
    connection_id, _ = installed(db, fake)
    made = connect.port_for(db, connection_id).create("deals", {"dealname": "oauth"})
    [record] = [r for r in fake.records("deals") if r["id"] == made.id]
    assert record["portalId"] == PORTAL  # the grant's portal, not the fake's default one
    assert fake.oauth.refreshes == 0


def test_a_token_that_expires_mid_run_is_refreshed_once_and_the_call_retried_once(
    db: Database, fake: FakeCrm
) -> None:
    connection_id, _ = installed(db, fake)
    port = connect.port_for(db, connection_id)
    port.create("deals", {"dealname": "before"})
    httpx.post(f"{fake.url}/_admin/oauth/expire")  # HubSpot expires it; our row says fresh
    made = port.create("deals", {"dealname": "after"})
    assert fake.oauth.refreshes == 1
    assert crm_calls(fake) == [("POST", 201), ("POST", 401), ("POST", 201)]
    assert [r["properties"]["dealname"] for r in fake.records("deals")] == ["before", "after"]
    assert made.properties["dealname"] == "after"
    port.get("deals", made.id)  # the refreshed token is kept: no second refresh
    assert fake.oauth.refreshes == 1


def test_a_token_about_to_expire_is_refreshed_before_the_call(db: Database, fake: FakeCrm) -> None:
    connection_id, _ = installed(db, fake)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connection_oauth_tokens"
            " SET access_expires_at = now() + interval '60 seconds'"  # inside the margin
        )
    connect.port_for(db, connection_id).create("deals", {"dealname": "x"})
    assert fake.oauth.refreshes == 1
    assert crm_calls(fake) == [("POST", 201)]  # no 401 was needed


def test_a_second_401_fails_clearly_instead_of_looping(db: Database, fake: FakeCrm) -> None:
    connection_id, _ = installed(db, fake)
    fake.oauth.access_seconds = 0  # every token it issues from now on is dead on arrival
    httpx.post(f"{fake.url}/_admin/oauth/expire")
    with pytest.raises(PortError) as failed:
        connect.port_for(db, connection_id).create("deals", {"dealname": "x"})
    assert failed.value.code == "unauthorized"
    assert not failed.value.transient
    assert failed.value.status == 401
    assert crm_calls(fake) == [("POST", 401), ("POST", 401)]
    assert fake.records("deals") == []


@pytest.mark.parametrize("error_style", ["status", "category"])
def test_a_revoked_grant_fails_with_needs_reauthorization(
    db: Database, fake: FakeCrm, error_style: str
) -> None:
    """Both ways the token endpoint may say the refresh token is revoked: v1's `status`, or the
    standard error body's `subCategory` (which the 2026-03 endpoint sends is not documented)."""
    fake.config.oauth_error_style = error_style
    connection_id, grant = installed(db, fake)
    port = connect.port_for(db, connection_id)
    httpx.post(f"{fake.url}/_admin/oauth/revoke", json={"refresh_token": grant.refresh_token})
    with pytest.raises(PortError) as failed:
        port.create("deals", {"dealname": "x"})
    assert failed.value.code == "unauthorized"
    assert "install the app again" in str(failed.value)
    with db.transaction() as tx:
        status = tx.scalar(
            "SELECT status FROM connections WHERE id = CAST(:c AS uuid)", c=connection_id
        )
    assert status == "needs_reauthorization"
    with pytest.raises(PortError, match="needs reauthorization"):
        connect.port_for(db, connection_id)


def test_a_private_app_token_keeps_working_beside_oauth(db: Database, fake: FakeCrm) -> None:
    installed(db, fake)
    with db.transaction() as tx:
        private = connections.create_connection(
            tx,
            tenant_id="acme",
            provider="hubspot",
            webhook_secret_env="APP_SECRET",
            api_credentials_env="PRIVATE_APP_TOKEN",
            api_base_url=fake.url,
        )
    made = connect.port_for(db, private).create("deals", {"dealname": "private"})
    [record] = [r for r in fake.records("deals") if r["id"] == made.id]
    assert record["portalId"] == fake.config.portal_id
    assert fake.oauth.refreshes == 0


def test_the_install_asks_introspection_which_portal_a_token_is_for(fake: FakeCrm) -> None:
    """`POST /oauth/2026-03/token/introspect` with the app's client (the v1 `GET
    /oauth/v1/access-tokens/{token}` is a numbered path a new app cannot call); a token that is
    no longer active is refused, not read as some portal."""
    grant = fake.issue_grant(PORTAL, REDIRECT)
    client = {"client_id": "fake-client-id", "client_secret": "fake-client-secret"}
    account = hubspot_oauth.token_account(grant.access_token, base_url=fake.url, **client)
    assert (account.account_id, account.app_id) == (str(PORTAL), APP_ID)
    paths = [r["path"] for r in fake.state()["requests"]]
    assert paths[-1] == versions.oauth_introspect() == "/oauth/2026-03/token/introspect"
    assert versions.oauth_token() in paths
    with pytest.raises(PortError) as err:
        hubspot_oauth.token_account(
            grant.access_token, base_url=fake.url, client_id="fake-client-id", client_secret="x"
        )
    assert err.value.code == "unauthorized"
    httpx.post(f"{fake.url}/_admin/oauth/expire", json={})
    with pytest.raises(PortError) as err:
        hubspot_oauth.token_account(grant.access_token, base_url=fake.url, **client)
    assert err.value.code == "unauthorized" and "not active" in str(err.value)
