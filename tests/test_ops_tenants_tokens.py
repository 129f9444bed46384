"""Tenants, connections and ops tokens through the real `ops` entry point (issue 24): an
operator gets from an empty database to a tenant, a connection and scoped tokens without SQL,
the first admin token from the one-time bootstrap secret, and every change is audited."""

from __future__ import annotations

import base64
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.core.db import Database
from shared.ops.auth import BOOTSTRAP_SECRET_ENV, mint_bootstrap_token
from tests.ops_support import (
    bearer,
    mint,
    seed_tenant,
)

SECRET = "a-bootstrap-secret-of-at-least-32-characters"


def _audit(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT token_id, tenant_id, action, target, detail FROM ops_audit ORDER BY id"
        )


def test_bootstrap_mints_the_first_admin_token_once(
    db: Database, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a secret configured, nothing is accepted.
    monkeypatch.delenv(BOOTSTRAP_SECRET_ENV, raising=False)
    assert client.post("/v1/bootstrap", headers=bearer(SECRET), json={}).status_code == 401
    monkeypatch.setenv(BOOTSTRAP_SECRET_ENV, SECRET)
    assert client.post("/v1/bootstrap", headers=bearer("wrong"), json={}).status_code == 401
    assert client.post("/v1/bootstrap", json={}).status_code == 401

    r = client.post("/v1/bootstrap", headers=bearer(SECRET), json={"label": "first admin"})
    assert r.status_code == 201, r.get_json()
    minted = r.get_json()
    assert minted["details"]["tenant_id"] is None and minted["details"]["label"] == "first admin"
    admin = minted["token"]
    assert client.get("/v1/tenants", headers=bearer(admin)).status_code == 200

    again = client.post("/v1/bootstrap", headers=bearer(SECRET), json={})
    assert again.status_code == 409 and again.get_json()["code"] == "already_bootstrapped"
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM ops_tokens") == 1
    actions = [(a["action"], a["detail"]["outcome"]) for a in _audit(db)]
    assert actions == [("ops.bootstrap", "done"), ("ops.bootstrap", "refused")]


def test_two_bootstraps_at_once_mint_one_token(db: Database) -> None:
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def bootstrap() -> None:
        barrier.wait()
        results.append(mint_bootstrap_token(db, "racer"))

    threads = [threading.Thread(target=bootstrap) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r is None for r in results) == [False, True]
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM ops_tokens") == 1  # the loser's rolled back


def test_an_operator_sets_up_a_tenant_without_sql(db: Database, client: Any) -> None:
    admin = bearer(mint(db, None, label="ops-admin"))
    r = client.post("/v1/tenants", headers=admin, json={"id": "acme", "credits": 250})
    assert r.status_code == 201, r.get_json()
    assert r.get_json()["credit_balance"] == 250
    dup = client.post("/v1/tenants", headers=admin, json={"id": "acme"})
    assert dup.status_code == 409 and dup.get_json()["code"] == "tenant_exists"
    bad = client.post("/v1/tenants", headers=admin, json={"id": "Not A Tenant"})
    assert bad.status_code == 422

    conn = client.post(
        "/v1/connections",
        headers=admin,
        json={
            "tenant_id": "acme",
            "provider": "hubspot",
            "webhook_secret_env": "HUBSPOT_APP_SECRET",
            "provider_account_id": "62515",
            "watched_fields": {"contact": ["lifecyclestage"]},
        },
    )
    assert conn.status_code == 201, conn.get_json()
    assert conn.get_json()["tenant_id"] == "acme"
    secret_value = client.post(
        "/v1/connections",
        headers=admin,
        json={"tenant_id": "acme", "provider": "hubspot", "webhook_secret_env": "s3cr3t-value"},
    )
    assert secret_value.status_code == 422  # an env var's name, never a secret

    made = client.post(
        "/v1/tokens",
        headers=admin,
        json={"tenant_id": "acme", "label": "ana", "roles": ["sales-manager"]},
    )
    assert made.status_code == 201, made.get_json()
    tenant_token = made.get_json()["token"]
    assert made.get_json()["details"]["roles"] == ["sales-manager"]
    listed = client.get("/v1/connections", headers=bearer(tenant_token)).get_json()["items"]
    assert [c["id"] for c in listed] == [conn.get_json()["id"]]
    tenants = client.get("/v1/tenants", headers=bearer(tenant_token)).get_json()["items"]
    assert [(t["id"], t["connections"]) for t in tenants] == [("acme", 1)]

    tokens = client.get("/v1/tokens", headers=admin).get_json()["items"]
    assert {t["label"] for t in tokens} == {"ops-admin", "ana"}
    assert all("token" not in t and "token_sha256" not in t for t in tokens)
    audited = [a["action"] for a in _audit(db) if a["detail"]["outcome"] == "done"]
    assert audited == ["tenants.create", "connections.create", "tokens.create"]
    assert tenant_token not in str(_audit(db))


def test_tenant_tokens_stay_in_their_tenant(db: Database, client: Any) -> None:
    seed_tenant(db, "acme")
    seed_tenant(db, "globex")
    acme = bearer(mint(db, "acme"))
    globex_token = mint(db, "globex", label="globex-ci")
    r = client.post("/v1/tenants", headers=acme, json={"id": "initech"})
    assert r.status_code == 403 and r.get_json()["code"] == "admin_required"
    r = client.post("/v1/tokens", headers=acme, json={"tenant_id": "acme", "label": "x"})
    assert r.status_code == 403  # else a tenant token could mint itself any role
    r = client.post(
        "/v1/connections",
        headers=acme,
        json={"tenant_id": "globex", "provider": "hubspot", "webhook_secret_env": "X"},
    )
    assert r.status_code == 404
    assert [t["id"] for t in client.get("/v1/tenants", headers=acme).get_json()["items"]] == [
        "acme"
    ]
    tokens = client.get("/v1/tokens", headers=acme).get_json()["items"]
    assert {t["tenant_id"] for t in tokens} == {"acme"}
    globex_id = next(
        t["id"]
        for t in client.get("/v1/tokens", headers=bearer(mint(db, None))).get_json()["items"]
        if t["label"] == "globex-ci"
    )
    assert client.post(f"/v1/tokens/{globex_id}/revoke", headers=acme).status_code == 404
    assert client.get("/v1/runs", headers=bearer(globex_token)).status_code == 200


def test_revoked_and_expired_tokens_are_refused(db: Database, client: Any) -> None:
    seed_tenant(db, "acme")
    admin = bearer(mint(db, None))
    soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    made = client.post(
        "/v1/tokens", headers=admin, json={"tenant_id": "acme", "label": "ci", "expires_at": soon}
    ).get_json()
    assert client.get("/v1/runs", headers=bearer(made["token"])).status_code == 200
    with db.transaction() as tx:  # its expiry passes (rather than sleeping)
        tx.execute(
            "UPDATE ops_tokens SET expires_at = now() - interval '1 second' WHERE id = :id",
            id=made["details"]["id"],
        )
    assert client.get("/v1/runs", headers=bearer(made["token"])).status_code == 401

    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    r = client.post(
        "/v1/tokens", headers=admin, json={"tenant_id": "acme", "label": "x", "expires_at": past}
    )
    assert r.status_code == 422

    other = client.post(
        "/v1/tokens", headers=admin, json={"tenant_id": "acme", "label": "support"}
    ).get_json()
    acme = bearer(other["token"])
    tid = other["details"]["id"]
    r = client.post(f"/v1/tokens/{tid}/revoke", headers=acme)  # a token revokes itself
    assert r.status_code == 200 and r.get_json()["revoked_at"]
    assert client.get("/v1/runs", headers=acme).status_code == 401
    again = client.post(f"/v1/tokens/{tid}/revoke", headers=admin)
    assert again.status_code == 409 and again.get_json()["code"] == "already_revoked"
    assert client.post(f"/v1/tokens/{tid[:-1]}x/revoke", headers=admin).status_code == 404


def test_a_connection_says_which_kind_of_credential_it_holds(
    db: Database, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 3: a HubSpot connection holds a private app's token (still accepted), a
    service key (their replacement for single-portal integrations) or an app install's OAuth
    grant; the kind is stored, listed and shown in health. A provider without service keys
    refuses one."""
    from shared.accounts import oauth_tokens
    from shared.accounts.oauth_tokens import Grant

    seed_tenant(db, "acme")
    admin = bearer(mint(db, None))
    monkeypatch.setenv("ACME_SERVICE_KEY", "svc-key")
    made = {}
    for kind, env in (("service_key", "ACME_SERVICE_KEY"), ("token", "ACME_TOKEN"), (None, "T")):
        body = {
            "tenant_id": "acme",
            "provider": "hubspot",
            "webhook_secret_env": "HUBSPOT_APP_SECRET",
            "api_credentials_env": env,
            **({"credential_kind": kind} if kind else {}),
        }
        r = client.post("/v1/connections", headers=admin, json=body)
        assert r.status_code == 201, r.get_json()
        made[env] = r.get_json()
    assert made["ACME_SERVICE_KEY"]["credential_kind"] == "service_key"
    assert made["ACME_TOKEN"]["credential_kind"] == made["T"]["credential_kind"] == "token"
    monkeypatch.setenv(oauth_tokens.TOKEN_KEK_ENV, base64.b64encode(b"k" * 32).decode())
    with db.transaction() as tx:  # what an install does once HubSpot granted it
        oauth_tokens.store_grant(tx, made["T"]["id"], Grant("a", "r", 1800))
    listed = client.get("/v1/connections", headers=admin).get_json()["items"]
    assert {c["api_credentials_env"]: c["credential_kind"] for c in listed} == {
        "ACME_SERVICE_KEY": "service_key",
        "ACME_TOKEN": "token",
        "T": "oauth",
    }
    health = client.get("/v1/health", headers=admin).get_json()["connections"]
    shown = {c["connection_id"]: (c["credentials"], c["credentials_configured"]) for c in health}
    assert shown[made["ACME_SERVICE_KEY"]["id"]] == ("service_key", True)
    assert shown[made["ACME_TOKEN"]["id"]] == ("token", False)
    assert shown[made["T"]["id"]] == ("oauth", True)
    refused = client.post(
        "/v1/connections",
        headers=admin,
        json={
            "tenant_id": "acme",
            "provider": "pipedrive",
            "webhook_secret_env": "PIPEDRIVE_SECRET",
            "credential_kind": "service_key",
        },
    )
    assert refused.status_code == 422
    assert refused.get_json()["code"] == "credential_kind_unsupported"
    bogus = client.post(
        "/v1/connections",
        headers=admin,
        json={**body, "credential_kind": "oauth"},  # only an install makes an OAuth connection
    )
    assert bogus.status_code == 422
