"""Installing a HubSpot public app through OAuth, over real HTTP: the ops API's start route
(a 303 to the fake's authorize URL), the fake's consent redirect, and the public callback on
the real `webhook` function process (ops is IAM-gated in the cloud, so HubSpot's browser
redirect can't reach it there; it answers 404 for the callback now) exchanging the code at the
fake's token endpoint. Bad input — a bad, unknown, expired or reused state, a replayed code,
HubSpot's `error`, a failed exchange — gets a 4xx page and creates nothing; an install started
without the redirect URL configured is refused before any state is stored."""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from collections.abc import Iterator
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from devstack.function_process import serve
from shared.accounts import oauth_tokens, provider_apps
from shared.core.db import Database
from shared.ops import cli
from shared.providers.hubspot.oauth import hubspot_refresher
from shared.providers.install import CALLBACK_PATH, REDIRECT_URL_ENV, state_hash
from tests.ops_support import (
    bearer,
    mint,
    seed_tenant,
)

pytestmark = pytest.mark.e2e

APP_ID = "424242"
PRIVATE_APP = "4343"
CLIENT_ID_ENV = "HUBSPOT_APP_424242_CLIENT_ID"
CLIENT_SECRET_ENV = "HUBSPOT_APP_424242_CLIENT_SECRET"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv(oauth_tokens.TOKEN_KEK_ENV, base64.b64encode(b"k" * 32).decode())
    monkeypatch.setenv(CLIENT_ID_ENV, "fake-client-id")
    monkeypatch.setenv(CLIENT_SECRET_ENV, "fake-client-secret")
    crm = FakeCrm(FakeCrmConfig(app_id=APP_ID)).start()
    try:
        yield crm
    finally:
        crm.stop()


