"""The runs page (filters by workflow, status, record, time range and event type; paging) and a
run's page (steps with input and output, collapsed and size-capped, and every attempt), served
by the real `ops` entry point from autoescaped templates."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.core.db import Database
from shared.ops.html import MAX_JSON_SHOWN
from tests.ops_support import (
    JournalRow,
    mint,
    seed_connection,
    seed_event,
    seed_run,
    seed_tenant,
    seed_workflow,
)

STEPS = [{"id": "a", "type": "http.request"}]
RUN_ROW = re.compile(r'<tr data-run-id="([0-9a-f-]{36})">')


def _shown(client: Any, **query: str) -> list[str]:
    page = client.get("/ui/runs", query_string=query)
    assert page.status_code == 200
    return RUN_ROW.findall(page.get_data(as_text=True))


def test_runs_page_filters_by_workflow_status_record_time_and_event_type(
    db: Database, client: Any
) -> None:
    seed_tenant(db, "acme")
    conn = seed_connection(db, "acme")
    wf1, v1 = seed_workflow(db, "acme", STEPS, name="enroll")
    wf2, v2 = seed_workflow(db, "acme", STEPS, name="notify")
    created = seed_event(db, "acme", conn, "1", event_type="hubspot.contact.created")
    changed = seed_event(db, "acme", conn, "2", event_type="hubspot.contact.property_changed")
    old = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    ok = [JournalRow("a", "succeeded")]
    bad = [JournalRow("a", "failed", error="boom")]
    r1 = seed_run(db, "acme", wf1, v1, bad, event_id=created, record_key=f"{conn}:contact:1")
    r2 = seed_run(db, "acme", wf1, v1, ok, status="succeeded", event_id=changed)
    r3 = seed_run(db, "acme", wf2, v2, bad, event_id=changed, record_key=f"{conn}:contact:2")
    r4 = seed_run(db, "acme", wf2, v2, bad, created_at=old)
    seed_tenant(db, "globex")
    gwf, gv = seed_workflow(db, "globex", STEPS, name="enroll")
    theirs = seed_run(db, "globex", gwf, gv, bad)
    client.post("/ui/login", data={"token": mint(db, "acme")})

    assert sorted(_shown(client)) == sorted([r1, r2, r3, r4])
    assert sorted(_shown(client, status="failed")) == sorted([r1, r3, r4])
    assert _shown(client, status="failed", workflow_id=wf1) == [r1]
    assert _shown(client, record_key=f"{conn}:contact:2") == [r3]
    assert sorted(_shown(client, event_type="hubspot.contact.property_changed")) == sorted([r2, r3])
    # datetime-local inputs (no zone, read as UTC) bound the time range.
    assert _shown(client, created_before="2026-02-01T00:00") == [r4]
    assert r4 not in _shown(client, created_after="2026-02-01T00:00")
    # The other tenant's run is never listed, even when its workflow is named.
    assert theirs not in _shown(client) and _shown(client, workflow_id=gwf) == []
    # A filter that is not valid is said so, not a 500, and nothing is hidden by it.
    page = client.get("/ui/runs", query_string={"status": "exploded", "event_type": "<b>"})
    assert page.status_code == 200
    assert "These filters are not valid: status, event_type." in page.get_data(as_text=True)
    # Choosing a workflow shows its versions.
    html = client.get("/ui/runs", query_string={"workflow_id": wf1}).get_data(as_text=True)
    assert "Versions of enroll" in html and "v1" in html


def test_runs_page_pages_through_every_run_once(db: Database, client: Any) -> None:
    seed_tenant(db, "acme")
    wf, v = seed_workflow(db, "acme", STEPS)
    base = datetime(2026, 3, 1, tzinfo=UTC)
    ids = {
        seed_run(db, "acme", wf, v, [], status="succeeded", created_at=base + timedelta(minutes=i))
        for i in range(30)
    }
    client.post("/ui/login", data={"token": mint(db, "acme")})
    seen: list[str] = []
    url = "/ui/runs?limit=25&status=succeeded"
    pages = 0
    while url:
        html = client.get(url).get_data(as_text=True)
        seen += RUN_ROW.findall(html)
        pages += 1
        nxt = re.search(r'class="next-page" href="([^"]+)"', html)
        url = nxt[1].replace("&amp;", "&") if nxt else ""
        assert "status=succeeded" in url or not url  # the filters travel with the cursor
    assert pages == 2 and len(seen) == 30 and set(seen) == ids


def test_run_page_shows_escaped_capped_input_output_and_every_attempt(
    db: Database, client: Any
) -> None:
    seed_tenant(db, "acme")
    wf, v = seed_workflow(db, "acme", STEPS, name="enroll")
    run = seed_run(
        db,
        "acme",
        wf,
        v,
        [
            JournalRow(
                "a",
                "failed",
                error="HTTP 500 <script>alert(1)</script>",
                outcome_code="HTTP_500",
                attempt=2,
                output={"note": "<script>alert(2)</script>", "big": "x" * (MAX_JSON_SHOWN * 2)},
            )
        ],
    )
    with db.transaction() as tx:
        step = tx.scalar("SELECT id FROM workflow_steps WHERE run_id = :r", r=run)
        tx.execute(
            "UPDATE workflow_steps SET input = CAST(:i AS jsonb) WHERE id = :s",
            i=json.dumps({"url": "https://example.com/hook"}),
            s=step,
        )
        for attempt, kind, status, err in (
            (1, "reclaimed", "pending", None),
            (2, "settled", "failed", "HTTP 500 from the hook"),
        ):
            tx.execute(
                "INSERT INTO workflow_step_leases (lease_id, step_id, attempt, end_kind,"
                " end_status, error, ended_at) VALUES (:l, :s, :a, :k, :st, :e, now())",
                l=str(uuid.uuid4()),
                s=step,
                a=attempt,
                k=kind,
                st=status,
                e=err,
            )
    client.post("/ui/login", data={"token": mint(db, "acme")})
    page = client.get(f"/ui/runs/{run}")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "Content-Security-Policy" in page.headers and "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<details class="input">' in html and "https://example.com/hook" in html
    assert '<details class="output">' in html and "more bytes not shown" in html
    assert "x" * (MAX_JSON_SHOWN * 2) not in html  # capped
    assert "#1" in html and "reclaimed → pending" in html
    assert "#2" in html and "HTTP 500 from the hook" in html
    assert "Replay this run" in html
    # The picture: the graph inline as SVG (no script, nothing fetched), its node failed.
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="run-picture"' in html
    assert '<g class="node" data-node="a" data-status="failed">' in html
    # Another tenant's token: the same 404 as an unknown run.
    seed_tenant(db, "globex")
    client.post("/ui/login", data={"token": mint(db, "globex")})
    assert client.get(f"/ui/runs/{run}").status_code == 404
    assert client.get(f"/ui/runs/{uuid.uuid4()}").status_code == 404
    assert client.get("/ui/runs/not-a-uuid").status_code == 404


def test_run_page_says_a_run_is_compensating_and_offers_no_cancel(
    db: Database, client: Any
) -> None:
    seed_tenant(db, "acme")
    wf, v = seed_workflow(db, "acme", STEPS, name="undo")
    run = seed_run(
        db,
        "acme",
        wf,
        v,
        [
            JournalRow("a", "succeeded"),
            JournalRow("compensate:a", "pending", block_type="crm.update", node_id="a"),
        ],
        status="running",
    )
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_runs SET phase = 'compensating' WHERE id = :r", r=run)
    client.post("/ui/login", data={"token": mint(db, "acme")})
    page = client.get(f"/ui/runs/{run}").get_data(as_text=True)
    assert "undoing the steps that declare <code>compensate:</code>" in page
    assert "compensate:a" in page
    assert "Cancel run" not in page
