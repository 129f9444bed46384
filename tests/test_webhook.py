"""The `webhook` entry point through functions-framework's test client, on real Postgres."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from shared.accounts.connections import get_connection, get_connection_for_tenant
from shared.core.db import Database
from tests.ingest_support import (
    HUBSPOT_SECRET,
    PIPEDRIVE_CREDENTIALS,
    STANDARD_SECRET,
    basic_auth,
    hubspot_body,
    hubspot_event,
    hubspot_v1_headers,
    hubspot_v3_headers,
    inbox_rows,
    make_connection,
    standard_headers,
    webhook_client,
)

BASE = "https://hooks.example.com"


@pytest.fixture(scope="module")
def client() -> Any:
    return webhook_client()


@pytest.fixture(autouse=True)
def webhook_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")
    monkeypatch.delenv("PUBLIC_BASE_URL", raising=False)
    monkeypatch.setenv("HUBSPOT_SECRET_ACME", HUBSPOT_SECRET)
    monkeypatch.setenv("HUBSPOT_SECRET_GLOBEX", "globex-secret")
    monkeypatch.setenv("STANDARD_SECRET_ACME", STANDARD_SECRET)
    monkeypatch.setenv("PIPEDRIVE_CREDENTIALS_ACME", PIPEDRIVE_CREDENTIALS)


@pytest.fixture
def hubspot_connection(db: Database) -> str:
    return make_connection(db)


def post_hubspot(
    client: Any, connection_id: str, body: bytes, *, headers: dict[str, str] | None = None
) -> Any:
    path = f"/hubspot/{connection_id}"
    signed = headers if headers is not None else hubspot_v3_headers(body, BASE + path)
    return client.post(path, data=body, headers=signed, base_url=BASE)


def test_signed_hubspot_webhook_is_stored_once_and_answered_200(
    client: Any, db: Database, hubspot_connection: str
) -> None:
    body = hubspot_body(hubspot_event(1))
    response = post_hubspot(client, hubspot_connection, body)
    assert response.status_code == 200
    assert response.json["status"] == "accepted"
    rows = inbox_rows(db)
    assert [(r["connection_id"], r["status"], r["deliveries"]) for r in rows] == [
        (hubspot_connection, "pending", 1)
    ]
    assert "x-hubspot-request-timestamp" in rows[0]["headers"]
    assert not any("signature" in k for k in rows[0]["headers"])


def test_replayed_identical_webhook_is_one_inbox_row(
    client: Any, db: Database, hubspot_connection: str
) -> None:
    body = hubspot_body(hubspot_event(1))
    first = post_hubspot(client, hubspot_connection, body)
    again = post_hubspot(client, hubspot_connection, body)  # re-signed, same bytes
    assert (first.status_code, again.status_code) == (200, 200)
    assert first.json["inbox_id"] == again.json["inbox_id"]
    rows = inbox_rows(db)
    assert len(rows) == 1 and rows[0]["deliveries"] == 2


@pytest.mark.parametrize(
    ("case", "expected_check"),
    [
        ("wrong_secret", "hubspot_v3_mismatch"),
        ("stale", "timestamp_stale"),
        ("missing", "signature_missing"),
        ("tampered_body", "hubspot_v3_mismatch"),
        ("v1_not_opted_in", "hubspot_v1_not_enabled"),
    ],
)
def test_bad_missing_or_stale_signature_is_401_and_stores_nothing(  # noqa: PLR0917
    client: Any,
    db: Database,
    hubspot_connection: str,
    case: str,
    expected_check: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = hubspot_body(hubspot_event(1))
    uri = f"{BASE}/hubspot/{hubspot_connection}"
    headers = {
        "wrong_secret": hubspot_v3_headers(body, uri, secret="guess"),
        "stale": hubspot_v3_headers(body, uri, timestamp_ms=int(time.time() * 1000) - 301_000),
        "missing": {},
        "tampered_body": hubspot_v3_headers(body + b" ", uri),
        "v1_not_opted_in": hubspot_v1_headers(body),
    }[case]
    response = post_hubspot(client, hubspot_connection, body, headers=headers)
    assert response.status_code == 401
    assert response.json == {"error": "invalid_signature", "check": expected_check}
    assert inbox_rows(db) == []
    assert any(expected_check in r.getMessage() for r in caplog.records)
    assert not any(HUBSPOT_SECRET in r.getMessage() for r in caplog.records)


def test_unknown_connection_is_404_and_stores_nothing(
    client: Any, db: Database, hubspot_connection: str
) -> None:
    for path in (
        f"/hubspot/{uuid.uuid4()}",
        "/hubspot/not-a-uuid",
        f"/salesforce/{hubspot_connection}",
        f"/standard/{hubspot_connection}",  # the right id under another provider
        f"/hubspot/{hubspot_connection}/extra",
        "/",
    ):
        body = hubspot_body(hubspot_event(1))
        response = client.post(
            path, data=body, headers=hubspot_v3_headers(body, BASE + path), base_url=BASE
        )
        assert response.status_code == 404, path
        assert response.json["error"] == "unknown_connection"
    assert inbox_rows(db) == []


def test_another_tenants_connection_is_invisible(client: Any, db: Database) -> None:
    acme = make_connection(db, tenant_id="acme")
    globex = make_connection(db, tenant_id="globex", secret_env="HUBSPOT_SECRET_GLOBEX")
    with db.transaction() as tx:
        assert get_connection_for_tenant(tx, "acme", globex) is None
        assert get_connection_for_tenant(tx, "globex", acme) is None
        assert get_connection_for_tenant(tx, "acme", acme) is not None
        assert get_connection(tx, globex) is not None
    # Acme's secret doesn't open Globex's door.
    body = hubspot_body(hubspot_event(1))
    path = f"/hubspot/{globex}"
    response = client.post(
        path, data=body, headers=hubspot_v3_headers(body, BASE + path), base_url=BASE
    )
    assert response.status_code == 401
    assert inbox_rows(db) == []


def test_oversize_body_is_413_and_stores_nothing(
    client: Any, db: Database, hubspot_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEBHOOK_MAX_BODY_BYTES", "1024")
    big = hubspot_body(*[hubspot_event(i) for i in range(20)])
    assert len(big) > 1024
    response = post_hubspot(client, hubspot_connection, big)
    assert response.status_code == 413
    assert response.json == {"error": "body_too_large", "check": "content_length"}
    small = hubspot_body(hubspot_event(1))
    assert post_hubspot(client, hubspot_connection, small).status_code == 200
    assert len(inbox_rows(db)) == 1


def test_non_post_is_405(client: Any, hubspot_connection: str) -> None:
    response = client.get(f"/hubspot/{hubspot_connection}", base_url=BASE)
    assert response.status_code == 405


def test_uri_uses_forwarded_proto_and_public_base_url(
    client: Any, db: Database, hubspot_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = f"/hubspot/{hubspot_connection}"
    # Behind Cloud Run the function sees http, but HubSpot signed the https URI.
    body = hubspot_body(hubspot_event(1))
    headers = {**hubspot_v3_headers(body, BASE + path), "X-Forwarded-Proto": "https"}
    plain = client.post(path, data=body, headers=headers, base_url="http://hooks.example.com")
    assert plain.status_code == 200
    # A load balancer with a path prefix: PUBLIC_BASE_URL names the public base.
    monkeypatch.setenv("PUBLIC_BASE_URL", "https://public.example.org/in/")
    body2 = hubspot_body(hubspot_event(2))
    public = "https://public.example.org/in" + path + "?portal=555"
    response = client.post(
        path + "?portal=555",
        data=body2,
        headers=hubspot_v3_headers(body2, public),
        base_url="http://10.0.0.7:8080",
    )
    assert response.status_code == 200
    wrong = client.post(
        path, data=body2, headers=hubspot_v3_headers(body2, BASE + path), base_url=BASE
    )
    assert wrong.status_code == 401


def test_missing_secret_env_is_503_and_stores_nothing(
    client: Any, db: Database, hubspot_connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HUBSPOT_SECRET_ACME")
    response = post_hubspot(client, hubspot_connection, hubspot_body(hubspot_event(1)))
    assert response.status_code == 503
    assert inbox_rows(db) == []


def test_standard_webhooks_and_pipedrive_are_verified(client: Any, db: Database) -> None:
    standard = make_connection(db, provider="standard", secret_env="STANDARD_SECRET_ACME")
    pipedrive = make_connection(db, provider="pipedrive", secret_env="PIPEDRIVE_CREDENTIALS_ACME")
    body = json.dumps(
        {"type": "contact.created", "timestamp": "2026-01-01T00:00:00Z", "data": {"id": "7"}}
    ).encode()
    ok = client.post(f"/standard/{standard}", data=body, headers=standard_headers(body))
    assert ok.status_code == 200
    stale = standard_headers(body, timestamp=int(time.time()) - 400)
    assert client.post(f"/standard/{standard}", data=body, headers=stale).status_code == 401
    pd_body = b'{"meta": {"action": "create", "entity": "deal"}}'
    good = client.post(f"/pipedrive/{pipedrive}", data=pd_body, headers=basic_auth())
    assert good.status_code == 200
    bad = client.post(f"/pipedrive/{pipedrive}", data=pd_body, headers=basic_auth("onceflow:guess"))
    assert bad.status_code == 401
    rows = inbox_rows(db)
    assert len(rows) == 2
    # Pipedrive's Basic credentials are never kept with the body.
    assert all("authorization" not in r["headers"] for r in rows)


def test_v1_signature_accepted_where_opted_in(client: Any, db: Database) -> None:
    connection = make_connection(db, signature_versions=("v3", "v1"))
    body = hubspot_body(hubspot_event(3))
    response = post_hubspot(client, connection, body, headers=hubspot_v1_headers(body))
    assert response.status_code == 200
