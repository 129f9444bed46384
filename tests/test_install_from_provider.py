"""Installs that start at HubSpot (issue 26, item 5): the app's install URL or a Marketplace
listing sends the browser back to the app's own callback (`/oauth/hubspot/callback/<app id>`)
with a code and no onceflow state. The real `webhook` process exchanges the code at the fake
and keeps a pending install bound to no tenant, showing a claim code once; an operator of a
tenant claims it over the ops API with that code and the portal. Claimed by the right tenant,
refused for another (4xx with a reason, nothing attached), one winner of two claims at once,
nothing for a lapsed claim.

The public URL HubSpot redirects to (`ONCEFLOW_OAUTH_REDIRECT_URL` + `/<app id>`) is a front's
name, as deployed; the test follows the redirect to the webhook process behind it."""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from devstack.function_process import serve
from shared.accounts import oauth_tokens, provider_apps
from shared.core.db import Database
from shared.ops.auth import hash_token
from shared.providers.install import InstallRefused, claim, trim_install_states
from tests.ops_support import bearer, mint, seed_tenant

pytestmark = pytest.mark.e2e

APP_ID = "434343"
CLIENT_ID_ENV = "HUBSPOT_APP_434343_CLIENT_ID"
CLIENT_SECRET_ENV = "HUBSPOT_APP_434343_CLIENT_SECRET"
PUBLIC_CALLBACK = "https://hooks.example.test/webhook/oauth/hubspot/callback"
APP_CALLBACK = f"{PUBLIC_CALLBACK}/{APP_ID}"
CLAIM_CODE = re.compile(r'<code class="claim">([0-9a-f]{32})</code>')


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv(oauth_tokens.TOKEN_KEK_ENV, base64.b64encode(b"k" * 32).decode())
    monkeypatch.setenv(CLIENT_ID_ENV, "fake-client-id")
    monkeypatch.setenv(CLIENT_SECRET_ENV, "fake-client-secret")
    monkeypatch.setenv("ONCEFLOW_OAUTH_REDIRECT_URL", PUBLIC_CALLBACK)
    crm = FakeCrm(FakeCrmConfig(app_id=APP_ID)).start()
    try:
        yield crm
    finally:
        crm.stop()


@pytest.fixture
def webhook(db: Database, database_url: str, fake: FakeCrm) -> Iterator[str]:
    """The webhook function as a real process (the app's client, the token key and the public
    redirect URL from `fake`'s environment); tenants acme and globex and the app registered."""
    seed_tenant(db, "acme")
    seed_tenant(db, "globex")
    with db.transaction() as tx:
        provider_apps.register_app(
            tx,
            provider="hubspot",
            app_id=APP_ID,
            client_secret_env=CLIENT_SECRET_ENV,
            api_base_url=fake.url,
            oauth_client_id_env=CLIENT_ID_ENV,
            oauth_scopes=("crm.objects.contacts.read",),
            oauth_authorize_url=f"{fake.url}/oauth/authorize",
            platform="project",
        )
    with serve("webhook", {"DATABASE_URL": database_url, "NO_GCE_CHECK": "true"}) as base:
        yield base


def install_at_hubspot(fake: FakeCrm, webhook: str, portal: int, **extra: str) -> httpx.Response:
    """A HubSpot admin installs the app from its install URL (no state) for `portal`; the
    browser follows HubSpot's redirect to the app's own callback (through the public front,
    here straight to the webhook process). The callback's page."""
    query = {
        "client_id": "fake-client-id",
        "redirect_uri": APP_CALLBACK,
        "scope": "crm.objects.contacts.read",
        "portal_id": str(portal),
        **extra,
    }
    r = httpx.get(f"{fake.url}/oauth/authorize?{urlencode(query)}", timeout=10)
    assert r.status_code == 302, r.text
    back = urlsplit(r.headers["Location"])
    assert back.path.endswith(f"/oauth/hubspot/callback/{APP_ID}") and "state" not in back.query
    return httpx.get(f"{webhook}/oauth/hubspot/callback/{APP_ID}?{back.query}", timeout=10)


def claim_over_ops(ops: str, token: str, portal: object, code: str, **body: str) -> httpx.Response:
    return httpx.post(
        f"{ops}/v1/apps/hubspot/{APP_ID}/installs/claim",
        json={"portal_id": str(portal), "claim_code": code, **body},
        headers=bearer(token),
        timeout=10,
    )


