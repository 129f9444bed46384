"""Bulk actions from the page, through the API's bulk routes: a preview that lists how many and
which and carries a token naming them, then a CSRF-checked confirmation of that token that acts
on exactly those, each audited, harmless when repeated, and blind to other tenants' runs, inbox
rows and tokens."""

from __future__ import annotations

import re
from typing import Any

from shared.core.db import Database
from shared.ingest import inbox
from shared.ops.html import csrf_value
from tests.ingest_support import hubspot_body, hubspot_event, make_connection
from tests.ops_support import (
    Dispatched,
    JournalRow,
    mint,
    seed_run,
    seed_tenant,
    seed_workflow,
)

STEPS = [{"id": "a", "type": "http.request"}]
TARGET = re.compile(r'<tr data-run-id="([^"]+)">')
INBOX_ROW = re.compile(r"<tr><td>#(\d+)</td>")
TOKEN = re.compile(r'<input type="hidden" name="token" value="([^"]+)">')


def _failed(db: Database, tenant: str, wf: str, ver: str) -> str:
    return seed_run(db, tenant, wf, ver, [JournalRow("a", "failed", error="boom")])


def _replays(db: Database) -> int:
    with db.transaction() as tx:
        return int(tx.scalar("SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL"))


def test_bulk_replay_previews_then_replays_exactly_what_it_listed(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    seed_tenant(db, "acme")
    wf1, v1 = seed_workflow(db, "acme", STEPS, name="enroll")
    wf2, v2 = seed_workflow(db, "acme", STEPS, name="notify")
    mine = {_failed(db, "acme", wf1, v1) for _ in range(3)}
    other_wf = _failed(db, "acme", wf2, v2)
    seed_tenant(db, "globex")
    gwf, gv = seed_workflow(db, "globex", STEPS, name="enroll")
    theirs = _failed(db, "globex", gwf, gv)
    token = mint(db, "acme")
    client.post("/ui/login", data={"token": token})

    runs = client.get("/ui/runs", query_string={"status": "failed", "workflow_id": wf1})
    assert "Replay all…" in runs.get_data(as_text=True)
    preview = client.get("/ui/bulk", query_string={"action": "replay", "workflow_id": wf1})
    html = preview.get_data(as_text=True)
    assert preview.status_code == 200 and "<b>3</b> failed run(s) will be affected" in html
    assert set(TARGET.findall(html)) == mine and other_wf not in html and theirs not in html
    assert _replays(db) == 0  # a preview changes nothing

    (bulk_token,) = TOKEN.findall(html)
    confirm = {"action": "replay", "csrf": csrf_value(token), "token": bulk_token}
    assert client.post("/ui/bulk", data={**confirm, "csrf": "forged"}).status_code == 403
    assert _replays(db) == 0
    done = client.post("/ui/bulk", data=confirm).get_data(as_text=True)
    assert "3 of 3 replayed; 0 refused." in done
    assert _replays(db) == 3 and len(dispatched.ids) == 3
    with db.transaction() as tx:
        audited = tx.all(
            "SELECT target, detail->>'outcome' AS outcome FROM ops_audit"
            " WHERE action = 'runs.replay'"
        )
    assert {(a["target"], a["outcome"]) for a in audited} == {(r, "done") for r in mine}
    # Again: the token was acted on; its outcomes are shown and nothing new starts.
    again = client.post("/ui/bulk", data=confirm).get_data(as_text=True)
    assert "3 of 3 replayed; 0 refused." in again and _replays(db) == 3
    assert len(dispatched.ids) == 3
    # Another tenant's token is not found: nothing of theirs is touched.
    client.post("/ui/login", data={"token": mint(db, "globex")})
    g_html = client.get("/ui/bulk", query_string={"action": "replay"}).get_data(as_text=True)
    assert set(TARGET.findall(g_html)) == {theirs}
    (their_token,) = TOKEN.findall(g_html)
    client.post("/ui/login", data={"token": token})
    forged = client.post("/ui/bulk", data={**confirm, "token": their_token})
    assert forged.status_code == 404 and _replays(db) == 3
    assert client.get("/ui/bulk", query_string={"action": "explode"}).status_code == 404


def _dead_row(db: Database, tenant: str, n: int) -> int:
    conn = make_connection(db, tenant_id=tenant, secret_env=f"HUBSPOT_SECRET_{tenant.upper()}")
    with db.transaction() as tx:
        row = inbox.store(tx, conn, hubspot_body(hubspot_event(n)), {}).inbox_id
        tx.execute(
            "UPDATE webhook_inbox SET status = 'dead', finished_at = now(), attempts = 5,"
            " last_error = 'provider down' WHERE id = :i",
            i=row,
        )
    return row


def test_bulk_requeue_of_dead_inbox_rows(db: Database, client: Any) -> None:
    mine = {_dead_row(db, "acme", 1), _dead_row(db, "acme", 2)}
    theirs = _dead_row(db, "globex", 3)
    token = mint(db, "acme")
    client.post("/ui/login", data={"token": token})
    html = client.get("/ui/bulk", query_string={"action": "requeue_inbox"}).get_data(as_text=True)
    assert "<b>2</b> dead inbox row(s)" in html
    assert {int(t) for t in INBOX_ROW.findall(html)} == mine
    (bulk_token,) = TOKEN.findall(html)
    confirm = {"action": "requeue_inbox", "csrf": csrf_value(token), "token": bulk_token}
    done = client.post("/ui/bulk", data=confirm).get_data(as_text=True)
    assert "2 of 2 requeued; 0 refused." in done
    with db.transaction() as tx:
        status = {r["id"]: r["status"] for r in tx.all("SELECT id, status FROM webhook_inbox")}
    assert {status[i] for i in mine} == {"pending"} and status[theirs] == "dead"
    # Confirming again shows the first outcomes and requeues nothing more.
    with db.transaction() as tx:
        tx.execute(
            "UPDATE webhook_inbox SET status = 'dead', finished_at = now() WHERE id = ANY(:i)",
            i=list(mine),
        )
    again = client.post("/ui/bulk", data=confirm).get_data(as_text=True)
    assert "2 of 2 requeued" in again
    with db.transaction() as tx:
        status = {r["id"]: r["status"] for r in tx.all("SELECT id, status FROM webhook_inbox")}
    assert {status[i] for i in mine} == {"dead"}


def test_bulk_cancel_from_the_runs_page_previews_then_cancels_once(
    db: Database, client: Any
) -> None:
    seed_tenant(db, "acme")
    wf, ver = seed_workflow(db, "acme", STEPS, name="enroll")
    running = {
        seed_run(db, "acme", wf, ver, [JournalRow("a", "pending")], status="running")
        for _ in range(2)
    }
    token = mint(db, "acme", label="ann")
    client.post("/ui/login", data={"token": token})
    runs = client.get("/ui/runs", query_string={"status": "running"}).get_data(as_text=True)
    assert "Cancel all…" in runs
    html = client.get("/ui/bulk", query_string={"action": "cancel"}).get_data(as_text=True)
    assert "<b>2</b> running run(s) will be affected" in html
    assert set(TARGET.findall(html)) == running
    (bulk_token,) = TOKEN.findall(html)
    confirm = {"action": "cancel", "csrf": csrf_value(token), "token": bulk_token}
    assert "2 of 2 cancelled" in client.post("/ui/bulk", data=confirm).get_data(as_text=True)
    assert "2 of 2 cancelled" in client.post("/ui/bulk", data=confirm).get_data(as_text=True)
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT status, cancelled_by FROM workflow_runs WHERE id = ANY(:r)", r=list(running)
        )
        audited = tx.scalar("SELECT count(*) FROM ops_audit WHERE action = 'runs.cancel'")
    assert {(r["status"], r["cancelled_by"]) for r in rows} == {("cancelled", "ann")}
    assert audited == 2
