"""Random headers, paths and bodies at the `webhook` entry point: never a 5xx, never a stored
unverified body."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.db import Database
from tests.ingest_support import HUBSPOT_SECRET, STANDARD_SECRET, make_connection, webhook_client

HEADER_NAMES = st.sampled_from(
    [
        "X-HubSpot-Signature-v3",
        "X-HubSpot-Request-Timestamp",
        "X-HubSpot-Signature",
        "X-HubSpot-Signature-Version",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "Authorization",
        "X-Forwarded-Proto",
        "Content-Type",
        "X-Anything",
    ]
)
# Header values must be latin-1 without control characters to be sent at all.
HEADER_VALUES = st.one_of(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
    st.sampled_from(["v1", "v2", "v3", "Basic b25jZWZsb3c6eA==", "v1,AAAA", "https", "0"]),
    st.integers(min_value=-(10**15), max_value=10**15).map(str),
)


@pytest.fixture(scope="module")
def client() -> Any:
    return webhook_client()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_requests_never_5xx_and_never_store(
    data: st.DataObject, client: Any, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")
    monkeypatch.setenv("WEBHOOK_MAX_BODY_BYTES", "2048")
    monkeypatch.setenv("HUBSPOT_SECRET_ACME", HUBSPOT_SECRET)
    monkeypatch.setenv("STANDARD_SECRET_ACME", STANDARD_SECRET)
    monkeypatch.setenv("PIPEDRIVE_CREDENTIALS_ACME", "onceflow:pw")
    with db.transaction() as tx:
        ids = [r["id"] for r in tx.all("SELECT id::text AS id FROM connections ORDER BY id")]
    if not ids:
        ids = [
            make_connection(db, provider="hubspot", secret_env="HUBSPOT_SECRET_ACME"),
            make_connection(db, provider="standard", secret_env="STANDARD_SECRET_ACME"),
            make_connection(db, provider="pipedrive", secret_env="PIPEDRIVE_CREDENTIALS_ACME"),
        ]
    provider = data.draw(st.sampled_from(["hubspot", "standard", "pipedrive", "x", ""]))
    target = data.draw(
        st.one_of(
            st.sampled_from(ids),
            st.uuids().map(str),
            # Printable ASCII: what a URL path can carry (the test client encodes nothing else).
            st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40),
        )
    )
    # No leading "//": the test client would read the rest as a host name.
    path = "/" + f"{provider}/{target}".replace("?", "").replace("#", "").lstrip("/")
    headers = data.draw(st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=6))
    body = data.draw(st.binary(max_size=3000))
    method = data.draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]))
    response = client.open(path, method=method, data=body, headers=headers)
    assert response.status_code < 500, (response.status_code, response.data)
    # 308: the framework's own URL normalisation (e.g. "//" in the path) redirects first.
    assert response.status_code in (308, 401, 404, 405, 413), response.status_code
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM webhook_inbox") == 0
