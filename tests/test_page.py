"""The page for people: sign-in, search, a record's timeline in plain words, replay, the runs
page with filters and a run's steps, from real clicks in headless Chromium (Debian's
`chromium`, driven by playwright; no browser download). Screenshots are kept in
$ONCEFLOW_TEST_OUTPUT (docs/screenshots holds the ones the README shows)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.core.db import Database
from shared.ops.html import csrf_value
from shared.ops.page import COOKIE
from tests.ops_support import (
    Dispatched,
    JournalRow,
    mint,
    seed_connection,
    seed_event,
    seed_run,
    seed_tenant,
    seed_workflow,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHAIN = [
    {"id": "a", "type": "http.request", "next": "create"},
    {"id": "create", "type": "crm.create"},
]


def _failed_create_run(
    db: Database,
    tenant: str,
    workflow: tuple[str, str],
    *,
    event_id: int,
    record_key: str,
    outcome_code: str,
    error: str,
    detail: str,
) -> str:
    """A run of CHAIN whose `a` succeeded and whose `create` failed for good."""
    failed = JournalRow(
        "create",
        "failed",
        block_type="crm.create",
        outcome_code=outcome_code,
        error=error,
        error_class="permanent",
        output={"detail": detail},
    )
    return seed_run(
        db,
        tenant,
        *workflow,
        [JournalRow("a", "succeeded"), failed],
        event_id=event_id,
        record_key=record_key,
    )


def _story(db: Database) -> dict[str, Any]:
    """A lead with one failed run (OUTCOME_UNKNOWN) and one refused re-announcement."""
    seed_tenant(db, "acme")
    conn = seed_connection(db, "acme")
    wf, ver = seed_workflow(db, "acme", CHAIN, name="enroll-new-lead")
    first = seed_event(db, "acme", conn, "4242")
    second = seed_event(db, "acme", conn, "4242", event_type="hubspot.contact.created")
    record_key = f"{conn}:contacts:4242"
    run = _failed_create_run(
        db,
        "acme",
        (wf, ver),
        event_id=first,
        record_key=record_key,
        outcome_code="OUTCOME_UNKNOWN",
        error="the create's response was lost",
        detail="the response was lost after the request was sent",
    )
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO admission_refusals (tenant_id, event_id, workflow_id, version_id,"
            " record_key, reason, detail) VALUES ('acme', :e, :w, :v, :rk, 'duplicate',"
            " 'record already enrolled')",
            e=second,
            w=wf,
            v=ver,
            rk=record_key,
        )
    return {
        "record_key": record_key,
        "run": run,
        "workflow": wf,
        "version": ver,
        "token": mint(db, "acme", label="support"),
    }


def test_the_page_needs_a_token_cookie_and_forms_need_the_csrf_value(
    db: Database, client: Any
) -> None:
    s = _story(db)
    assert client.get("/ui").status_code == 303
    assert client.get("/ui").headers["Location"].endswith("/ui/login")
    assert client.post("/ui/login", data={"token": "ofo_wrong"}).status_code == 401
    signed_in = client.post("/ui/login", data={"token": s["token"]})
    assert signed_in.status_code == 303
    landing = client.get("/ui").get_data(as_text=True)
    assert "Failed runs" in landing and s["run"] in landing  # the dead-letter list
    cookie = signed_in.headers["Set-Cookie"]
    assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Path=/ui" in cookie
    page = client.get("/ui", query_string={"record_key": s["record_key"]})
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "already went through this workflow once" in html  # the refusal, in plain words
    assert "OUTCOME_UNKNOWN" in html and "Replay this run" in html
    # A replay form without the CSRF value is refused and starts nothing.
    forged = client.post(f"/ui/runs/{s['run']}/replay", data={"record_key": s["record_key"]})
    assert forged.status_code == 403
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs") == 1
    ok = client.post(
        f"/ui/runs/{s['run']}/replay",
        data={"record_key": s["record_key"], "csrf": csrf_value(s["token"])},
    )
    assert ok.status_code == 303 and "replayed=" in ok.headers["Location"]
    # Another tenant's token sees nothing of this record.
    seed_tenant(db, "globex")
    client.post("/ui/login", data={"token": mint(db, "globex")})
    other = client.get("/ui", query_string={"record_key": s["record_key"]})
    assert "No record of your connections matches that" in other.get_data(as_text=True)
    assert s["run"] not in other.get_data(as_text=True)


def test_the_page_in_chromium_search_timeline_and_a_real_replay_click(
    db: Database, ops_server: str, dispatched: Dispatched, tmp_path: Path
) -> None:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian chromium: `make test` installs it (make browser)")
        pytest.skip(
            "Debian chromium is not installed (apt-get install -y chromium); "
            "this test never downloads a browser"
        )
    from playwright.sync_api import sync_playwright

    s = _story(db)
    out_dir = Path(os.environ.get("ONCEFLOW_TEST_OUTPUT", str(tmp_path)))
    out_dir.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1200, "height": 900},
        )
        try:
            page = browser.new_page()
            page.goto(f"{ops_server}/ui", wait_until="load")
            assert page.url.endswith("/ui/login")
            page.fill("input[name=token]", s["token"])
            page.click("button[type=submit]")
            page.wait_for_url(f"{ops_server}/ui")
            page.fill("input[name=q]", "4242")  # an object id, as people search
            page.click("text=Search record")
            page.wait_for_selector("ol.timeline")
            timeline = page.inner_text("ol.timeline")
            assert "did not run" in timeline and "already went through" in timeline
            assert "ran" in timeline
            run_card = page.inner_text(f"section[data-run-id='{s['run']}']")
            assert "OUTCOME_UNKNOWN" in run_card and "failed" in run_card
            page.click(f"section[data-run-id='{s['run']}'] button.replay")
            page.wait_for_selector("p.notice")
            notice = page.inner_text("p.notice")
            assert notice.startswith("Replay started")
            shot = out_dir / "ops-page-after-replay.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"\nscreenshot: {shot}")
            with db.transaction() as tx:
                replay = tx.one(
                    "SELECT id, status FROM workflow_runs WHERE replay_of = :r", r=s["run"]
                )
            assert replay is not None and replay["status"] == "running"
            assert str(replay["id"]) in notice
            # The new run is on the page, linked to the original, and the button is gone.
            card = page.inner_text(f"section[data-run-id='{replay['id']}']")
            assert "replay of" in card and "pending" in card
            assert page.query_selector(f"section[data-run-id='{s['run']}'] button.replay") is None
            assert len(dispatched.ids) == 1
            # The runs page: filter to failed runs of this workflow, open one, unfold its
            # step's output.
            page.click("header nav >> text=Runs")
            page.wait_for_url(f"{ops_server}/ui/runs")
            page.select_option("select[name=status]", "failed")
            page.select_option("select[name=workflow_id]", label="enroll-new-lead")
            page.click("form.filters button[type=submit]")
            page.wait_for_url("**/ui/runs?**status=failed**")
            listed = page.query_selector_all("table.runs tbody tr")
            assert [r.get_attribute("data-run-id") for r in listed] == [s["run"]]
            assert "v1" in page.inner_text("div.versions")
            page.click(f"tr[data-run-id='{s['run']}'] a.open-run")
            page.wait_for_url(f"{ops_server}/ui/runs/{s['run']}")
            page.click("tr[data-step-key='create'] details.output summary")
            assert "lost" in page.inner_text("tr[data-step-key='create'] details.output pre")
            assert "OUTCOME_UNKNOWN" in page.inner_text("section.steps")
            run_shot = out_dir / "ops-run-page.png"
            page.screenshot(path=str(run_shot), full_page=True)
            print(f"screenshot: {run_shot}")
            # Bulk replay with a preview: one more failed run appears; "Replay all…" lists
            # both, and confirming replays the new one and refuses the one already replayed.
            extra = seed_run(db, "acme", s["workflow"], s["version"], [JournalRow("a", "failed")])
            page.click("header nav >> text=Failed runs")
            page.wait_for_url("**/ui/runs?status=failed")
            page.click("form.bulk button[value=replay]")
            page.wait_for_selector("div.bulk-preview")
            assert "2 failed run(s) will be affected" in page.inner_text("p.bulk-count")
            page.screenshot(path=str(out_dir / "ops-bulk-preview.png"), full_page=True)
            page.click("button.confirm")
            page.wait_for_selector("div.bulk-results")
            assert page.inner_text("p.bulk-summary") == "1 of 2 replayed; 1 refused."
            assert "ok" in (page.get_attribute(f"tr[data-target='{extra}']", "class") or "")
            page.screenshot(path=str(out_dir / "ops-bulk-done.png"), full_page=True)
            assert len(dispatched.ids) == 2
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000 and run_shot.stat().st_size > 10_000
    shutil.rmtree(profile, ignore_errors=True)


def test_the_page_in_chromium_rejects_an_approval_then_cancels_its_run(
    db: Database, ops_server: str, dispatched: Dispatched, tmp_path: Path
) -> None:
    """Real clicks: the nav's Approvals, a comment and the Reject button (a `formaction` on the
    one form), then the run page's what-it-waits-for and its Cancel form."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    from shared.steps import parks
    from tests.steps_support import TENANT, run_row
    from tests.test_approvals import _parked

    run_id, park_id, _, _ = _parked(db)
    token = mint(db, TENANT, label="carol", roles=("manager",))
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_FLAGS
        )
        try:
            page = browser.new_page()
            page.goto(f"{ops_server}/ui/login", wait_until="load")
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            page.wait_for_url(f"{ops_server}/ui")
            page.click("header nav >> text=Approvals")
            page.wait_for_url(f"{ops_server}/ui/approvals")
            approval = f"div[data-approval-id='{park_id}']"
            assert "20% discount on deal 7" in page.inner_text(approval)
            page.fill(f"{approval} input[name=comment]", "margin too thin")
            page.click(f"{approval} button.reject")
            page.wait_for_selector("p.notice")
            assert page.inner_text("p.notice") == f"Rejected: run {run_id}, step gate."
            with db.transaction() as tx:
                park = parks.park_row(tx, park_id)
            assert park is not None
            assert (park["decision"], park["decision_comment"]) == ("rejected", "margin too thin")
            page.goto(f"{ops_server}/ui/runs/{run_id}", wait_until="load")
            assert "resumed by decision" in page.inner_text(f"div[data-park-id='{park_id}']")
            page.fill("form.cancel input[name=reason]", "deal lost")
            page.click("form.cancel button")
            page.wait_for_selector("p.notice")
            assert page.inner_text("p.notice").startswith("Run cancelled; skipped: gate")
            assert run_row(db, run_id)["status"] == "cancelled"
        finally:
            browser.close()
    shutil.rmtree(profile, ignore_errors=True)


