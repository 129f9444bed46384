"""Rehearsals never touch live state: a live run and a rehearsal of the same event coexist,
no live claim or enrollment is written, a live claim can't pick a rehearsal step up, and
rehearsals stay out of live history."""

from __future__ import annotations

import json
from typing import Any

from shared.core import queries
from shared.core.db import Database
from shared.ops.models import RehearsalRequest, SuppliedEvent
from shared.ops.rehearsal import start_rehearsal
from tests.ops_support import (
    JournalRow,
    bearer,
    mint,
    seed_run,
    seed_scene,
    seed_tenant,
    seed_workflow,
)

STEPS_CLAIM = queries.load("steps")["steps_claim"]
CHAIN = [{"id": "a", "type": "http.request", "next": "b"}, {"id": "b", "type": "http.request"}]


def _counts(db: Database) -> dict[str, int]:
    with db.transaction() as tx:
        return {
            t: int(tx.scalar(f"SELECT count(*) FROM {t}"))
            for t in (
                "delivery_claims",
                "workflow_enrollments",
                "credit_ledger",
                "admission_refusals",
            )
        }


def test_a_live_run_and_a_rehearsal_of_the_same_event_coexist(db: Database, client: Any) -> None:
    _, wf, ver, event, record_key = seed_scene(db, "acme", CHAIN, "5")
    live = seed_run(
        db,
        "acme",
        wf,
        ver,
        [JournalRow("a", "pending")],
        status="running",
        event_id=event,
        record_key=record_key,
    )
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO delivery_claims (event_id, workflow_id, run_id) VALUES (:e, :w, :r)",
            e=event,
            w=wf,
            r=live,
        )
        tx.execute(
            "INSERT INTO workflow_enrollments (workflow_id, record_key, run_id)"
            " VALUES (:w, :rk, :r)",
            w=wf,
            rk=record_key,
            r=live,
        )
    before = _counts(db)
    request = RehearsalRequest.model_validate({"workflow_id": wf, "event_id": event})
    # Twice, while the live run is active for the same record: no conflict either time.
    first = start_rehearsal(db, request, "acme")
    second = start_rehearsal(db, request, "acme")
    assert first.run_id != second.run_id
    assert _counts(db) == before
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT id, namespace, start_key, status, record_key, lineage_root"
            " FROM workflow_runs ORDER BY created_at"
        )
        rehearsal_steps = tx.all(
            "SELECT s.id, s.idempotency_key FROM workflow_steps s"
            " JOIN workflow_runs r ON r.id = s.run_id"
            " WHERE r.namespace = 'rehearsal'"
        )
        live_keys = {
            r["idempotency_key"]
            for r in tx.all("SELECT idempotency_key FROM workflow_steps WHERE run_id = :r", r=live)
        }
        # A live executor's claim never matches a rehearsal step; a rehearsal claim does.
        claimed_live = [
            tx.one(
                STEPS_CLAIM,
                step_id=str(s["id"]),
                lease_id=str(s["id"]),
                lease_seconds=30,
                namespace="live",
            )
            for s in rehearsal_steps
        ]
    assert [r["namespace"] for r in rows] == ["live", "rehearsal", "rehearsal"]
    assert all(r["start_key"].startswith("rehearsal:") for r in rows[1:])
    assert all(r["record_key"] == record_key and r["status"] == "running" for r in rows)
    assert all(str(r["lineage_root"]) == str(r["id"]) for r in rows[1:])
    assert claimed_live == [None, None]
    assert not live_keys & {s["idempotency_key"] for s in rehearsal_steps}
    with db.transaction() as tx:
        claimed = tx.one(
            STEPS_CLAIM,
            step_id=str(rehearsal_steps[0]["id"]),
            lease_id=str(rehearsal_steps[0]["id"]),
            lease_seconds=30,
            namespace="rehearsal",
        )
    assert claimed is not None and claimed["namespace"] == "rehearsal"

    # Never in live history: lists, the record's story and run lookups all leave it out.
    h = bearer(mint(db, "acme"))
    listed = [r["id"] for r in client.get("/v1/runs", headers=h).get_json()["items"]]
    assert listed == [live]
    story = client.get(
        "/v1/records/explain", headers=h, query_string={"record_key": record_key}
    ).get_json()
    assert [r["id"] for r in story["runs"]] == [live]
    assert [d["run_id"] for d in story["events"][0]["decisions"]] == [live]
    assert client.get(f"/v1/runs/{first.run_id}", headers=h).status_code == 404
    # Driven to its end through the API while the live run is still active: no conflict.
    driven = client.post("/v1/rehearsals", headers=h, json={"workflow_id": wf, "event_id": event})
    assert driven.status_code == 201, driven.get_json()
    assert driven.get_json()["status"] in {"succeeded", "failed", "cancelled"}
    assert _counts(db) == before
    with db.transaction() as tx:
        assert tx.scalar("SELECT status FROM workflow_runs WHERE id = :r", r=live) == "running"
    assert client.post(f"/v1/runs/{first.run_id}/replay", headers=h, json={}).status_code == 404


