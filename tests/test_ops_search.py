"""Search the way people search: a HubSpot record URL, an object id, an email or a record key,
through the real `ops` entry point, never finding another tenant's records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.core.db import Database
from shared.ops.errors import OpsError
from shared.ops.search import classify
from shared.ops.search import record_location as hubspot_location
from tests.ops_support import (
    JournalRow,
    bearer,
    mint,
    seed_connection,
    seed_event,
    seed_run,
    seed_tenant,
    seed_workflow,
)

STEPS = [{"id": "a", "type": "http.request"}]


def test_hubspot_record_urls_are_read_in_their_current_and_older_forms() -> None:
    assert hubspot_location("https://app.hubspot.com/contacts/4455/record/0-1/901") == (
        "4455",
        "contact",
        "901",
    )
    assert hubspot_location("https://app-eu1.hubspot.com/contacts/4455/record/0-3/77/view/1") == (
        "4455",
        "deal",
        "77",
    )
    assert hubspot_location("https://app.hubspot.com/contacts/4455/company/12") == (
        "4455",
        "company",
        "12",
    )
    for bad in (
        "https://evil.example/contacts/4455/record/0-1/901",
        "https://app.hubspot.com/reports/4455",
        "ftp://app.hubspot.com/contacts/4455/record/0-1/901",
    ):
        with pytest.raises(OpsError) as err:
            hubspot_location(bad)
        assert err.value.status == 422
    assert classify("lead@example.com") == "email"
    assert classify("901") == "object_id"
    assert classify("https://app.hubspot.com/x") == "hubspot_url"
    with pytest.raises(OpsError):
        classify("two words")


def _tenant(db: Database, tenant: str, portal: str, email: str) -> dict[str, Any]:
    """One HubSpot portal: contact 901 changed its email (event), contact 902 ran a workflow
    whose trigger record holds the same email."""
    seed_tenant(db, tenant)
    conn = seed_connection(db, tenant)
    event = seed_event(db, tenant, conn, "901", event_type="hubspot.contact.property_changed")
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET provider_account_id = :p WHERE id = :c", p=portal, c=conn
        )
        tx.execute(
            "UPDATE workflow_trigger_events SET changed_fields = CAST(:f AS jsonb),"
            " record_object_type = 'contact' WHERE id = :e",
            f=json.dumps({"email": email.upper()}),
            e=event,
        )
    wf, ver = seed_workflow(db, tenant, STEPS)
    run = seed_run(
        db,
        tenant,
        wf,
        ver,
        [JournalRow("a", "succeeded")],
        status="succeeded",
        record_key=f"{conn}:contact:902",
    )
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET trigger_record = CAST(:r AS jsonb) WHERE id = :id",
            r=json.dumps({"id": "902", "properties": {"email": email, "firstname": "Ada"}}),
            id=run,
        )
    return {"conn": conn, "token": mint(db, tenant), "run": run}


def _keys(client: Any, token: str, q: str) -> list[str]:
    r = client.get("/v1/records/search", query_string={"q": q}, headers=bearer(token))
    assert r.status_code == 200, r.get_json()
    return [m["record_key"] for m in r.get_json()["items"]]


def test_search_by_url_id_email_and_key_finds_only_the_callers_records(
    db: Database, client: Any
) -> None:
    # Both tenants have the same object ids, the same email and even the same portal number:
    # only the connections decide whose record it is.
    acme = _tenant(db, "acme", "4455", "ada@example.com")
    globex = _tenant(db, "globex", "4455", "ada@example.com")
    a, g = acme["conn"], globex["conn"]
    tok = acme["token"]
    assert _keys(client, tok, "https://app.hubspot.com/contacts/4455/record/0-1/901") == [
        f"{a}:contact:901"
    ]
    assert _keys(client, tok, "901") == [f"{a}:contact:901"]
    assert _keys(client, tok, "902") == [f"{a}:contact:902"]
    assert sorted(_keys(client, tok, "Ada@Example.com")) == sorted(
        [f"{a}:contact:901", f"{a}:contact:902"]
    )
    assert _keys(client, tok, f"{a}:contact:901") == [f"{a}:contact:901"]
    # The other tenant's record key, and a portal that is not ours, find nothing.
    assert _keys(client, tok, f"{g}:contact:901") == []
    assert _keys(client, tok, "https://app.hubspot.com/contacts/999/record/0-1/901") == []
    # A record of our portal that never sent anything is still found (its timeline is empty:
    # that is the answer to "why didn't it run?").
    found = client.get(
        "/v1/records/search",
        query_string={"q": "https://app.hubspot.com/contacts/4455/record/0-1/5"},
        headers=bearer(tok),
    ).get_json()
    assert found["interpreted_as"] == "hubspot_url"
    assert [m["record_key"] for m in found["items"]] == [f"{a}:contact:5"]
    assert found["items"][0]["last_seen_at"] is None
    # An admin token searches every tenant.
    assert sorted(_keys(client, mint(db, None), "901")) == sorted(
        [f"{a}:contact:901", f"{g}:contact:901"]
    )


def test_search_input_that_names_nothing_is_a_422_not_a_500(db: Database, client: Any) -> None:
    tok = _tenant(db, "acme", "4455", "ada@example.com")["token"]
    for q in ("two words", "https://example.com/contacts/1/record/0-1/2", "a@b", ""):
        r = client.get("/v1/records/search", query_string={"q": q}, headers=bearer(tok))
        assert r.status_code in (400, 422), (q, r.status_code)
        assert r.get_json()["code"] in ("invalid_query", "invalid_search", "unknown_url")


def test_the_page_search_opens_the_one_record_found_and_lists_several(
    db: Database, client: Any
) -> None:
    acme = _tenant(db, "acme", "4455", "ada@example.com")
    globex = _tenant(db, "globex", "4455", "ada@example.com")
    client.post("/ui/login", data={"token": acme["token"]})
    one = client.get(
        "/ui", query_string={"q": "https://app.hubspot.com/contacts/4455/record/0-1/901"}
    ).get_data(as_text=True)
    assert f"Record <code>{acme['conn']}:contact:901</code>" in one
    assert 'href="https://app.hubspot.com/contacts/4455/record/0-1/901"' in one
    several = client.get("/ui", query_string={"q": "ada@example.com"}).get_data(as_text=True)
    assert "Records matching" in several and several.count('class="open-record"') == 2
    assert globex["conn"] not in several
