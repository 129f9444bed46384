"""The ops JSON API through the real `ops` entry point: auth, tenant isolation, the error
model, runs and their journals, refusals, "why didn't it run?", credits, audit."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.core.db import Database
from tests.ops_support import (
    JournalRow,
    bearer,
    mint,
    seed_connection,
    seed_event,
    seed_run,
    seed_scene,
    seed_tenant,
    seed_workflow,
)

CHAIN = [{"id": "a", "type": "http.request", "next": "b"}, {"id": "b", "type": "http.request"}]


def _world(db: Database) -> dict[str, Any]:
    """Two tenants, each with a workflow, an event, a failed run and a refusal."""
    out: dict[str, Any] = {}
    for tenant in ("acme", "globex"):
        conn, wf, ver, event, record_key = seed_scene(db, tenant, CHAIN, "101", balance=500)
        run = seed_run(
            db,
            tenant,
            wf,
            ver,
            [
                JournalRow("a", "succeeded"),
                JournalRow(
                    "b", "failed", error="boom", error_class="permanent", outcome_code="HTTP_400"
                ),
            ],
            event_id=event,
            record_key=record_key,
        )
        event2 = seed_event(db, tenant, conn, "101", event_type="hubspot.contact.created")
        with db.transaction() as tx:
            tx.execute(
                "INSERT INTO admission_refusals (tenant_id, event_id, workflow_id,"
                " version_id, record_key, reason, detail) VALUES (:t, :e, :w, :v, :rk,"
                " 'duplicate', 'enrolled by run x')",
                t=tenant,
                e=event2,
                w=wf,
                v=ver,
                rk=record_key,
            )
            tx.execute(
                "INSERT INTO credit_ledger (tenant_id, lineage_key, amount, block_type,"
                " run_id) VALUES (:t, :k, 1, 'http.request', :r)",
                t=tenant,
                k=f"onceflow:{run}:a",
                r=run,
            )
        out[tenant] = {
            "conn": conn,
            "workflow": wf,
            "version": ver,
            "event": event,
            "event2": event2,
            "run": run,
            "record_key": record_key,
            "token": mint(db, tenant),
        }
    return out


def test_openapi_is_public_and_every_other_route_needs_a_token(db: Database, client) -> None:
    doc = client.get("/openapi.json")
    assert doc.status_code == 200
    spec = doc.get_json()
    assert spec["openapi"].startswith("3.1")
    assert "/v1/runs/{run_id}/replay" in spec["paths"]
    for path, methods in spec["paths"].items():
        if path == "/openapi.json":
            continue
        for method in methods:
            url = path.replace("{run_id}", "00000000-0000-0000-0000-000000000000").replace(
                "{workflow_id}", "00000000-0000-0000-0000-000000000000"
            )
            for headers in ({}, bearer("ofo_not-a-real-token"), {"Authorization": "Basic x"}):
                r = client.open(url, method=method.upper(), headers=headers, json={})
                assert r.status_code == 401, (method, path)
                assert r.get_json()["code"] == "unauthenticated"
                assert r.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_is_refused(db: Database, client) -> None:
    seed_tenant(db, "acme")
    token = mint(db, "acme")
    assert client.get("/v1/runs", headers=bearer(token)).status_code == 200
    with db.transaction() as tx:
        tx.execute("UPDATE ops_tokens SET revoked_at = now()")
    assert client.get("/v1/runs", headers=bearer(token)).status_code == 401


def test_tokens_are_stored_only_as_sha256(db: Database) -> None:
    seed_tenant(db, "acme")
    token = mint(db, "acme")
    with db.transaction() as tx:
        rows = tx.all("SELECT * FROM ops_tokens")
    assert len(rows) == 1
    import hashlib

    assert bytes(rows[0]["token_sha256"]) == hashlib.sha256(token.encode()).digest()
    assert token.encode() not in json.dumps(rows, default=str).encode()


def test_tenant_isolation_across_every_endpoint(db: Database, client) -> None:
    w = _world(db)
    acme, globex = w["acme"], w["globex"]
    h = bearer(acme["token"])
    # Lists show only the caller's rows.
    runs = client.get("/v1/runs", headers=h).get_json()["items"]
    assert [r["id"] for r in runs] == [acme["run"]]
    refusals = client.get("/v1/refusals", headers=h).get_json()["items"]
    assert {r["tenant_id"] for r in refusals} == {"acme"}
    wfs = client.get("/v1/workflows", headers=h).get_json()["items"]
    assert [x["id"] for x in wfs] == [acme["workflow"]]
    assert client.get("/v1/credits", headers=h).get_json()["tenant_id"] == "acme"
    # Filters naming the other tenant's things find nothing.
    assert (
        client.get(f"/v1/runs?workflow_id={globex['workflow']}", headers=h).get_json()["items"]
        == []
    )
    assert (
        client.get(f"/v1/refusals?event_id={globex['event2']}", headers=h).get_json()["items"] == []
    )
    # Every id of the other tenant is a 404, exactly like an unknown id.
    other = [
        ("GET", f"/v1/runs/{globex['run']}", None),
        ("POST", f"/v1/runs/{globex['run']}/replay", {}),
        ("POST", f"/v1/runs/{globex['run']}/retry", {}),
        ("GET", f"/v1/workflows/{globex['workflow']}/versions", None),
        ("GET", f"/v1/records/explain?record_key={globex['record_key']}", None),
        ("GET", "/v1/credits?tenant_id=globex", None),
        ("POST", f"/v1/workflows/{globex['workflow']}/activate", {"version_id": globex["version"]}),
        ("POST", f"/v1/workflows/{globex['workflow']}/deactivate", {}),
        ("POST", "/v1/rehearsals", {"workflow_id": globex["workflow"]}),
    ]
    for method, url, body in other:
        r = client.open(url, method=method, headers=h, json=body)
        assert r.status_code == 404, (method, url, r.get_json())
        assert r.get_json()["code"] == "not_found"
    # The other tenant's run is untouched by the attempted replay/retry.
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs WHERE tenant_id = 'globex'") == 1
    # An admin token sees both tenants.
    admin = bearer(mint(db, None))
    assert len(client.get("/v1/runs", headers=admin).get_json()["items"]) == 2
    assert client.get(f"/v1/runs/{globex['run']}", headers=admin).status_code == 200


def test_bad_input_is_a_4xx_with_a_code_and_a_message(db: Database, client) -> None:
    w = _world(db)
    h = bearer(w["acme"]["token"])
    replay = f"/v1/runs/{w['acme']['run']}/replay"
    cases = [
        (
            client.post(
                replay, headers={**h, "Content-Type": "application/json"}, data=b"{not json"
            ),
            400,
            "malformed_json",
        ),
        (client.post(replay, headers=h, json={"reason": "x", "surprise": 1}), 422, "invalid_body"),
        (client.post(replay, headers=h, json={"reason": 12}), 422, "invalid_body"),
        (client.post(replay, headers=h, json=[1, 2]), 422, "invalid_body"),
        (client.post(replay, headers=h, data=b"{" + b" " * 200_000 + b"}"), 413, "body_too_large"),
        (client.get("/v1/runs?colour=red", headers=h), 400, "invalid_query"),
        (client.get("/v1/runs?limit=zero", headers=h), 400, "invalid_query"),
        (client.get("/v1/runs?limit=1&limit=2", headers=h), 400, "invalid_query"),
        (client.get("/v1/runs?created_after=2026-01-01T00:00:00", headers=h), 400, "invalid_query"),
        (client.get("/v1/runs?cursor=bm9wZQ", headers=h), 400, "invalid_cursor"),
        (client.get("/v1/runs?record_key=a%00b", headers=h), 400, "invalid_query"),
        (client.get("/v1/runs/not-a-uuid", headers=h), 404, "not_found"),
        (
            client.get("/v1/records/explain?record_key=nonsense", headers=h),
            422,
            "invalid_record_key",
        ),
        (client.get("/v1/nothing-here", headers=h), 404, "no_such_route"),
        (client.delete("/v1/runs", headers=h), 405, "method_not_allowed"),
        (client.get("/v1/credits", headers=bearer(mint(db, None))), 422, "tenant_required"),
    ]
    for response, status, code in cases:
        body = response.get_json()
        assert response.status_code == status, (code, body)
        assert body["code"] == code
        assert body["message"]
    problems = client.post(replay, headers=h, json={"surprise": 1}).get_json()["problems"]
    assert problems[0]["location"] == "body.surprise"


def test_runs_filter_paginate_and_failed_is_the_dead_letter_list(db: Database, client) -> None:
    seed_tenant(db, "acme")
    conn = seed_connection(db, "acme")
    wf, ver = seed_workflow(db, "acme", CHAIN)
    wf2, ver2 = seed_workflow(db, "acme", CHAIN, name="other", bind=False)
    old = datetime.now(UTC) - timedelta(days=3)
    ids = {}
    for i in range(5):
        ids[f"ok{i}"] = seed_run(
            db,
            "acme",
            wf,
            ver,
            [JournalRow("a", "succeeded")],
            status="succeeded",
            record_key=f"{conn}:contacts:{i}",
            created_at=old + timedelta(minutes=i),
        )
    ids["failed"] = seed_run(
        db, "acme", wf2, ver2, [JournalRow("a", "failed")], record_key=f"{conn}:contacts:9"
    )
    h = bearer(mint(db, "acme"))
    dead = client.get("/v1/runs?status=failed", headers=h).get_json()["items"]
    assert [r["id"] for r in dead] == [ids["failed"]]
    assert [
        r["id"] for r in client.get(f"/v1/runs?workflow_id={wf2}", headers=h).get_json()["items"]
    ] == [ids["failed"]]
    rk = f"{conn}:contacts:3"
    assert [
        r["id"]
        for r in client.get("/v1/runs", headers=h, query_string={"record_key": rk}).get_json()[
            "items"
        ]
    ] == [ids["ok3"]]
    window = {
        "created_after": (old + timedelta(minutes=1)).isoformat(),
        "created_before": (old + timedelta(minutes=3)).isoformat(),
    }
    assert {
        r["id"] for r in client.get("/v1/runs", headers=h, query_string=window).get_json()["items"]
    } == {ids["ok1"], ids["ok2"]}
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        q = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/runs", headers=h, query_string=q).get_json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [ids["failed"], *(ids[f"ok{i}"] for i in (4, 3, 2, 1, 0))]


def test_run_detail_has_the_whole_journal_charges_and_lineage(db: Database, client) -> None:
    w = _world(db)
    acme = w["acme"]
    detail = client.get(f"/v1/runs/{acme['run']}", headers=bearer(acme["token"])).get_json()
    assert detail["run"]["status"] == "failed"
    assert [s["step_key"] for s in detail["steps"]] == ["a", "b"]
    b = detail["steps"][1]
    assert (b["status"], b["error"], b["error_class"], b["outcome_code"], b["attempt"]) == (
        "failed",
        "boom",
        "permanent",
        "HTTP_400",
        1,
    )
    assert b["idempotency_key"] == f"onceflow:{acme['run']}:b"
    assert [c["lineage_key"] for c in detail["charges"]] == [f"onceflow:{acme['run']}:a"]
    assert [r["id"] for r in detail["lineage"]] == [acme["run"]]


def test_refusals_by_record_event_and_workflow(db: Database, client) -> None:
    w = _world(db)
    acme = w["acme"]
    h = bearer(acme["token"])
    for q in (
        {"record_key": acme["record_key"]},
        {"event_id": acme["event2"]},
        {"workflow_id": acme["workflow"]},
    ):
        items = client.get("/v1/refusals", headers=h, query_string=q).get_json()["items"]
        assert len(items) == 1, q
        assert items[0]["reason"] == "duplicate"
        assert items[0]["detail"] == "enrolled by run x"
        assert "once per record" in items[0]["explanation"]
    assert (
        client.get("/v1/refusals", headers=h, query_string={"event_id": acme["event"]}).get_json()[
            "items"
        ]
        == []
    )


def test_why_didnt_it_run_lists_every_event_and_every_decision(db: Database, client) -> None:
    w = _world(db)
    acme = w["acme"]
    # A third event nobody decided about yet, and a second workflow bound to its type.
    pending = seed_event(db, "acme", acme["conn"], "101", published=False)
    seed_workflow(db, "acme", CHAIN, name="second")
    h = bearer(acme["token"])
    out = client.get(
        "/v1/records/explain", headers=h, query_string={"record_key": acme["record_key"]}
    ).get_json()
    by_event = {
        e["event_id"]: {d["workflow_name"]: d for d in e["decisions"]} for e in out["events"]
    }
    assert list(by_event) == [acme["event"], acme["event2"], pending]
    admitted = by_event[acme["event"]]["wf"]
    assert (admitted["outcome"], admitted["run_id"], admitted["run_status"]) == (
        "admitted",
        acme["run"],
        "failed",
    )
    refused = by_event[acme["event2"]]["wf"]
    assert (refused["outcome"], refused["reason"], refused["detail"]) == (
        "refused",
        "duplicate",
        "enrolled by run x",
    )
    assert by_event[pending]["wf"]["outcome"] == "undecided"
    assert "not been published" in by_event[pending]["second"]["explanation"]
    assert [r["id"] for r in out["runs"]] == [acme["run"]]


def test_credits_balance_and_ledger(db: Database, client) -> None:
    w = _world(db)
    out = client.get("/v1/credits", headers=bearer(w["acme"]["token"])).get_json()
    assert out["balance"] == 500
    assert [e["lineage_key"] for e in out["ledger"]] == [f"onceflow:{w['acme']['run']}:a"]


def test_every_mutating_call_is_audited_refused_ones_included(db: Database, client) -> None:
    w = _world(db)
    acme = w["acme"]
    h = bearer(acme["token"])
    client.post(f"/v1/runs/{w['globex']['run']}/replay", headers=h, json={"reason": "peek"})
    client.get("/v1/runs", headers=h)
    with db.transaction() as tx:
        rows = tx.all("SELECT * FROM ops_audit ORDER BY id")
    assert len(rows) == 1
    assert rows[0]["action"] == "runs.replay"
    assert rows[0]["tenant_id"] == "acme"
    assert rows[0]["target"] == w["globex"]["run"]
    assert rows[0]["detail"]["outcome"] == "refused"
    assert rows[0]["detail"]["code"] == "not_found"