def test_a_rehearsal_against_a_supplied_event_and_its_refusals(db: Database) -> None:
    seed_tenant(db, "acme")
    seed_tenant(db, "globex")
    wf, _ = seed_workflow(db, "acme", CHAIN)
    unbound, _ = seed_workflow(db, "acme", CHAIN, name="draft", bind=False)
    supplied = RehearsalRequest(
        workflow_id=wf,
        event=SuppliedEvent(
            event_type="hubspot.contact.created", payload={"email": "a@example.com"}
        ),
    )
    start = start_rehearsal(db, supplied, "acme")
    with db.transaction() as tx:
        run = tx.one("SELECT * FROM workflow_runs WHERE id = :r", r=start.run_id)
    assert run is not None and run["trigger_payload"]["email"] == "a@example.com"
    assert run["event_id"] is None and run["start_key"].endswith(":supplied")
    import pytest

    from shared.ops.errors import OpsError

    with pytest.raises(OpsError) as refused:
        start_rehearsal(db, supplied, "globex")
    assert refused.value.code == "not_found"
    with pytest.raises(OpsError) as refused:
        start_rehearsal(db, RehearsalRequest(workflow_id=unbound, event_id=1), "acme")
    assert refused.value.code == "no_active_version"
    with pytest.raises(OpsError) as refused:
        start_rehearsal(db, RehearsalRequest(workflow_id=wf), "acme")
    assert refused.value.code == "invalid_body"


REHEARSED = """\
name: big-deals
tenant: acme
trigger:
  events: [hubspot.deal.created]
  dedup: every_time
steps:
  - id: wait
    type: delay
    config: {days: 2}
    next: pick
  - id: pick
    type: branch
    branches:
      - {when: 'trigger.amount > 100', next: big}
    otherwise: small
  - id: big
    type: crm.create
    config:
      object_type: tasks
      properties: {hs_task_subject: "Big deal ${{ trigger.amount }}"}
    next: notify
  - id: small
    type: end
  - id: notify
    type: http.request
    config:
      url: https://hooks.example.com/deals
      method: POST
      body: {amount: "${{ trigger.amount }}", task: "${{ steps.big.output.id }}"}
"""


def test_a_rehearsal_runs_flow_control_and_stops_every_side_effect(
    db: Database, client: Any, dispatched: Any, monkeypatch: Any
) -> None:
    seed_tenant(db, "acme", balance=100)
    monkeypatch.setenv("ACME_SIGNING_SECRET", "s3cret")
    with db.transaction() as tx:
        tx.execute("UPDATE tenants SET signing_secret_env = 'ACME_SIGNING_SECRET'")
    h = bearer(mint(db, "acme"))
    published = client.post("/v1/workflows", headers=h, json={"source": REHEARSED}).get_json()
    wf = published["workflow_id"]
    client.post(
        f"/v1/workflows/{wf}/activate", headers=h, json={"version_id": published["version_id"]}
    )
    before = _counts(db)
    r = client.post(
        "/v1/rehearsals",
        headers=h,
        json={
            "workflow_id": wf,
            "event": {"event_type": "hubspot.deal.created", "payload": {"amount": 500}},
        },
    )
    assert r.status_code == 201, r.get_json()
    out = r.get_json()
    steps = {s["step_key"]: s for s in out["steps"]}
    assert out["status"] == "succeeded", out
    # Flow control ran: the two-day delay was served at once, the branch chose `big`.
    assert [s["step_key"] for s in out["steps"]] == ["wait", "pick", "big", "notify"]
    assert steps["pick"]["branch_choice"] == "big"
    # Every side effect stopped before it left, and says what it would have sent.
    sent = {w["block"]: w["would_send"] for w in out["would_send"]}
    assert sent["crm.create"]["properties"] == {"hs_task_subject": "Big deal 500"}
    assert sent["http.request"]["url"] == "https://hooks.example.com/deals"
    # A later step renders against the create's stand-in output (its id is the step's key).
    task_id = steps["big"]["output"]["id"]
    assert task_id.startswith("dry-run:")
    assert json.loads(sent["http.request"]["body"]) == {"amount": 500, "task": task_id}
    assert steps["big"]["outcome_code"] == "DRY_RUN"
    # Nothing charged, claimed, enrolled or published; no live history.
    assert _counts(db) == before
    with db.transaction() as tx:
        assert tx.scalar("SELECT credit_balance FROM tenants WHERE id = 'acme'") == 100
        assert tx.scalar("SELECT count(*) FROM workflow_runs WHERE namespace = 'live'") == 0
    assert dispatched.ids == []
    assert client.get("/v1/runs", headers=h).get_json()["items"] == []

    small = client.post(
        "/v1/rehearsals",
        headers=h,
        json={
            "workflow_id": wf,
            "event": {"event_type": "hubspot.deal.created", "payload": {"amount": 5}},
        },
    ).get_json()
    assert [s["step_key"] for s in small["steps"]] == ["wait", "pick", "small"]
    assert small["would_send"] == []
