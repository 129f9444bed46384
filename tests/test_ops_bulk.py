"""Bulk actions in the API (issue 30, item 3): `POST /v1/bulk/preview` returns a token naming
exactly the set it listed; `POST /v1/bulk/act` acts on that set once, each target audited;
acting again on the token does nothing more; another tenant's token is not found; two acts
racing on one cancel token settle every run exactly once."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

from shared.blocks.base import BlockResult
from shared.core.db import Database
from shared.steps.advance import advance_step
from tests.ops_support import (
    Dispatched,
    JournalRow,
    bearer,
    mint,
    seed_run,
    seed_tenant,
    seed_workflow,
)
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.steps_support import TENANT, chain, definition, publish_version, start_run
from tests.test_steps_engine import LEASE

STEPS = [{"id": "a", "type": "http.request"}]


def _failed(db: Database, tenant: str, wf: str, ver: str) -> str:
    return seed_run(db, tenant, wf, ver, [JournalRow("a", "failed", error="boom")])


def _running(db: Database, tenant: str, wf: str, ver: str) -> str:
    return seed_run(db, tenant, wf, ver, [JournalRow("a", "pending")], status="running")


def _count(db: Database, sql: str, **params: Any) -> int:
    with db.transaction() as tx:
        return int(tx.scalar(sql, **params))


def test_bulk_replay_previews_a_token_then_acts_on_exactly_that_set_once(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    seed_tenant(db, "acme")
    wf1, v1 = seed_workflow(db, "acme", STEPS, name="enroll")
    wf2, v2 = seed_workflow(db, "acme", STEPS, name="notify")
    mine = sorted(_failed(db, "acme", wf1, v1) for _ in range(3))
    other_wf = _failed(db, "acme", wf2, v2)
    h = bearer(mint(db, "acme", label="ann"))
    r = client.post(
        "/v1/bulk/preview",
        headers=h,
        json={"action": "replay", "workflow_id": wf1, "reason": "fixed the URL"},
    )
    assert r.status_code == 200, r.get_json()
    preview = r.get_json()
    assert preview["targets"] == mine and preview["more"] is False
    assert {run["id"] for run in preview["runs"]} == set(mine)
    assert _count(db, "SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL") == 0
    # A run failing after the preview is not in its set: what acts is what was shown.
    late = _failed(db, "acme", wf1, v1)
    act = client.post("/v1/bulk/act", headers=h, json={"token": preview["token"]})
    assert act.status_code == 200, act.get_json()
    out = act.get_json()
    assert out["repeated"] is False
    assert [(o["target"], o["ok"]) for o in out["outcomes"]] == [(t, True) for t in mine]
    replayed = _count(db, "SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL")
    assert replayed == 3 and len(dispatched.ids) == 3
    assert _count(db, "SELECT count(*) FROM workflow_runs WHERE replay_of = :r", r=late) == 0
    assert _count(db, "SELECT count(*) FROM workflow_runs WHERE replay_of = :r", r=other_wf) == 0
    with db.transaction() as tx:
        audited = tx.all(
            "SELECT target, detail FROM ops_audit WHERE action = 'runs.replay' ORDER BY target"
        )
    assert [a["target"] for a in audited] == mine
    assert {a["detail"]["bulk"] for a in audited} == {preview["token"]}
    assert {a["detail"]["reason"] for a in audited} == {"fixed the URL"}
    # Acting again on the token: the same outcomes, nothing more done.
    again = client.post("/v1/bulk/act", headers=h, json={"token": preview["token"]}).get_json()
    assert again["repeated"] is True and again["outcomes"] == out["outcomes"]
    assert _count(db, "SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL") == 3
    assert len(dispatched.ids) == 3
    assert _count(db, "SELECT count(*) FROM ops_audit WHERE action = 'runs.replay'") == 3


def test_another_tenants_token_is_refused_and_touches_nothing(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    seed_tenant(db, "acme")
    seed_tenant(db, "globex")
    wf, ver = seed_workflow(db, "acme", STEPS, name="enroll")
    gwf, gver = seed_workflow(db, "globex", STEPS, name="enroll")
    theirs = _failed(db, "globex", gwf, gver)
    _failed(db, "acme", wf, ver)
    g = client.post(
        "/v1/bulk/preview", headers=bearer(mint(db, "globex")), json={"action": "retry"}
    ).get_json()
    assert g["targets"] == [theirs]
    h = bearer(mint(db, "acme"))
    refused = client.post("/v1/bulk/act", headers=h, json={"token": g["token"]})
    assert refused.status_code == 404 and refused.get_json()["code"] == "not_found"
    with db.transaction() as tx:
        status = tx.scalar("SELECT status FROM workflow_runs WHERE id = :r", r=theirs)
    assert status == "failed" and dispatched.ids == []
    # An admin's preview (no tenant) is not a tenant's either.
    admin = client.post(
        "/v1/bulk/preview", headers=bearer(mint(db, None)), json={"action": "retry"}
    ).get_json()
    assert len(admin["targets"]) == 2
    assert client.post("/v1/bulk/act", headers=h, json={"token": admin["token"]}).status_code == 404


def test_a_bulk_cancel_needs_a_reason(db: Database, client: Any) -> None:
    seed_tenant(db, "acme")
    r = client.post("/v1/bulk/preview", headers=bearer(mint(db, "acme")), json={"action": "cancel"})
    assert (r.status_code, r.get_json()["code"]) == (422, "reason_required")


def _post(base: str, path: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={**bearer(token), "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_two_acts_racing_on_one_bulk_cancel_cancel_each_run_once(
    db: Database, ops_server: str
) -> None:
    seed_tenant(db, "acme")
    wf, ver = seed_workflow(db, "acme", STEPS, name="enroll")
    runs = sorted(_running(db, "acme", wf, ver) for _ in range(4))
    token = mint(db, "acme", label="ann")
    status, preview = _post(
        ops_server, "/v1/bulk/preview", token, {"action": "cancel", "reason": "bad rollout"}
    )
    assert status == 200 and preview["targets"] == runs
    barrier = threading.Barrier(2)
    answers: list[tuple[int, Any]] = []

    def act() -> None:
        barrier.wait()
        answers.append(_post(ops_server, "/v1/bulk/act", token, {"token": preview["token"]}))

    threads = [threading.Thread(target=act) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [a[0] for a in answers] == [200, 200]
    # One act recorded its outcomes; the other answers those (repeated). Every run is
    # cancelled, each exactly once, whichever act's statement moved it.
    assert sorted(a[1]["repeated"] for a in answers) == [False, True]
    assert answers[0][1]["outcomes"] == answers[1][1]["outcomes"]
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT status, cancelled_by, cancel_reason FROM workflow_runs WHERE id = ANY(:r)",
            r=runs,
        )
        done = tx.all(
            "SELECT target, count(*) AS n FROM ops_audit WHERE action = 'runs.cancel'"
            " AND detail->>'outcome' = 'done' GROUP BY target ORDER BY target"
        )
        stored = tx.scalar(
            "SELECT outcomes FROM ops_bulk_previews WHERE id = :b", b=preview["token"]
        )
    assert {(r["status"], r["cancelled_by"], r["cancel_reason"]) for r in rows} == {
        ("cancelled", "ann", "bad rollout")
    }
    assert [(d["target"], d["n"]) for d in done] == [(r, 1) for r in runs]
    assert len(stored) == 4


def test_a_tenant_cannot_preview_the_dead_letter_redrive(db: Database, client: Any) -> None:
    """The Pub/Sub holds are every tenant's machinery: admins only (tests/test_redrive.py
    drives the redrive itself on the emulator)."""
    seed_tenant(db, "acme")
    r = client.post(
        "/v1/bulk/preview", headers=bearer(mint(db, "acme")), json={"action": "redrive"}
    )
    assert (r.status_code, r.get_json()["code"]) == (404, "not_found")


def test_a_bulk_cancel_racing_a_settle_leaves_nothing_to_run(db: Database, client: Any) -> None:
    """A step of one of the previewed runs settles (and creates its next step) while the bulk
    cancel acts: the cancel statement is guarded, so each run ends cancelled once, and every
    step is settled (succeeded or skipped), none left pending."""
    barrier = threading.Barrier(2)

    def racing(ctx: Any, config: Any) -> BlockResult:
        barrier.wait()
        return BlockResult(output={"raced": True})

    lookup = block_lookup(Recorder(), **{"test.race": spec("test.race", racing)})
    version = publish_version(db, definition(chain(3, "test.race")))
    raced, (step_id,) = start_run(db, version)
    calm, _ = start_run(db, version)
    h = bearer(mint(db, TENANT, label="ann"))
    preview = client.post(
        "/v1/bulk/preview", headers=h, json={"action": "cancel", "reason": "bad rollout"}
    ).get_json()
    assert preview["targets"] == sorted([raced, calm])
    advancing = threading.Thread(
        target=lambda: advance_step(
            db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE
        )
    )
    advancing.start()
    barrier.wait()
    out = client.post("/v1/bulk/act", headers=h, json={"token": preview["token"]}).get_json()
    advancing.join(30)
    assert [(o["target"], o["ok"]) for o in out["outcomes"]] == [
        (t, True) for t in preview["targets"]
    ]
    with db.transaction() as tx:
        runs = tx.all("SELECT status FROM workflow_runs WHERE id = ANY(:r)", r=[raced, calm])
        left = tx.all(
            "SELECT step_key, status FROM workflow_steps WHERE run_id = ANY(:r)"
            " AND status NOT IN ('succeeded', 'skipped')",
            r=[raced, calm],
        )
    assert {r["status"] for r in runs} == {"cancelled"} and left == []
    assert _count(db, "SELECT count(*) FROM ops_audit WHERE action = 'runs.cancel'") == 2
