"""Replay, grown up (issue 30, item 1), through the ops API and the real step engine against
the fake CRM over HTTP: from a chosen middle step, on the workflow's current (fixed) version,
with an edited input; a charged CRM write before the chosen step is kept, never charged or
written again; a version lacking a step the replay needs is refused, naming the step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.core.db import Database
from shared.steps.advance import advance_step
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.ops_support import Dispatched, bearer, mint
from tests.steps_support import TENANT, definition, publish_version, start_run


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch, FakeCrmConfig(token="tok")) as server:
        yield server


def _task(conn: str, step_id: str, subject: str, then: str | None = None) -> dict[str, Any]:
    return {
        "id": step_id,
        "type": "crm.create",
        "config": {
            "object_type": "tasks",
            "connection_id": conn,
            "properties": {"hs_task_subject": subject, "hs_timestamp": "2026-12-03T10:00:00Z"},
        },
        **({"next": then} if then else {}),
    }


def _activate(db: Database, version_id: str) -> None:
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_activations (workflow_id, version_id)"
            " SELECT workflow_id, id FROM workflow_versions WHERE id = :v"
            " ON CONFLICT (workflow_id) DO UPDATE SET version_id = EXCLUDED.version_id",
            v=version_id,
        )


def _steps(db: Database, run_id: str) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        rows = tx.all("SELECT * FROM workflow_steps WHERE run_id = :r", r=run_id)
    return {r["step_key"]: r for r in rows}


def _drive(db: Database, ids: list[str]) -> str | None:
    """Advance steps until none is left to dispatch; the run's last status."""
    status = None
    while ids:
        out = advance_step(db, ids.pop(0), dispatch=ids.extend)
        status = out.run_status or status
    return status


def _failed_at_follow(db: Database, fake: FakeCrm) -> tuple[str, str, str]:
    """v1: create (charged CRM write) -> follow (charged CRM write) -> done. The create
    succeeds and pays; the follow's subject names a field the trigger lacks (a typo), so its
    config is invalid and the run fails there. (run, workflow, conn)."""
    seed_tenant(db, credits=100)
    conn = seed_connection(db, fake.url)
    v1 = publish_version(
        db,
        definition(
            [
                _task(conn, "create", "Call ${{ trigger.name }}", "follow"),
                _task(conn, "follow", "Follow up ${{ trigger.nmae }}", "done"),
                {"id": "done", "type": "end"},
            ]
        ),
    )
    _activate(db, v1)
    run_id, ids = start_run(db, v1, payload={"name": "Ada"})
    first = advance_step(db, ids.pop(0), dispatch=ids.extend)
    assert first.status == "succeeded"
    assert _drive(db, ids) == "failed"
    with db.transaction() as tx:
        wf = str(tx.scalar("SELECT workflow_id FROM workflow_runs WHERE id = :r", r=run_id))
    return run_id, wf, conn


def _fixed_v2(db: Database, wf: str, conn: str) -> str:
    """The fix: v2 spells the follow-up's expression right, and is activated."""
    v2 = publish_version(
        db,
        definition(
            [
                _task(conn, "create", "Call ${{ trigger.name }}", "follow"),
                _task(conn, "follow", "Follow up ${{ trigger.name }}", "done"),
                {"id": "done", "type": "end"},
            ]
        ),
        workflow_id=wf,
    )
    _activate(db, v2)
    return v2