PHONE = {"width": 390, "height": 844}


def test_the_run_and_approvals_pages_fit_a_phone(
    db: Database, ops_server: str, dispatched: Dispatched, tmp_path: Path
) -> None:
    """At a phone's width nothing pushes the page sideways: a long unbroken error wraps, and
    the approval's Reject button is on screen without scrolling sideways."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    from tests.steps_support import TENANT
    from tests.test_approvals import _parked

    _run_id, park_id, _, _ = _parked(db)
    token = mint(db, TENANT, label="carol", roles=("manager",))
    conn = seed_connection(db, TENANT)
    wf, ver = seed_workflow(db, TENANT, CHAIN, name="long-errors")
    event = seed_event(db, TENANT, conn, "77")
    failing = _failed_create_run(
        db,
        TENANT,
        (wf, ver),
        event_id=event,
        record_key=f"{conn}:contacts:77",
        outcome_code="VALIDATION_ERROR",
        error="PROPERTY_DOESNT_EXIST:" + "hs_x_" * 120,
        detail="https://api.hubapi.com/crm/v3/objects/" + "a" * 300,
    )
    out_dir = Path(os.environ.get("ONCEFLOW_TEST_OUTPUT", tmp_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=CHROMIUM_FLAGS, viewport=PHONE
        )
        try:
            page = browser.new_page()
            page.goto(f"{ops_server}/ui/login", wait_until="load")
            page.fill("input[name=token]", token)
            page.click("button[type=submit]")
            page.wait_for_url(f"{ops_server}/ui")

            def sideways() -> int:
                return int(
                    page.evaluate(
                        "document.documentElement.scrollWidth"
                        " - document.documentElement.clientWidth"
                    )
                )

            page.goto(f"{ops_server}/ui/approvals", wait_until="load")
            page.screenshot(path=str(out_dir / "ops-approvals-phone.png"), full_page=True)
            reject = page.locator(f"div[data-approval-id='{park_id}'] button.reject")
            box = reject.bounding_box()
            assert box is not None
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
            assert sideways() <= 0
            page.goto(f"{ops_server}/ui/runs/{failing}", wait_until="load")
            page.screenshot(path=str(out_dir / "ops-run-phone.png"), full_page=True)
            assert "PROPERTY_DOESNT_EXIST" in page.inner_text("body")
            assert sideways() <= 0
        finally:
            browser.close()
    shutil.rmtree(profile, ignore_errors=True)
