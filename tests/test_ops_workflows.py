"""Workflows through the ops API: validate, publish (content-addressed), list versions,
activate and deactivate (bindings follow), each refused clearly when it must be."""

from __future__ import annotations

from typing import Any

from shared.core.db import Database
from tests.ops_support import (
    bearer,
    mint,
    seed_tenant,
)

SOURCE = """\
name: greet
tenant: acme
trigger:
  events: [hubspot.contact.created]
steps:
  - id: hello
    type: http.request
    config: {url: "https://example.com/v1"}
"""
SOURCE_V2 = SOURCE.replace("/v1", "/v2").replace("hubspot.contact.created", "hubspot.deal.created")


def _bindings(db: Database) -> list[str]:
    with db.transaction() as tx:
        return [
            r["event_type"]
            for r in tx.all("SELECT event_type FROM trigger_bindings ORDER BY event_type")
        ]


def test_validate_publish_activate_deactivate(db: Database, client: Any) -> None:
    seed_tenant(db, "acme")
    seed_tenant(db, "globex")
    h = bearer(mint(db, "acme"))

    ok = client.post("/v1/workflows/validate", headers=h, json={"source": SOURCE}).get_json()
    assert ok == {"valid": True, "problems": []}
    broken = client.post(
        "/v1/workflows/validate",
        headers=h,
        json={"source": SOURCE.replace("http.request", "no.such_block")},
    )
    body = broken.get_json()
    assert broken.status_code == 200 and body["valid"] is False
    assert body["problems"][0]["line"] == 7 and body["problems"][0]["severity"] == "error"
    foreign = client.post(
        "/v1/workflows/validate", headers=bearer(mint(db, "globex")), json={"source": SOURCE}
    ).get_json()
    assert foreign["valid"] is False and foreign["problems"][0]["path"] == "tenant"

    first = client.post("/v1/workflows", headers=h, json={"source": SOURCE})
    assert first.status_code == 201, first.get_json()
    published = first.get_json()
    assert published["created"] is True and published["number"] == 1
    again = client.post("/v1/workflows", headers=h, json={"source": SOURCE + "# same\n"})
    assert again.get_json()["created"] is False
    assert again.get_json()["version_id"] == published["version_id"]
    v2 = client.post("/v1/workflows", headers=h, json={"source": SOURCE_V2}).get_json()
    assert v2["number"] == 2

    refused = client.post(
        "/v1/workflows", headers=h, json={"source": SOURCE.replace("http.request", "no.such_block")}
    )
    assert (refused.status_code, refused.get_json()["code"]) == (422, "definition_invalid")
    assert refused.get_json()["problems"][0]["location"].startswith("body.source:7:")
    other = client.post(
        "/v1/workflows", headers=bearer(mint(db, "globex")), json={"source": SOURCE}
    )
    assert (other.status_code, other.get_json()["code"]) == (422, "definition_invalid")

    wf = published["workflow_id"]
    listed = client.get(f"/v1/workflows/{wf}/versions", headers=h).get_json()["items"]
    assert [v["number"] for v in listed] == [2, 1] and not any(v["active"] for v in listed)

    act = client.post(
        f"/v1/workflows/{wf}/activate", headers=h, json={"version_id": published["version_id"]}
    )
    assert act.status_code == 200, act.get_json()
    assert act.get_json()["active_version_id"] == published["version_id"]
    assert _bindings(db) == ["hubspot.contact.created"]
    client.post(f"/v1/workflows/{wf}/activate", headers=h, json={"version_id": v2["version_id"]})
    assert _bindings(db) == ["hubspot.deal.created"]
    assert (
        client.get("/v1/workflows", headers=h).get_json()["items"][0]["active_version_id"]
        == v2["version_id"]
    )
    missing = client.post(
        f"/v1/workflows/{wf}/activate",
        headers=h,
        json={"version_id": "00000000-0000-0000-0000-000000000000"},
    )
    assert (missing.status_code, missing.get_json()["code"]) == (404, "not_found")

    off = client.post(f"/v1/workflows/{wf}/deactivate", headers=h, json={})
    assert off.status_code == 200 and off.get_json()["active_version_id"] is None
    assert _bindings(db) == []

    with db.transaction() as tx:
        audit = tx.all("SELECT action, detail FROM ops_audit ORDER BY id")
    actions = [a["action"] for a in audit]
    assert actions.count("workflows.publish") == 5
    assert actions[-1] == "workflows.deactivate"
    # The definition lives in its version row; the audit records only its size.
    assert audit[3]["detail"]["body"]["source"] == {"chars": len(SOURCE)}


def test_a_source_the_yaml_reader_refuses_is_a_4xx_not_a_500(db: Database, client: Any) -> None:
    # Found by the schemathesis run: a C1 control character is refused by the YAML *reader*.
    seed_tenant(db, "acme")
    h = bearer(mint(db, "acme"))
    checked = client.post("/v1/workflows/validate", headers=h, json={"source": "a\x84"})
    assert checked.status_code == 200 and checked.get_json()["valid"] is False
    assert "not valid YAML" in checked.get_json()["problems"][0]["message"]
    published = client.post("/v1/workflows", headers=h, json={"source": "a\x84"})
    assert (published.status_code, published.get_json()["code"]) == (422, "definition_invalid")