def _ledger(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all("SELECT lineage_key, amount FROM credit_ledger ORDER BY lineage_key")


def test_replay_from_a_middle_step_on_the_current_version_keeps_the_charged_step_before_it(
    db: Database, fake: FakeCrm, client: Any, dispatched: Dispatched
) -> None:
    original, wf, conn = _failed_at_follow(db, fake)
    before = _steps(db, original)
    v2 = _fixed_v2(db, wf, conn)
    r = client.post(
        f"/v1/runs/{original}/replay",
        headers=bearer(mint(db, TENANT, label="ann")),
        json={"from_step": "follow", "on_version": "current", "reason": "fixed the subject"},
    )
    assert r.status_code == 201, r.get_json()
    out = r.get_json()
    assert (out["copied_steps"], out["restarted_steps"]) == (["create"], ["follow"])
    new = out["run"]["id"]
    assert out["run"]["version_id"] == v2 and out["run"]["replay_of"] == original
    assert _drive(db, list(dispatched.ids)) == "succeeded"
    steps = _steps(db, new)
    assert steps["create"]["copied_from"] == before["create"]["id"]
    assert steps["follow"]["idempotency_key"] == before["follow"]["idempotency_key"]
    # The create before the chosen step wrote once and was charged once in the lineage.
    subjects = sorted(t["properties"]["hs_task_subject"] for t in fake.records("tasks"))
    assert subjects == ["Call Ada", "Follow up Ada"]
    assert _ledger(db) == [
        {"lineage_key": f"onceflow:{original}:create", "amount": 2},
        {"lineage_key": f"onceflow:{original}:follow", "amount": 2},
    ]
    with db.transaction() as tx:
        balance = tx.scalar("SELECT credit_balance FROM tenants WHERE id = :t", t=TENANT)
    assert balance == 96
    detail = client.get(f"/v1/runs/{new}", headers=bearer(mint(db, TENANT))).get_json()
    assert (detail["replay_from"], detail["replay_by"]) == ("follow", "ann")


def test_replay_from_a_step_of_a_succeeded_run_runs_it_again_under_its_key(
    db: Database, fake: FakeCrm, client: Any, dispatched: Dispatched
) -> None:
    original, wf, conn = _failed_at_follow(db, fake)
    _fixed_v2(db, wf, conn)
    token = mint(db, TENANT)
    first = client.post(
        f"/v1/runs/{original}/replay", headers=bearer(token), json={"on_version": "current"}
    )
    assert first.status_code == 201, first.get_json()
    assert _drive(db, list(dispatched.ids)) == "succeeded"
    dispatched.ids.clear()
    second_run = first.get_json()["run"]["id"]
    # Replaying the succeeded run from `follow` repeats it under the lineage's key: the CRM
    # sees the same operation and the ledger no second charge.
    again = client.post(
        f"/v1/runs/{second_run}/replay", headers=bearer(token), json={"from_step": "follow"}
    )
    assert again.status_code == 201, again.get_json()
    assert _drive(db, list(dispatched.ids)) == "succeeded"
    assert [row["lineage_key"] for row in _ledger(db)] == [
        f"onceflow:{original}:create",
        f"onceflow:{original}:follow",
    ]


@pytest.mark.parametrize("renamed", ["follow", "create"])
def test_replay_on_a_version_lacking_a_needed_step_is_refused_naming_it(
    db: Database, fake: FakeCrm, client: Any, dispatched: Dispatched, renamed: str
) -> None:
    """`follow` is the chosen step; `create` is the step before it the replay would keep."""
    original, wf, conn = _failed_at_follow(db, fake)
    ids = {"create": "create", "follow": "follow", renamed: f"{renamed}_v2"}
    v2 = publish_version(
        db,
        definition(
            [
                _task(conn, ids["create"], "Call", ids["follow"]),
                _task(conn, ids["follow"], "Follow up", "done"),
                {"id": "done", "type": "end"},
            ]
        ),
        workflow_id=wf,
    )
    _activate(db, v2)
    r = client.post(
        f"/v1/runs/{original}/replay",
        headers=bearer(mint(db, TENANT)),
        json={"from_step": "follow", "on_version": "current"},
    )
    assert r.status_code == 422, r.get_json()
    body = r.get_json()
    assert body["code"] == "step_not_in_version" and f"step {renamed} " in body["message"]
    assert "version 2" in body["message"]
    assert dispatched.ids == []
    with db.transaction() as tx:
        runs = tx.scalar("SELECT count(*) FROM workflow_runs WHERE replay_of = :r", r=original)
    assert runs == 0


def test_replay_with_an_edited_input_runs_it_and_records_who_and_what(
    db: Database, fake: FakeCrm, client: Any, dispatched: Dispatched
) -> None:
    original, _, conn = _failed_at_follow(db, fake)
    edited = {
        "object_type": "tasks",
        "connection_id": conn,
        "properties": {"hs_task_subject": "Hand-fixed", "hs_timestamp": "2026-12-03T10:00:00Z"},
    }
    r = client.post(
        f"/v1/runs/{original}/replay",
        headers=bearer(mint(db, TENANT, label="bob")),
        json={"from_step": "follow", "input": edited, "reason": "typo in the subject"},
    )
    assert r.status_code == 201, r.get_json()
    new = r.get_json()["run"]["id"]
    assert _drive(db, list(dispatched.ids)) == "succeeded"
    subjects = sorted(t["properties"]["hs_task_subject"] for t in fake.records("tasks"))
    assert subjects == ["Call Ada", "Hand-fixed"]
    with db.transaction() as tx:
        audit = tx.one(
            "SELECT a.detail, t.label FROM ops_audit a JOIN ops_tokens t ON t.id = a.token_id"
            " WHERE a.action = 'runs.replay'"
        )
    assert audit is not None and audit["label"] == "bob"
    assert audit["detail"]["body"]["input"] == edited
    assert audit["detail"]["body"]["from_step"] == "follow"
    detail = client.get(f"/v1/runs/{new}", headers=bearer(mint(db, TENANT))).get_json()
    follow = next(s for s in detail["steps"] if s["step_key"] == "follow")
    assert (follow["input_override"], follow["input_edited_by"]) == (edited, "bob")
    client.post("/ui/login", data={"token": mint(db, TENANT)})
    page = client.get(f"/ui/runs/{new}").get_data(as_text=True)
    assert "input edited by bob" in page


def test_an_edited_input_without_a_chosen_step_is_refused(
    db: Database, fake: FakeCrm, client: Any
) -> None:
    original, _, _ = _failed_at_follow(db, fake)
    r = client.post(
        f"/v1/runs/{original}/replay", headers=bearer(mint(db, TENANT)), json={"input": {}}
    )
    assert (r.status_code, r.get_json()["code"]) == (422, "input_needs_step")
