"""What a connection's port saw, kept for people (shared/port/observed.py): the connection's
last real call in the health view, OAuth grants understood as credentials, and records named
by what onceflow's own CRM reads and writes returned (the page and the search by email)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.core.db import Database
from shared.port import observed
from shared.port.interface import PortError
from shared.providers import connect
from tests.ops_support import (
    bearer,
    mint,
    seed_run,
    seed_tenant,
    seed_workflow,
)


@pytest.fixture
def fake() -> Iterator[FakeCrm]:
    crm = FakeCrm(FakeCrmConfig(token="tok")).start()
    try:
        yield crm
    finally:
        crm.stop()


@pytest.fixture(autouse=True)
def fresh_observations() -> Iterator[None]:
    connect.forget_ports()
    observed._last_noted.clear()
    observed._labels_written.clear()
    observed._pending.clear()
    yield
    connect.forget_ports()


def _connection(db: Database, fake: FakeCrm, tenant: str = "acme") -> str:
    seed_tenant(db, tenant)
    with db.transaction() as tx:
        return str(
            tx.scalar(
                "INSERT INTO connections (tenant_id, provider, webhook_secret_env,"
                " api_credentials_env, api_base_url) VALUES (:t, 'hubspot', 'HS_SECRET',"
                " 'OBSERVED_TOKEN', :url) RETURNING id::text",
                t=tenant,
                url=fake.url,
            )
        )


def _health(client: Any, db: Database, connection_id: str) -> tuple[dict[str, Any], list[str]]:
    body = client.get("/v1/health", headers=bearer(mint(db, None))).get_json()
    (found,) = [c for c in body["connections"] if c["connection_id"] == connection_id]
    return found, body["problems"]


def test_health_shows_the_last_real_call_when_it_fails_and_when_it_works_again(
    db: Database, fake: FakeCrm, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = _connection(db, fake)
    before, _ = _health(client, db, cid)
    assert before["last_call_at"] is None and before["last_call_ok"] is None

    monkeypatch.setenv("OBSERVED_TOKEN", "revoked")  # the fake answers 401 to any other token
    port = connect.port_for(db, cid)
    with pytest.raises(PortError):
        port.create("contacts", {"email": "x@example.com"})
    observed.flush(db)  # the caller writes what its port observed (a step: after its settle)
    failing, problems = _health(client, db, cid)
    assert failing["last_call_ok"] is False and "unauthorized" in failing["last_call_error"]
    assert any(f"connection {cid}: its last call to the provider failed" in p for p in problems)

    monkeypatch.setenv("OBSERVED_TOKEN", "tok")
    port = connect.port_for(db, cid)
    created = port.create("contacts", {"email": "x@example.com"})
    # A 404 is the provider answering about the request: the connection works.
    with pytest.raises(PortError):
        port.get("contacts", "999999")
    observed.flush(db)
    working, problems = _health(client, db, cid)
    assert working["last_call_ok"] is True and working["last_call_error"] is None
    assert working["last_call_at"] > failing["last_call_at"]
    assert not any(cid in p for p in problems)
    assert created.id


def test_an_oauth_connection_is_credentialed_by_its_grant_and_its_sealing_key(
    db: Database, fake: FakeCrm, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = _connection(db, fake)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET api_credentials_env = NULL, credential_kind = 'oauth'"
            " WHERE id = :c",
            c=cid,
        )
        tx.execute(
            "INSERT INTO connection_oauth_tokens (connection_id, kek_env, data_key_sealed,"
            " refresh_token_sealed, access_token_sealed, access_expires_at)"
            " VALUES (:c, 'OBSERVED_KEK', '\\x00', '\\x00', '\\x00', now())",
            c=cid,
        )
    monkeypatch.delenv("OBSERVED_KEK", raising=False)
    unsealed, problems = _health(client, db, cid)
    assert unsealed["credentials"] == "oauth" and unsealed["credentials_configured"] is False
    assert unsealed["oauth_refreshed_at"] is not None
    assert f"connection {cid}: the key that seals its OAuth grant is not set" in problems
    monkeypatch.setenv("OBSERVED_KEK", "k" * 44)
    sealed, problems = _health(client, db, cid)
    assert sealed["credentials_configured"] is True
    assert not any(cid in p for p in problems)  # it was "has no credentials configured"


def test_records_are_named_by_what_the_port_saw_and_found_by_email(
    db: Database, fake: FakeCrm, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = _connection(db, fake)
    monkeypatch.setenv("OBSERVED_TOKEN", "tok")
    port = connect.port_for(db, cid)
    ada = port.create(
        "contacts", {"firstname": "Ada", "lastname": "Lovelace", "email": "Ada@Example.com"}
    )
    observed.flush(db)
    record_key = f"{cid}:contact:{ada.id}"
    wf, ver = seed_workflow(db, "acme", [{"id": "a", "type": "end"}], name="named")
    run = seed_run(db, "acme", wf, ver, [], status="succeeded", record_key=record_key)
    token = mint(db, "acme")

    found = client.get(
        "/v1/records/search", query_string={"q": "ada@example.com"}, headers=bearer(token)
    ).get_json()
    assert [(m["record_key"], m["label"]) for m in found["items"]] == [
        (record_key, "Ada Lovelace <ada@example.com>")
    ]
    runs = client.get("/v1/runs", headers=bearer(token)).get_json()["items"]
    assert [(r["id"], r["record_label"]) for r in runs] == [(run, "Ada Lovelace <ada@example.com>")]
    story = client.get(
        "/v1/records/explain", query_string={"record_key": record_key}, headers=bearer(token)
    ).get_json()
    assert story["record_label"] == "Ada Lovelace <ada@example.com>"

    # A later read that renames her is kept; reading the same again writes nothing.
    port.update("contacts", ada.id, {"lastname": "King"})
    port.get("contacts", ada.id, ["firstname", "lastname", "email"])
    observed.flush(db)
    with db.transaction() as tx:
        first = tx.one(
            "SELECT label, updated_at FROM record_labels WHERE record_key = :k", k=record_key
        )
    port.get("contacts", ada.id, ["firstname", "lastname", "email"])
    observed.flush(db)
    with db.transaction() as tx:
        again = tx.one(
            "SELECT label, updated_at FROM record_labels WHERE record_key = :k", k=record_key
        )
    assert first["label"] == "Ada King" and again == first

    # Another tenant's search never finds her.
    seed_tenant(db, "globex")
    other = mint(db, "globex")
    assert (
        client.get(
            "/v1/records/search", query_string={"q": "ada@example.com"}, headers=bearer(other)
        ).get_json()["items"]
        == []
    )