@pytest.fixture
def callback(
    db: Database, database_url: str, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The `webhook` function as a real process (with the app's client and the token key from
    `fake`'s environment); yields the callback URL, which ops sends as the redirect URI."""
    with serve("webhook", {"DATABASE_URL": database_url, "NO_GCE_CHECK": "true"}) as base:
        url = base + CALLBACK_PATH
        monkeypatch.setenv(REDIRECT_URL_ENV, url)
        yield url


@pytest.fixture
def setup(db: Database, fake: FakeCrm) -> str:
    """Tenants acme and globex, the public app (OAuth client on the fake) and a private app;
    an acme ops token."""
    seed_tenant(db, "acme")
    seed_tenant(db, "globex")
    with db.transaction() as tx:
        provider_apps.register_app(
            tx,
            provider="hubspot",
            app_id=APP_ID,
            client_secret_env=CLIENT_SECRET_ENV,  # HubSpot: signatures and OAuth, one secret
            api_base_url=fake.url,
            oauth_client_id_env=CLIENT_ID_ENV,
            oauth_scopes=("crm.objects.contacts.read", "crm.objects.contacts.write"),
            oauth_authorize_url=f"{fake.url}/oauth/authorize",
        )
        provider_apps.register_app(
            tx,
            provider="hubspot",
            app_id=PRIVATE_APP,
            kind="private",
            client_secret_env=CLIENT_SECRET_ENV,
        )
    return mint(db, "acme")


def start(ops: str, token: str, app_id: str = APP_ID, **body: str) -> httpx.Response:
    return httpx.post(
        f"{ops}/v1/apps/hubspot/{app_id}/installs", json=body, headers=bearer(token), timeout=10
    )


def consent(location: str, portal: int, **extra: str) -> str:
    """The user picks `portal` on the fake's consent screen: where HubSpot sends the browser."""
    r = httpx.get(location + "&" + urlencode({"portal_id": str(portal), **extra}), timeout=10)
    assert r.status_code == 302, r.text
    return r.headers["Location"]


# Hex only: the code is typed as a command-line argument, where a leading "-" reads as an option.
CONFIRM_CODE = re.compile(r'<code class="confirm">([0-9a-f]{32})</code>')


def confirm(ops: str, token: str, code: str, app_id: str = APP_ID) -> httpx.Response:
    return httpx.post(
        f"{ops}/v1/apps/hubspot/{app_id}/installs/confirm",
        json={"confirm_code": code},
        headers=bearer(token),
        timeout=10,
    )


def install(ops: str, token: str, portal: int) -> tuple[httpx.Response, str]:
    """Start, consent for `portal`, follow the redirect and, when the callback page asks for
    it, confirm with the page's code and the same token: (the confirmation's answer, or the
    callback page when it asked for none; the callback URL)."""
    started = start(ops, token)
    assert started.status_code == 303, started.text
    back = consent(started.headers["Location"], portal)
    page = httpx.get(back, timeout=10)
    code = CONFIRM_CODE.search(page.text)
    if page.status_code != 200 or code is None:
        return page, back
    return confirm(ops, token, code.group(1)), back


def connections_of(db: Database) -> list[dict[str, object]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT id::text AS id, tenant_id, status, provider_app_id, provider_account_id,"
            " api_credentials_env, webhook_secret_env FROM connections ORDER BY created_at"
        )


def callback_audits(db: Database) -> list[dict[str, object]]:
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT token_id::text AS token_id, tenant_id, detail::text AS detail FROM ops_audit"
            " WHERE action = 'apps.hubspot.callback' ORDER BY id"
        )
    return [{**r, "detail": json.loads(str(r["detail"]))} for r in rows]


def test_an_install_redirects_to_the_authorize_url_and_the_callback_creates_the_connection(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    started = start(ops_server, setup)
    assert started.status_code == 303
    location = urlsplit(started.headers["Location"])
    query = {k: v[0] for k, v in parse_qs(location.query).items()}
    assert f"{location.scheme}://{location.netloc}{location.path}" == f"{fake.url}/oauth/authorize"
    assert query["client_id"] == "fake-client-id"
    assert query["redirect_uri"] == callback  # the webhook function's, not ops'
    assert urlsplit(callback).path == "/oauth/hubspot/callback"
    assert query["scope"] == "crm.objects.contacts.read crm.objects.contacts.write"
    state = query["state"]
    assert len(state) >= 40
    assert started.json()["authorize_url"] == started.headers["Location"]
    with db.transaction() as tx:
        stored = tx.all("SELECT state_sha256, tenant_id, app_id FROM oauth_install_states")
        dump = json.dumps(tx.all("SELECT * FROM oauth_install_states"), default=str)
    assert [(bytes(r["state_sha256"]), r["tenant_id"], r["app_id"]) for r in stored] == [
        (state_hash(state), "acme", APP_ID)
    ]
    assert state not in dump  # only its hash is kept

    back = consent(started.headers["Location"], 2002)
    code = parse_qs(urlsplit(back).query)["code"][0]
    page = httpx.get(back, timeout=10)
    assert page.status_code == 200, page.text
    assert "portal 2002 asks to be connected to onceflow tenant acme" in page.text
    assert page.headers["Cache-Control"] == "no-store"
    confirm_code = CONFIRM_CODE.search(page.text)
    assert confirm_code is not None
    assert confirm(ops_server, setup, confirm_code.group(1)).status_code == 200
    [conn] = connections_of(db)
    assert conn["tenant_id"] == "acme"
    assert conn["status"] == "active"
    assert (conn["provider_app_id"], conn["provider_account_id"]) == (APP_ID, "2002")
    assert conn["api_credentials_env"] is None  # its token is the OAuth grant
    assert conn["webhook_secret_env"] == CLIENT_SECRET_ENV  # the app's one URL verifies it
    token = oauth_tokens.access_token(
        db,
        str(conn["id"]),
        hubspot_refresher(
            client_id="fake-client-id", client_secret="fake-client-secret", base_url=fake.url
        ),
    )
    assert fake.oauth.portal_of(token) == ("live", 2002)
    [audit] = callback_audits(db)
    assert audit["tenant_id"] == "acme"
    assert audit["token_id"] is not None  # who started the install
    assert audit["detail"]["outcome"] == "pending_confirmation"
    assert audit["detail"]["portal_id"] == "2002"
    with db.transaction() as tx:
        everything = json.dumps(tx.all("SELECT * FROM ops_audit"), default=str)
    assert code not in everything and state not in everything and token not in everything
    assert confirm_code.group(1) not in everything


def test_a_second_portal_gets_its_own_connection_and_a_reinstall_reauthorizes(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    assert install(ops_server, setup, 2002)[0].status_code == 200
    assert install(ops_server, setup, 3003)[0].status_code == 200
    first, second = connections_of(db)
    assert {first["provider_account_id"], second["provider_account_id"]} == {"2002", "3003"}
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET status = 'needs_reauthorization' WHERE id = CAST(:c AS uuid)",
            c=first["id"],
        )
        sealed_before = tx.scalar(
            "SELECT access_token_sealed FROM connection_oauth_tokens"
            " WHERE connection_id = CAST(:c AS uuid)",
            c=first["id"],
        )
    page, _ = install(ops_server, setup, int(str(first["provider_account_id"])))
    assert page.status_code == 200
    assert page.json()["outcome"] == "reauthorized"
    again = connections_of(db)
    assert [c["id"] for c in again] == [first["id"], second["id"]]  # nothing new
    assert again[0]["status"] == "active"
    with db.transaction() as tx:
        sealed_after = tx.scalar(
            "SELECT access_token_sealed FROM connection_oauth_tokens"
            " WHERE connection_id = CAST(:c AS uuid)",
            c=first["id"],
        )
    assert bytes(sealed_after) != bytes(sealed_before)
    assert [a["detail"]["outcome"] for a in callback_audits(db)] == ["pending_confirmation"] * 3


def test_a_reused_state_is_refused_and_creates_nothing_more(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    page, back = install(ops_server, setup, 2002)
    assert page.status_code == 200
    again = httpx.get(back, timeout=10)
    assert again.status_code == 400
    assert "text/html" in again.headers["Content-Type"]
    assert "already used" in again.text
    assert len(connections_of(db)) == 1
    assert callback_audits(db)[-1]["detail"] == {
        "outcome": "refused",
        "code": "state_used",
        "status": 400,
    }


def test_a_replayed_code_is_refused_by_the_token_endpoint_and_creates_nothing(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    one = start(ops_server, setup).headers["Location"]
    two = start(ops_server, setup).headers["Location"]
    back = consent(one, 2002)
    code = parse_qs(urlsplit(back).query)["code"][0]
    page = httpx.get(back, timeout=10)
    assert page.status_code == 200
    confirm_code = CONFIRM_CODE.search(page.text)
    assert confirm_code is not None
    assert confirm(ops_server, setup, confirm_code.group(1)).status_code == 200
    state_two = parse_qs(urlsplit(two).query)["state"][0]
    replay = httpx.get(callback, params={"code": code, "state": state_two}, timeout=10)
    assert replay.status_code == 400
    assert "refused the authorization code (BAD_AUTH_CODE)" in replay.text
    assert code not in replay.text
    assert len(connections_of(db)) == 1
    assert callback_audits(db)[-1]["detail"]["code"] == "code_refused"


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (None, "no or bad state"),
        ("not a state!", "no or bad state"),
        ("A" * 43, "unknown state"),
        ("expired", "has expired"),
    ],
)
def test_a_bad_unknown_or_expired_state_is_refused(
    db: Database,
    fake: FakeCrm,
    setup: str,
    ops_server: str,
    callback: str,
    *,
    state: str | None,
    why: str,
) -> None:
    if state == "expired":
        state = parse_qs(urlsplit(start(ops_server, setup).headers["Location"]).query)["state"][0]
        with db.transaction() as tx:
            tx.execute("UPDATE oauth_install_states SET expires_at = now() - interval '1 second'")
    code = fake.oauth.authorize(2002, callback)
    params = {"code": code, **({"state": state} if state is not None else {})}
    page = httpx.get(callback, params=params, timeout=10)
    assert page.status_code == 400
    assert why in page.text
    assert connections_of(db) == []
    assert code in fake.oauth.codes  # the code was never even tried


def test_hubspots_error_parameter_is_refused_and_spends_the_state(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    location = start(ops_server, setup).headers["Location"]
    back = consent(location, 2002, deny="1")
    assert "error=access_denied" in back
    page = httpx.get(back, timeout=10)
    assert page.status_code == 400
    assert "HubSpot did not authorize: access_denied" in page.text
    assert connections_of(db) == []
    assert httpx.get(back, timeout=10).status_code == 400  # the state is spent either way


def test_a_failed_exchange_is_refused_and_creates_nothing(
    db: Database,
    fake: FakeCrm,
    setup: str,
    ops_server: str,
    callback: str,
) -> None:
    location = start(ops_server, setup).headers["Location"]
    # HubSpot's side of the client no longer matches the secret the webhook function holds.
    fake.oauth.client_secret = "rotated-at-hubspot"
    page = httpx.get(consent(location, 2002), timeout=10)
    assert page.status_code == 400
    assert "BAD_CLIENT_ID" in page.text
    assert connections_of(db) == []
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM connection_oauth_tokens") == 0


def test_an_install_link_opened_by_another_portals_admin_connects_nothing(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    """Issue 23 item 11, OAuth CSRF: an operator of tenant acme starts an install and sends the
    authorize link to globex's HubSpot admin, who consents for globex's portal 7007. The
    callback must not connect 7007 to acme: the state proves the install was started, not that
    the browser coming back belongs to who started it. The page names tenant and portal and
    shows a confirmation code that only that browser sees; only the token that started the
    install, with that code, connects it. (It failed before: the callback connected portal
    7007 to tenant acme.)"""
    location = start(ops_server, setup).headers["Location"]
    page = httpx.get(consent(location, 7007), timeout=10)  # globex's admin, globex's portal
    assert page.status_code == 200, page.text
    assert "portal 7007" in page.text and "tenant acme" in page.text
    assert "Nothing is connected yet" in page.text
    assert connections_of(db) == []
    [pending] = callback_audits(db)
    assert pending["tenant_id"] == "acme"
    assert pending["detail"]["outcome"] == "pending_confirmation"
    assert pending["detail"]["portal_id"] == "7007"
    code = CONFIRM_CODE.search(page.text)
    assert code is not None, page.text

    # The acme operator who sent the link never saw the page: without its code nothing moves.
    guessed = confirm(ops_server, setup, "A" * 22)
    assert guessed.status_code == 404, guessed.text
    # globex's own operators can't adopt acme's install with the code either.
    assert confirm(ops_server, mint(db, "globex"), code.group(1)).status_code == 404
    # Nor can another acme token than the one that started it.
    assert (
        confirm(ops_server, mint(db, "acme", label="colleague"), code.group(1)).status_code == 404
    )
    assert connections_of(db) == []
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM connection_oauth_tokens") == 0


def test_the_operator_who_started_an_install_confirms_it_with_the_pages_code_once(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    location = start(ops_server, setup).headers["Location"]
    page = httpx.get(consent(location, 2002), timeout=10)
    code = CONFIRM_CODE.search(page.text)
    assert code is not None, page.text
    assert f"onceflow confirm-install {APP_ID} CODE" in page.text
    out, err = io.StringIO(), io.StringIO()  # the CLI the page names, against the real ops
    argv = ["confirm-install", APP_ID, code.group(1), "--url", ops_server, "--token", setup]
    assert cli.main([*argv, "--json"], out=out, err=err) == 0, err.getvalue()
    body = json.loads(out.getvalue())
    assert (body["tenant_id"], body["portal_id"], body["outcome"]) == ("acme", "2002", "created")
    [conn] = connections_of(db)
    assert (conn["tenant_id"], conn["provider_account_id"]) == ("acme", "2002")
    assert body["connection_id"] == conn["id"]
    again = confirm(ops_server, setup, code.group(1))
    assert again.status_code == 404  # used once
    assert len(connections_of(db)) == 1
    with db.transaction() as tx:
        audits = json.dumps(tx.all("SELECT * FROM ops_audit"), default=str)
        # The pending grant is gone once it is the connection's.
        assert (
            tx.scalar("SELECT count(*) FROM oauth_install_states WHERE grant_sealed IS NOT NULL")
            == 0
        )
    assert code.group(1) not in audits


def test_two_confirmations_with_one_code_at_once_connect_the_portal_once(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    """A double submit: two confirmations of one install meet at a barrier; exactly one
    connects the portal, the other finds nothing waiting."""
    from shared.ops.auth import hash_token
    from shared.providers.install import InstallRefused
    from shared.providers.install import confirm as confirm_install

    location = start(ops_server, setup).headers["Location"]
    page = httpx.get(consent(location, 2002), timeout=10)
    code = CONFIRM_CODE.search(page.text)
    assert code is not None, page.text
    with db.transaction() as tx:
        token_id = str(
            tx.scalar("SELECT id FROM ops_tokens WHERE token_sha256 = :h", h=hash_token(setup))
        )
    barrier = threading.Barrier(2)
    results: list[str] = []

    def one() -> None:
        barrier.wait()
        try:
            done = confirm_install(db, app_id=APP_ID, confirm_code=code.group(1), token_id=token_id)
            results.append(done.outcome)
        except InstallRefused as refused:
            results.append(refused.code)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == ["created", "not_found"]
    assert len(connections_of(db)) == 1


def test_an_install_not_confirmed_in_time_connects_nothing(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    location = start(ops_server, setup).headers["Location"]
    page = httpx.get(consent(location, 2002), timeout=10)
    code = CONFIRM_CODE.search(page.text)
    assert code is not None, page.text
    with db.transaction() as tx:
        tx.execute("UPDATE oauth_install_states SET confirm_by = now() - interval '1 second'")
    assert confirm(ops_server, setup, code.group(1)).status_code == 404
    assert connections_of(db) == []
    # The sweep drops the lapsed grant (the row stays until the day-old trim).
    from shared.providers.install import trim_install_states

    assert trim_install_states(db) == {"grants_dropped": 1, "deleted": 0, "pending_deleted": 0}
    with db.transaction() as tx:
        assert (
            tx.scalar("SELECT count(*) FROM oauth_install_states WHERE grant_sealed IS NOT NULL")
            == 0
        )


def test_a_portal_connected_to_another_tenant_is_not_taken_over(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    assert install(ops_server, setup, 2002)[0].status_code == 200
    page, _ = install(ops_server, mint(db, "globex"), 2002)
    assert page.status_code == 409
    assert "already connected to another tenant" in page.text
    assert [c["tenant_id"] for c in connections_of(db)] == ["acme"]


def test_starting_an_install_needs_an_ops_token_the_tenant_and_an_oauth_app(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    url = f"{ops_server}/v1/apps/hubspot/{APP_ID}/installs"
    assert httpx.post(url, json={}, timeout=10).status_code == 401
    assert start(ops_server, setup, tenant_id="globex").status_code == 404
    assert start(ops_server, mint(db, None)).status_code == 422  # admin: which tenant?
    assert start(ops_server, mint(db, None), tenant_id="globex").status_code == 303
    assert start(ops_server, setup, app_id="999").status_code == 404
    refused = start(ops_server, setup, app_id=PRIVATE_APP)
    assert refused.status_code == 409
    assert refused.json()["code"] == "not_installable"
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM oauth_install_states") == 1


def test_the_ops_function_no_longer_serves_the_callback(
    db: Database, fake: FakeCrm, setup: str, ops_server: str, callback: str
) -> None:
    """One home: HubSpot's redirect to ops' own host finds nothing (in the cloud it could not
    even get past ops' IAM), and the state is left for the real callback to consume."""
    location = start(ops_server, setup).headers["Location"]
    back = urlsplit(consent(location, 2002))
    on_ops = httpx.get(f"{ops_server}{back.path}?{back.query}", timeout=10)
    assert on_ops.status_code == 404
    assert connections_of(db) == []
    page = httpx.get(f"{callback}?{back.query}", timeout=10)
    assert page.status_code == 200, page.text  # the state was not spent by ops


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, f"{REDIRECT_URL_ENV} (the webhook function's URL + {CALLBACK_PATH}) is not set"),
        ("https://ops.example.com/", f"must end with {CALLBACK_PATH}"),
        ("/oauth/hubspot/callback", "not an absolute http(s) URL"),
    ],
)
def test_an_install_without_the_redirect_url_configured_is_refused_before_any_state(
    db: Database,
    fake: FakeCrm,
    setup: str,
    ops_server: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    value: str | None,
    why: str,
) -> None:
    if value is None:
        monkeypatch.delenv(REDIRECT_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(REDIRECT_URL_ENV, value)
    refused = start(ops_server, setup)
    assert refused.status_code == 409
    assert refused.json()["code"] == "not_configured"
    assert why in refused.json()["message"]
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM oauth_install_states") == 0


def test_the_sweep_forgets_install_states_a_day_after_they_expire(db: Database, setup: str) -> None:
    from shared.providers.install import trim_install_states
    from shared.sweep.catalog import default_duties

    with db.transaction() as tx:
        # Expired 30 hours ago, 2 hours ago, and still live for a minute.
        for n, expired_secs_ago in enumerate((30 * 3600, 2 * 3600, -60)):
            tx.execute(
                "INSERT INTO oauth_install_states (state_sha256, tenant_id, provider, app_id,"
                " redirect_uri, expires_at) VALUES (:h, 'acme', 'hubspot', :app,"
                " 'http://127.0.0.1/oauth/hubspot/callback',"
                " now() - make_interval(secs => :ago))",
                h=bytes([n]) * 32,
                app=APP_ID,
                ago=expired_secs_ago,
            )
    assert trim_install_states(db) == {"grants_dropped": 0, "deleted": 1, "pending_deleted": 0}
    with db.transaction() as tx:
        left = tx.all("SELECT state_sha256 FROM oauth_install_states ORDER BY state_sha256")
    # The recent one still answers a late callback with "expired", not "unknown".
    assert [bytes(r["state_sha256"]) for r in left] == [bytes([1]) * 32, bytes([2]) * 32]
    assert "trim_oauth_install_states" in {d.name for d in default_duties()}
