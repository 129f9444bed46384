"""The page's cancel form on a running run, what a parked step waits for and until when, and the
pending approvals with approve / reject: each posts (CSRF-checked) through the API's own route
(`runs.cancel`, `approvals.approve`, `approvals.reject`), answers as a notice ("already ... by X
at T" included), and is blind to other tenants' runs and approvals (404)."""

from __future__ import annotations

import re
from typing import Any

from shared.core.db import Database
from shared.ops.html import csrf_value
from shared.steps import parks
from tests.ops_support import (
    Dispatched,
    mint,
    seed_tenant,
)
from tests.steps_support import TENANT, definition, publish_version, run_row, start_run
from tests.steps_support import steps_of as steps
from tests.test_approvals import _parked
from tests.test_cancel import DELAYED
from tests.test_steps_engine import make_past

APPROVAL = re.compile(r'data-approval-id="(\d+)"')


def _signed_in(client: Any, token: str) -> Any:
    """Another browser (its own cookie jar) on the same app."""
    other = client.application.test_client()
    other.post("/ui/login", data={"token": token})
    return other


def test_cancel_from_the_run_page_says_who_and_refuses_forged_empty_and_foreign_posts(
    db: Database, client: Any
) -> None:
    run_id, _ = start_run(db, publish_version(db, definition(DELAYED)))
    token = mint(db, TENANT, label="carol")
    seed_tenant(db, "globex")
    theirs = mint(db, "globex", label="mallory")
    client.post("/ui/login", data={"token": token})
    url = f"/ui/runs/{run_id}/cancel"

    html = client.get(f"/ui/runs/{run_id}").get_data(as_text=True)
    assert f'action="{url}"' in html and "Cancel run" in html
    forged = client.post(url, data={"csrf": "forged", "reason": "x"})
    assert forged.status_code == 403
    empty = client.post(url, data={"csrf": csrf_value(token), "reason": "  "})
    assert empty.status_code == 422 and "Cancel refused: say why" in empty.get_data(as_text=True)
    foreign = _signed_in(client, theirs).post(
        url, data={"csrf": csrf_value(theirs), "reason": "not yours"}
    )
    assert foreign.status_code == 404 and run_id not in foreign.get_data(as_text=True)
    assert run_row(db, run_id)["status"] == "running"  # none of those changed anything

    done = client.post(url, data={"csrf": csrf_value(token), "reason": "customer <asked>"})
    html = done.get_data(as_text=True)
    assert done.status_code == 200 and "Run cancelled; skipped: s0." in html
    assert "Cancel run" not in html  # a cancelled run offers no cancel
    run = run_row(db, run_id)
    assert run["status"] == "cancelled"
    assert (run["cancelled_by"], run["cancel_reason"]) == ("carol", "customer <asked>")
    assert steps(db, run_id)["s0"]["status"] == "skipped"

    again = client.post(url, data={"csrf": csrf_value(token), "reason": "me too"})
    assert again.status_code == 409
    assert "Cancel refused: already cancelled by carol at " in again.get_data(as_text=True)
    with db.transaction() as tx:
        outcomes = tx.all(
            "SELECT detail->>'outcome' AS o FROM ops_audit"
            " WHERE action = 'runs.cancel' AND target = :r ORDER BY id",
            r=run_id,
        )
    assert [o["o"] for o in outcomes] == ["refused", "done", "refused"]


def test_pending_approvals_are_listed_to_deciders_and_decided_once_from_the_page(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    run_id, park_id, _, _ = _parked(db)
    manager = mint(db, TENANT, label="carol", roles=("manager",))
    outsider = mint(db, TENANT, label="dave")
    seed_tenant(db, "globex")
    theirs = mint(db, "globex", label="mallory", roles=("manager",))
    client.post("/ui/login", data={"token": manager})
    dave = _signed_in(client, outsider)

    # The run card says what the gate waits for, and until when.
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None
    card = client.get(f"/ui/runs/{run_id}").get_data(as_text=True)
    assert f'data-park-id="{park_id}"' in card
    assert "by role manager or erin: 20% discount on deal 7" in card
    until = f"{park['deadline']:%Y-%m-%d %H:%M:%S %Z}"
    assert f'<span class="until">until {until}</span>, then reject' in card

    listed = client.get("/ui/approvals").get_data(as_text=True)
    assert APPROVAL.findall(listed) == [str(park_id)] and "20% discount on deal 7" in listed
    assert APPROVAL.findall(dave.get("/ui/approvals").get_data(as_text=True)) == []
    other = _signed_in(client, theirs)
    assert APPROVAL.findall(other.get("/ui/approvals").get_data(as_text=True)) == []

    url = f"/ui/approvals/{park_id}"
    assert client.post(f"{url}/approve", data={"csrf": "forged"}).status_code == 403
    refused = dave.post(f"{url}/approve", data={"csrf": csrf_value(outsider)})
    assert refused.status_code == 403
    assert "only role manager or user erin may decide" in refused.get_data(as_text=True)
    foreign = other.post(f"{url}/reject", data={"csrf": csrf_value(theirs)})
    assert foreign.status_code == 404
    with db.transaction() as tx:
        assert parks.park_row(tx, park_id)["resumed_at"] is None  # type: ignore[index]
    assert dispatched.ids == []

    done = client.post(f"{url}/approve", data={"csrf": csrf_value(manager), "comment": "ok"})
    html = done.get_data(as_text=True)
    assert done.status_code == 200 and f"Approved: run {run_id}, step gate." in html
    assert APPROVAL.findall(html) == []  # no longer pending
    assert dispatched.ids == [str(steps(db, run_id)["gate"]["id"])]
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None
    assert (park["decision"], park["decided_by"], park["decision_comment"]) == (
        "approved",
        "carol",
        "ok",
    )
    again = client.post(f"{url}/reject", data={"csrf": csrf_value(manager)})
    assert again.status_code == 409
    assert "Decision refused: already decided by carol at " in again.get_data(as_text=True)
    card = client.get(f"/ui/runs/{run_id}").get_data(as_text=True)
    assert "resumed by decision at " in card and ": approved by carol (ok)" in card


def test_an_expired_approval_is_refused_from_the_page_saying_when_it_expired(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    run_id, park_id, _, _ = _parked(db)
    manager = mint(db, TENANT, label="carol", roles=("manager",))
    client.post("/ui/login", data={"token": manager})
    make_past(db, run_id)
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None
    done = client.post(
        f"/ui/approvals/{park_id}/approve", data={"csrf": csrf_value(manager), "comment": "ok"}
    )
    html = done.get_data(as_text=True)
    assert done.status_code == 410
    assert f"Decision refused: this approval expired at {park['deadline'].isoformat()}" in html
    assert dispatched.ids == [] and steps(db, run_id)["gate"]["status"] == "waiting_for_approval"
    with db.transaction() as tx:
        assert parks.park_row(tx, park_id)["resumed_at"] is None  # type: ignore[index]
