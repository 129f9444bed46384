"""Replay and retry of failed runs through the ops API (DESIGN invariants 11 and 12)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.core.db import Database
from shared.gates import credits
from shared.ops import replay
from shared.ops.errors import OpsError
from tests.ops_support import (
    Dispatched,
    JournalRow,
    bearer,
    mint,
    seed_event,
    seed_run,
    seed_scene,
)

CHAIN = [
    {"id": "a", "type": "http.request", "next": "create"},
    {"id": "create", "type": "crm.create", "next": "notify"},
    {"id": "notify", "type": "http.request"},
]
BRANCHY = [
    {"id": "a", "type": "http.request", "next": "br"},
    {"id": "br", "type": "branch", "branches": [{"when": "true", "next": "l1"}], "otherwise": "r1"},
    {"id": "l1", "type": "http.request", "next": "l2"},
    {"id": "l2", "type": "http.request"},
    {"id": "r1", "type": "http.request", "next": "r2"},
    {"id": "r2", "type": "http.request"},
]


def _steps(db: Database, run_id: str) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        rows = tx.all("SELECT * FROM workflow_steps WHERE run_id = :r", r=run_id)
    return {r["step_key"]: r for r in rows}


def _run(db: Database, run_id: str) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one("SELECT * FROM workflow_runs WHERE id = :r", r=run_id)
    assert row is not None
    return row


def _setup(db: Database, steps: list[dict[str, Any]] = CHAIN) -> dict[str, Any]:
    conn, wf, ver, event, _ = seed_scene(db, "acme", steps, "7", balance=100)
    return {
        "conn": conn,
        "wf": wf,
        "ver": ver,
        "event": event,
        "record_key": f"{conn}:contacts:7",
        "token": mint(db, "acme"),
    }


def _failed_create(db: Database, s: dict[str, Any], **kw: Any) -> str:
    return seed_run(
        db,
        "acme",
        s["wf"],
        s["ver"],
        [
            JournalRow("a", "succeeded", output={"sent": True}),
            JournalRow(
                "create",
                "failed",
                block_type="crm.create",
                outcome_code="OUTCOME_UNKNOWN",
                error="the response was lost after the create was sent",
                error_class="permanent",
            ),
        ],
        event_id=s["event"],
        record_key=s["record_key"],
        **kw,
    )


def test_replay_after_outcome_unknown_is_a_linked_run_reusing_the_lineage_key(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    s = _setup(db)
    original = _failed_create(db, s)
    before = _steps(db, original)
    r = client.post(
        f"/v1/runs/{original}/replay",
        headers=bearer(s["token"]),
        json={"reason": "checked the CRM: no contact was created"},
    )
    assert r.status_code == 201, r.get_json()
    out = r.get_json()
    new = out["run"]["id"]
    assert out["copied_steps"] == ["a"] and out["restarted_steps"] == ["create"]
    run = _run(db, new)
    assert (str(run["replay_of"]), str(run["lineage_root"])) == (original, original)
    assert run["start_key"].startswith("replay:") and run["namespace"] == "live"
    assert str(run["version_id"]) == s["ver"] and run["event_id"] == s["event"]
    steps = _steps(db, new)
    assert set(steps) == {"a", "create"}
    assert steps["a"]["status"] == "succeeded"
    assert steps["a"]["output"] == {"sent": True}
    assert steps["a"]["copied_from"] == before["a"]["id"]
    create = steps["create"]
    assert (create["status"], create["attempt"], create["side_effect_started_at"]) == (
        "pending",
        0,
        None,
    )
    assert (
        create["idempotency_key"]
        == before["create"]["idempotency_key"]
        == (f"onceflow:{original}:create")
    )
    assert dispatched.ids == [str(create["id"])]
    # The original keeps its journal as it was: it is history.
    assert _steps(db, original) == before
    assert _run(db, original)["status"] == "failed"
    with db.transaction() as tx:
        audit = tx.one("SELECT * FROM ops_audit WHERE action = 'runs.replay'")
    assert audit is not None and audit["detail"]["outcome"] == "done"
    assert audit["detail"]["body"]["reason"].startswith("checked the CRM")


def test_replay_after_retries_ran_out_and_retry_in_place(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    s = _setup(db)
    exhausted = [
        JournalRow("a", "succeeded"),
        JournalRow(
            "create",
            "failed",
            attempt=3,
            error="HTTP 503 three times",
            error_class="transient",
            outcome_code="HTTP_503",
        ),
    ]
    original = seed_run(db, "acme", s["wf"], s["ver"], exhausted, record_key=s["record_key"])
    h = bearer(s["token"])
    out = client.post(f"/v1/runs/{original}/replay", headers=h, json={}).get_json()
    assert out["restarted_steps"] == ["create"]
    assert _steps(db, out["run"]["id"])["create"]["attempt"] == 0

    # Retry: the same run reopened in place, its failed step pending with a fresh budget.
    other = seed_run(db, "acme", s["wf"], s["ver"], exhausted, dedup="every_time")
    key = _steps(db, other)["create"]["idempotency_key"]
    r = client.post(f"/v1/runs/{other}/retry", headers=h, json={"reason": "fixed the URL"})
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["restarted_steps"] == ["create"]
    run = _run(db, other)
    assert (run["status"], run["finished_at"], run["error"]) == ("running", None, None)
    create = _steps(db, other)["create"]
    assert (create["status"], create["attempt"], create["idempotency_key"]) == ("pending", 0, key)
    assert create["error"] == "HTTP 503 three times"  # kept for people
    assert str(create["id"]) in dispatched.ids
    # It has left the dead-letter list.
    dead = client.get("/v1/runs?status=failed", headers=h).get_json()["items"]
    assert other not in [d["id"] for d in dead]
    again = client.post(f"/v1/runs/{other}/retry", headers=h, json={})
    assert (again.status_code, again.get_json()["code"]) == (409, "run_not_failed")


def test_replay_after_a_permanent_error_in_a_branch_leaves_the_other_branch_untouched(
    db: Database, client: Any
) -> None:
    s = _setup(db, BRANCHY)
    original = seed_run(
        db,
        "acme",
        s["wf"],
        s["ver"],
        [
            JournalRow("a", "succeeded"),
            JournalRow("br", "succeeded", block_type="branch"),
            JournalRow("r1", "succeeded", output={"side": "right"}),
            JournalRow(
                "l1", "failed", error="HTTP 400", error_class="permanent", outcome_code="HTTP_400"
            ),
            JournalRow("r2", "succeeded", output={"side": "right", "n": 2}),
        ],
        record_key=s["record_key"],
    )
    before = _steps(db, original)
    out = client.post(f"/v1/runs/{original}/replay", headers=bearer(s["token"]), json={}).get_json()
    assert out["restarted_steps"] == ["l1"]
    steps = _steps(db, out["run"]["id"])
    for key in ("r1", "r2"):
        for col in ("status", "output", "attempt", "idempotency_key", "finished_at"):
            assert steps[key][col] == before[key][col], (key, col)
        assert steps[key]["copied_from"] == before[key]["id"]
    assert steps["l1"]["status"] == "pending" and "l2" not in steps


def test_one_ledger_charge_per_lineage_key_after_many_replays(db: Database, client: Any) -> None:
    s = _setup(db)
    original = _failed_create(db, s)
    h = bearer(s["token"])

    def execute_as_the_engine(run_id: str) -> None:
        # What the engine does for each step that runs: charge under the step's idempotency
        # key before the side effect leaves (shared.gates.credits), then (here) fail again.
        for step in _steps(db, run_id).values():
            if step["copied_from"] is None:
                credits.charge_step(
                    db,
                    tenant_id="acme",
                    lineage_key=step["idempotency_key"],
                    amount=5,
                    block_type=step["block_type"],
                    run_id=run_id,
                    step_id=str(step["id"]),
                )
        with db.transaction() as tx:
            tx.execute(
                "UPDATE workflow_steps SET status = 'failed', finished_at = now(),"
                " outcome_code = 'OUTCOME_UNKNOWN' WHERE run_id = :r"
                " AND status = 'pending'",
                r=run_id,
            )
            tx.execute(
                "UPDATE workflow_runs SET status = 'failed', finished_at = now() WHERE id = :r",
                r=run_id,
            )

    execute_as_the_engine(original)
    latest = original
    for _ in range(4):
        r = client.post(f"/v1/runs/{latest}/replay", headers=h, json={})
        assert r.status_code == 201, r.get_json()
        latest = r.get_json()["run"]["id"]
        execute_as_the_engine(latest)
    with db.transaction() as tx:
        ledger = tx.all("SELECT lineage_key, amount FROM credit_ledger ORDER BY id")
        balance = tx.scalar("SELECT credit_balance FROM tenants WHERE id = 'acme'")
    assert ledger == [
        {"lineage_key": f"onceflow:{original}:a", "amount": 5},
        {"lineage_key": f"onceflow:{original}:create", "amount": 5},
    ]
    assert balance == 100 - 10
    # Replaying a replay extends the one lineage.
    detail = client.get(f"/v1/runs/{latest}", headers=h).get_json()
    assert len(detail["lineage"]) == 5
    assert {r["id"] for r in detail["lineage"]} >= {original, latest}
    assert _run(db, latest)["lineage_root"] == _run(db, original)["lineage_root"]
    # An older run of the lineage can't be replayed a second time.
    r = client.post(f"/v1/runs/{original}/replay", headers=h, json={})
    assert (r.status_code, r.get_json()["code"]) == (409, "already_replayed")


def test_replays_are_refused_after_60_days_for_truncated_payloads_and_unfailed_runs(
    db: Database, client: Any
) -> None:
    s = _setup(db)
    h = bearer(s["token"])
    old = _failed_create(db, s, created_at=datetime.now(UTC) - timedelta(days=61))
    young = _failed_create(db, s, created_at=datetime.now(UTC) - timedelta(days=59))
    with db.transaction() as tx:  # the young one's record must not be blocked by the old one
        tx.execute("UPDATE workflow_runs SET dedup_mode = 'every_time'")
    truncated = _failed_create(db, s, payload_truncated=True)
    event_truncated = seed_event(db, "acme", s["conn"], "8", truncated=True)
    via_event = seed_run(
        db, "acme", s["wf"], s["ver"], [JournalRow("a", "failed")], event_id=event_truncated
    )
    fine = seed_run(
        db, "acme", s["wf"], s["ver"], [JournalRow("a", "succeeded")], status="succeeded"
    )
    for run_id, code in (
        (old, "replay_window_expired"),
        (truncated, "payload_truncated"),
        (via_event, "payload_truncated"),
        (fine, "run_not_failed"),
    ):
        for action in ("replay", "retry"):
            r = client.post(f"/v1/runs/{run_id}/{action}", headers=h, json={})
            assert (r.status_code, r.get_json()["code"]) == (409, code), (action, code)
            assert r.get_json()["message"]
    assert (
        "60 days" in client.post(f"/v1/runs/{old}/replay", headers=h, json={}).get_json()["message"]
    )
    assert client.post(f"/v1/runs/{young}/replay", headers=h, json={}).status_code == 201
    with db.transaction() as tx:
        refused = tx.scalar("SELECT count(*) FROM ops_audit WHERE detail->>'outcome' = 'refused'")
    assert refused == 9


@pytest.mark.parametrize("action", ["replay", "retry"])
def test_a_replay_that_would_make_two_active_runs_for_a_record_is_refused(
    db: Database, client: Any, action: str
) -> None:
    s = _setup(db)
    original = _failed_create(db, s)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_runs (tenant_id, workflow_id, version_id, start_key,"
            " record_key, dedup_mode, trigger_payload, lineage_root)"
            " VALUES ('acme', :w, :v, 'other', :rk, 'once_per_record', '{}',"
            " gen_random_uuid())",
            w=s["wf"],
            v=s["ver"],
            rk=s["record_key"],
        )
    r = client.post(f"/v1/runs/{original}/{action}", headers=bearer(s["token"]), json={})
    assert (r.status_code, r.get_json()["code"]) == (409, "already_running")
    assert r.get_json()["message"].endswith(f"then {action}")


def test_two_concurrent_replays_of_one_run_start_exactly_one(db: Database) -> None:
    s = _setup(db)
    original = _failed_create(db, s)
    barrier = threading.Barrier(2)
    results: list[str] = []

    def attempt() -> None:
        barrier.wait()
        try:
            out = replay.replay_run(
                db, run_id=original, tenant_scope="acme", dispatch=lambda ids: None
            )
            results.append(out.run_id)
        except OpsError as err:
            results.append(err.code)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r == "already_replayed" for r in results) == [False, True]
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs WHERE replay_of = :r", r=original) == 1


def test_a_run_with_a_step_still_running_is_not_replayed_or_retried(
    db: Database, client: Any
) -> None:
    s = _setup(db)
    run = _failed_create(db, s)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'running', finished_at = NULL,"
            " lease_id = gen_random_uuid(), lease_expires_at = now() + interval '1 min'"
            " WHERE run_id = :r AND step_key = 'a'",
            r=run,
        )
    for action in ("replay", "retry"):
        r = client.post(f"/v1/runs/{run}/{action}", headers=bearer(s["token"]), json={})
        assert (r.status_code, r.get_json()["code"]) == (409, "step_still_running")
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs") == 1
        assert tx.scalar("SELECT status FROM workflow_runs WHERE id = :r", r=run) == "failed"
