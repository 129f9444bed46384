"""The thin entry points through functions-framework's test client (real Postgres)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import functions_framework

from shared.core.db import Database
from tests.steps_support import chain, definition, publish_version, run_row, start_run, steps_of

ROOT_MAIN = str(Path(__file__).resolve().parent.parent / "main.py")


def push_body(payload: Any) -> dict[str, Any]:
    data = base64.b64encode(json.dumps(payload).encode()).decode()
    return {
        "message": {"data": data, "messageId": "m-1", "publishTime": "2026-01-01T00:00:00Z"},
        "subscription": "projects/p/subscriptions/step-ready-push",
    }


def test_advance_step_settles_a_step_and_acks_a_redelivery(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "end")))
    run_id, (step_id,) = start_run(db, version)
    client = functions_framework.create_app("advance_step", ROOT_MAIN, "cloudevent").test_client()
    first = client.post("/", json=push_body({"step_id": step_id}))
    assert first.status_code == 200
    assert steps_of(db, run_id)["s0"]["status"] == "succeeded"
    assert run_row(db, run_id)["status"] == "succeeded"
    before = steps_of(db, run_id)
    again = client.post("/", json=push_body({"step_id": step_id}))
    assert again.status_code == 200 and steps_of(db, run_id) == before


def test_poisoned_step_ready_is_recorded_and_acked(db: Database) -> None:
    client = functions_framework.create_app("advance_step", ROOT_MAIN, "cloudevent").test_client()
    for payload in ({"step_id": "not-a-uuid"}, {"nothing": 1}):
        assert client.post("/", json=push_body(payload)).status_code == 200
    bad_b64 = {"message": {"data": "!!!", "messageId": "m-2"}, "subscription": "s"}
    assert client.post("/", json=bad_b64).status_code == 200
    with db.transaction() as tx:
        rows = tx.all("SELECT source, reason FROM poisoned_messages ORDER BY id")
    assert len(rows) == 3 and all(r["source"] == "step-ready" for r in rows)
    # An unknown but well-formed step id is a no-op, not poison.
    unknown = push_body({"step_id": "00000000-0000-0000-0000-000000000000"})
    assert client.post("/", json=unknown).status_code == 200


def test_advance_step_nacks_when_the_database_is_down(db: Database, monkeypatch: Any) -> None:
    from shared.core import db as dbmod
    from shared.core.db import Database as Db
    from shared.core.db import connector_from_env

    dead = Db(connector_from_env({"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"}))
    monkeypatch.setattr(dbmod, "_database", dead)
    client = functions_framework.create_app("advance_step", ROOT_MAIN, "cloudevent").test_client()
    resp = client.post("/", json=push_body({"step_id": "00000000-0000-0000-0000-000000000000"}))
    assert resp.status_code == 500  # raised → nack → Pub/Sub redelivers


def test_sweep_entry_point_reports_json(db: Database, monkeypatch: Any) -> None:
    monkeypatch.setenv("SWEEP_BUDGET_SECONDS", "0")
    version = publish_version(db, definition(chain(1, "end")))
    run_id, (step_id,) = start_run(db, version)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'running', attempt = 1, "
            "lease_id = gen_random_uuid(), lease_expires_at = now() - interval '1 s', "
            "side_effect_started_at = now() WHERE id = :i",
            i=step_id,
        )
    client = functions_framework.create_app("sweep", ROOT_MAIN, "http").test_client()
    resp = client.post("/")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["reclaimed_failed"] == 1 and body["passes"] == 1
    assert steps_of(db, run_id)["s0"]["outcome_code"] == "OUTCOME_UNKNOWN"
