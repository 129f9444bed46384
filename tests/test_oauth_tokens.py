"""OAuth tokens of a connection against the fake's token endpoint over real HTTP: sealed at
rest, refreshed when stale with one refresh in flight across callers, a rejected token
refreshed once, and a revoked grant putting the connection in needs_reauthorization."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator

import httpx
import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.accounts import oauth_tokens
from shared.accounts.oauth_tokens import Grant, ReauthorizationNeeded
from shared.admission.admit import provider_suppression
from shared.core.db import Database
from shared.providers.hubspot import versions
from shared.providers.hubspot.oauth import hubspot_refresher
from tests.ingest_support import make_connection

KEK_ENV = "ONCEFLOW_TOKEN_KEK"
REDIRECT = "https://hooks.example.com/webhook/oauth/hubspot/callback"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv(KEK_ENV, base64.b64encode(b"k" * 32).decode())
    crm = FakeCrm(FakeCrmConfig(token="tok")).start()
    try:
        yield crm
    finally:
        crm.stop()


def install(db: Database, fake: FakeCrm) -> tuple[str, Grant]:
    """The portal installs the app: code -> grant, stored sealed on a new connection."""
    grant = fake.issue_grant(2002, REDIRECT)
    connection_id = make_connection(db, portal_id="2002")
    with db.transaction() as tx:
        oauth_tokens.store_grant(tx, connection_id, grant, KEK_ENV)
    return connection_id, grant


def refresher(fake: FakeCrm) -> oauth_tokens.Refresher:
    return hubspot_refresher(
        client_id="fake-client-id", client_secret="fake-client-secret", base_url=fake.url
    )


def make_stale(db: Database, connection_id: str) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connection_oauth_tokens SET access_expires_at = now() - interval '1 second'"
            " WHERE connection_id = CAST(:c AS uuid)",
            c=connection_id,
        )


def test_tokens_are_sealed_at_rest_and_a_fresh_one_is_used_as_is(
    db: Database, fake: FakeCrm
) -> None:
    connection_id, grant = install(db, fake)
    with db.transaction() as tx:
        row = tx.one("SELECT * FROM connection_oauth_tokens")
    assert row is not None
    stored = b"".join(bytes(row[c]) for c in row if isinstance(row[c], bytes | memoryview))
    assert grant.refresh_token.encode() not in stored
    assert grant.access_token.encode() not in stored
    assert oauth_tokens.access_token(db, connection_id, refresher(fake)) == grant.access_token
    assert fake.oauth.refreshes == 0


def test_two_callers_with_a_stale_token_cause_one_refresh(db: Database, fake: FakeCrm) -> None:
    connection_id, grant = install(db, fake)
    make_stale(db, connection_id)
    barrier = threading.Barrier(2, timeout=10)
    got: list[str] = []

    def caller() -> None:
        barrier.wait()
        got.append(oauth_tokens.access_token(db, connection_id, refresher(fake)))

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert fake.oauth.refreshes == 1
    assert len(got) == 2 and got[0] == got[1] != grant.access_token
    # The new token works against the CRM API (portal 2002's).
    made = httpx.post(
        fake.url + versions.crm_objects("deals"),
        json={"properties": {"dealname": "x"}},
        headers={"Authorization": f"Bearer {got[0]}"},
    )
    assert made.status_code == 201


def test_a_rejected_token_is_refreshed_once(db: Database, fake: FakeCrm) -> None:
    connection_id, grant = install(db, fake)
    first = oauth_tokens.access_token(
        db, connection_id, refresher(fake), rejected=grant.access_token
    )
    again = oauth_tokens.access_token(
        db, connection_id, refresher(fake), rejected=grant.access_token
    )
    assert first == again != grant.access_token  # the second caller's 401 was already handled
    assert fake.oauth.refreshes == 1


def test_a_revoked_grant_needs_reauthorization_and_admission_says_so(
    db: Database, fake: FakeCrm
) -> None:
    connection_id, grant = install(db, fake)
    httpx.post(f"{fake.url}/_admin/oauth/revoke", json={"refresh_token": grant.refresh_token})
    make_stale(db, connection_id)
    with pytest.raises(ReauthorizationNeeded):
        oauth_tokens.access_token(db, connection_id, refresher(fake))
    with db.transaction() as tx:
        status = tx.scalar(
            "SELECT status FROM connections WHERE id = CAST(:c AS uuid)", c=connection_id
        )
    assert status == "needs_reauthorization"

    class Facts:  # the two fields provider_suppression reads first
        connection_status = status
        connection_id = "c1"

    detail = provider_suppression(Facts())  # type: ignore[arg-type]
    assert detail is not None and "needs reauthorization" in detail