def connections_of(db: Database) -> list[dict[str, object]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT c.id::text AS id, c.tenant_id, c.provider_account_id,"
            " t.connection_id IS NOT NULL AS has_grant FROM connections c"
            " LEFT JOIN connection_oauth_tokens t ON t.connection_id = c.id ORDER BY c.created_at"
        )


def pending(db: Database) -> list[dict[str, object]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT portal_id, tenant_id, claimed_at IS NOT NULL AS claimed,"
            " grant_sealed IS NOT NULL AS holds_grant, connection_id::text AS connection_id"
            " FROM pending_app_installs ORDER BY id"
        )


def page_code(page: httpx.Response) -> str:
    assert page.status_code == 200, page.text
    found = CLAIM_CODE.search(page.text)
    assert found is not None, page.text
    return found.group(1)


def test_an_install_at_hubspot_waits_bound_to_nothing_until_its_tenant_claims_it(
    db: Database, fake: FakeCrm, webhook: str, ops_server: str
) -> None:
    page = install_at_hubspot(fake, webhook, 3003)
    code = page_code(page)
    assert "portal 3003 installed the app" in page.text and "Nothing is" in page.text
    assert f"onceflow claim-install {APP_ID} 3003 CODE" in page.text
    assert page.headers["Cache-Control"] == "no-store"
    assert connections_of(db) == []
    assert pending(db) == [
        {
            "portal_id": "3003",
            "tenant_id": None,
            "claimed": False,
            "holds_grant": True,
            "connection_id": None,
        }
    ]
    acme, globex = mint(db, "acme"), mint(db, "globex")

    # Another tenant without the code: a guess, another portal, a tenant it is not.
    for token, portal, guess, body in (
        (globex, 3003, "0" * 32, {}),
        (globex, 3004, code, {}),  # the code names portal 3003, not 3004
        (globex, 3003, code, {"tenant_id": "acme"}),  # a tenant token names only its own
    ):
        r = claim_over_ops(ops_server, token, portal, guess, **body)
        assert r.status_code == 404, r.text
        assert r.json()["message"] in (
            "no such install waiting to be claimed",
            "no such tenant",
        )
    assert connections_of(db) == [] and pending(db)[0]["claimed"] is False

    r = claim_over_ops(ops_server, acme, 3003, code)
    assert r.status_code == 200, r.text
    done = r.json()
    assert (done["tenant_id"], done["portal_id"], done["outcome"]) == ("acme", "3003", "created")
    assert connections_of(db) == [
        {
            "id": done["connection_id"],
            "tenant_id": "acme",
            "provider_account_id": "3003",
            "has_grant": True,
        }
    ]
    (row,) = pending(db)
    assert row["claimed"] and row["tenant_id"] == "acme" and not row["holds_grant"]
    assert row["connection_id"] == done["connection_id"]
    # Spent: the same code again, by anyone, finds nothing.
    for token in (acme, globex):
        assert claim_over_ops(ops_server, token, 3003, code).status_code == 404


def test_a_portal_of_one_tenant_is_refused_to_another_and_stays_claimable_by_its_own(
    db: Database, fake: FakeCrm, webhook: str, ops_server: str
) -> None:
    """The cross-tenant case with the code in the wrong hands: portal 3003 is acme's; a second
    install of it at HubSpot is claimed by globex (the admin gave globex the code): refused with
    the reason, nothing attached or spent, and acme's claim re-authorizes its connection."""
    acme, globex = mint(db, "acme"), mint(db, "globex")
    first = claim_over_ops(
        ops_server, acme, 3003, page_code(install_at_hubspot(fake, webhook, 3003))
    )
    assert first.status_code == 200, first.text
    code = page_code(install_at_hubspot(fake, webhook, 3003))

    r = claim_over_ops(ops_server, globex, 3003, code)
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "portal_taken"
    assert "already connected to another tenant" in r.json()["message"]
    assert [c["tenant_id"] for c in connections_of(db)] == ["acme"]
    assert pending(db)[1]["claimed"] is False and pending(db)[1]["holds_grant"] is True

    again = claim_over_ops(ops_server, acme, 3003, code)
    assert again.status_code == 200, again.text
    assert again.json()["outcome"] == "reauthorized"
    assert again.json()["connection_id"] == first.json()["connection_id"]
    assert len(connections_of(db)) == 1


def test_two_claims_at_once_attach_the_portal_once(
    db: Database, fake: FakeCrm, webhook: str
) -> None:
    """Two tenants' operators claim one pending install at the same moment (both hold the code):
    they meet at a barrier; exactly one gets the portal, the other finds nothing to claim."""
    code = page_code(install_at_hubspot(fake, webhook, 3005))
    tokens = {}
    for tenant in ("acme", "globex"):
        secret = mint(db, tenant)
        with db.transaction() as tx:
            tokens[tenant] = str(
                tx.scalar("SELECT id FROM ops_tokens WHERE token_sha256 = :h", h=hash_token(secret))
            )
    barrier = threading.Barrier(2)
    results: dict[str, str] = {}

    def one(tenant: str) -> None:
        barrier.wait()
        try:
            done = claim(
                db,
                app_id=APP_ID,
                portal_id="3005",
                claim_code=code,
                tenant_id=tenant,
                token_id=tokens[tenant],
            )
            results[tenant] = done.outcome
        except InstallRefused as refused:
            results[tenant] = refused.code

    threads = [threading.Thread(target=one, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results.values()) == ["created", "not_found"]
    (winner,) = [t for t, outcome in results.items() if outcome == "created"]
    assert [c["tenant_id"] for c in connections_of(db)] == [winner]
    assert pending(db)[0]["tenant_id"] == winner


def test_a_lapsed_pending_install_cannot_be_claimed_and_its_grant_is_dropped(
    db: Database, fake: FakeCrm, webhook: str, ops_server: str
) -> None:
    code = page_code(install_at_hubspot(fake, webhook, 3006))
    with db.transaction() as tx:
        tx.execute("UPDATE pending_app_installs SET claim_by = now() - interval '1 second'")
    r = claim_over_ops(ops_server, mint(db, "acme"), 3006, code)
    assert r.status_code == 404, r.text
    assert connections_of(db) == []
    assert trim_install_states(db) == {"grants_dropped": 1, "deleted": 0, "pending_deleted": 0}
    assert pending(db)[0]["holds_grant"] is False  # dropped by the sweep's pass
    with db.transaction() as tx:
        tx.execute("UPDATE pending_app_installs SET claim_by = now() - interval '2 days'")
    assert trim_install_states(db)["pending_deleted"] == 1
    assert pending(db) == []


def test_a_refusal_at_the_apps_callback_keeps_nothing(
    db: Database, fake: FakeCrm, webhook: str
) -> None:
    denied = install_at_hubspot(fake, webhook, 3007, deny="1")
    assert denied.status_code == 400 and "did not authorize" in denied.text
    no_code = httpx.get(f"{webhook}/oauth/hubspot/callback/{APP_ID}", timeout=10)
    assert no_code.status_code == 400 and "no authorization code" in no_code.text
    unknown_app = httpx.get(f"{webhook}/oauth/hubspot/callback/999?code=x", timeout=10)
    assert unknown_app.status_code == 404
    # A code replayed at the callback is refused by the token endpoint: one pending install.
    r = httpx.get(
        f"{fake.url}/oauth/authorize?"
        + urlencode(
            {"client_id": "fake-client-id", "redirect_uri": APP_CALLBACK, "portal_id": "3008"}
        ),
        timeout=10,
    )
    query = urlsplit(r.headers["Location"]).query
    assert (
        httpx.get(f"{webhook}/oauth/hubspot/callback/{APP_ID}?{query}", timeout=10).status_code
        == 200
    )
    replay = httpx.get(f"{webhook}/oauth/hubspot/callback/{APP_ID}?{query}", timeout=10)
    assert replay.status_code == 400 and CLAIM_CODE.search(replay.text) is None
    assert [p["portal_id"] for p in pending(db)] == ["3008"]
    assert connections_of(db) == []


def test_an_install_waiting_for_a_claim_is_a_line_on_the_operators_page_only(
    db: Database, fake: FakeCrm, webhook: str, client: Any
) -> None:
    page_code(install_at_hubspot(fake, webhook, 3009))
    admin = mint(db, None)
    (waiting,) = client.get("/v1/health", headers=bearer(admin)).get_json()["waiting_claims"]
    assert (waiting["app_id"], waiting["portal_id"]) == (APP_ID, "3009")
    assert client.post("/ui/login", data={"token": admin}).status_code == 303
    page = client.get("/ui").get_data(as_text=True)
    assert f"onceflow claim-install {APP_ID} 3009 CODE --tenant TENANT" in page
    # The portal is nobody's yet: a tenant's token sees nothing of it.
    acme = mint(db, "acme")
    assert client.get("/v1/health", headers=bearer(acme)).get_json()["waiting_claims"] == []
    client.post("/ui/login", data={"token": acme})
    assert "3009" not in client.get("/ui").get_data(as_text=True)
