"""Approval quorums against real Postgres (issue 31, item 4): `required: N` of the named
approvers, reject by any unless `reject_quorum`, each approver counted once, decided under the
step row's lock by the guarded resume. Two approving clicks at a barrier reach the quorum
exactly once; a third, late, click is recorded as late and resumes nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from shared.core.db import Database
from shared.publishing.validate import validate_text
from shared.steps import parks
from tests.ops_support import Dispatched, bearer, mint
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import TENANT, definition, publish_version, run_row, start_run
from tests.steps_support import steps_of as steps
from tests.test_steps_engine import Queue

MANAGERS = ["ann", "bob", "cat"]


def _parked(db: Database, **config: Any) -> tuple[str, int, Queue, Any]:
    approval = {
        "summary": "15% discount on deal 7",
        "approvers": {"users": MANAGERS},
        "expires_in": {"days": 2},
        "required": 2,
        **config,
    }
    nodes = [
        {"id": "gate", "type": "approval", "config": approval, "next": "apply"},
        {"id": "apply", "type": "test.noop"},
    ]
    lookup = block_lookup(Recorder())
    run_id, ids = start_run(db, publish_version(db, definition(nodes)))
    q = Queue()
    q(ids)
    q.drain(db, lookup)
    gate = steps(db, run_id)["gate"]
    assert gate["status"] == "waiting_for_approval"
    return run_id, int(gate["park_id"]), q, lookup


def _vote(db: Database, park_id: int, user: str, decision: str = "approved") -> Any:
    return parks.decide_approval(
        db,
        park_id,
        decision=decision,
        user=user,
        roles=(),
        comment=None,
        tenant_scope=TENANT,
    )


def _votes(db: Database, park_id: int) -> dict[str, tuple[str, bool]]:
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT voter, decision, counted FROM approval_votes WHERE park_id = :p", p=park_id
        )
    return {r["voter"]: (r["decision"], r["counted"]) for r in rows}


def test_two_approvals_at_a_barrier_reach_the_quorum_once_and_a_late_third_is_a_no_op(
    db: Database,
) -> None:
    run_id, park_id, q, lookup = _parked(db)
    barrier = threading.Barrier(2)
    out: dict[str, Any] = {}

    def approve(user: str) -> None:
        barrier.wait()
        out[user] = _vote(db, park_id, user)

    threads = [threading.Thread(target=approve, args=(u,)) for u in ("ann", "bob")]
    # Both votes are held at the same point until both are there: a third transaction holds
    # the park row, which each vote's insert needs (its foreign key's share lock). Released,
    # both inserts go at once; only the step row's lock (taken before) orders the tallies.
    with db.transaction() as blocker:
        blocker.one("SELECT id FROM step_parks WHERE id = :p FOR UPDATE", p=park_id)
        for t in threads:
            t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(30)
    assert sorted(o.vote for o in out.values()) == ["counted", "counted"]
    winners = [u for u, o in out.items() if o.moved]
    assert len(winners) == 1, out  # exactly one resume
    (other,) = [o for o in out.values() if not o.moved]
    assert other.awaiting_quorum and other.approvals == 1  # the first of the two to count

    late = _vote(db, park_id, "cat")
    assert late.vote == "late" and not late.moved
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None and park["decided_by"] == winners[0]
    assert late.why_not == (
        f"already decided by {winners[0]} at {park['resumed_at'].isoformat()} (approved)"
    )
    assert _votes(db, park_id) == {
        "ann": ("approved", True),
        "bob": ("approved", True),
        "cat": ("approved", False),
    }
    q([out[winners[0]].step_id])
    q.drain(db, lookup)
    journal = steps(db, run_id)
    assert set(journal) == {"gate", "apply"}
    voters = [v["voter"] for v in journal["gate"]["output"]["resumed"]["votes"]]
    assert sorted(voters) == ["ann", "bob"]
    assert run_row(db, run_id)["status"] == "succeeded"


def test_one_approver_counts_once_a_repeat_changes_nothing(db: Database) -> None:
    _, park_id, _, _ = _parked(db)
    first = _vote(db, park_id, "ann")
    again = _vote(db, park_id, "ann")
    flipped = _vote(db, park_id, "ann", "rejected")
    assert first.awaiting_quorum and first.approvals == 1
    assert again.vote == flipped.vote == "duplicate" and not again.moved
    assert again.approvals == flipped.approvals == 1 and flipped.rejections == 0
    assert _votes(db, park_id) == {"ann": ("approved", True)}


def test_a_reject_by_any_ends_it_unless_reject_quorum_says_more(db: Database) -> None:
    _, park_id, _, _ = _parked(db)
    _vote(db, park_id, "ann")
    no = _vote(db, park_id, "bob", "rejected")
    assert no.moved
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None and park["decision"] == "rejected" and park["decided_by"] == "bob"

    _, park_id, _, _ = _parked(db, reject_quorum=2)
    first_no = _vote(db, park_id, "ann", "rejected")
    assert first_no.awaiting_quorum and first_no.rejections == 1
    second_no = _vote(db, park_id, "cat", "rejected")
    assert second_no.moved
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None and park["decision"] == "rejected" and park["decided_by"] == "cat"


def test_the_api_answers_a_vote_short_of_quorum_as_recorded(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    _, park_id, _, _ = _parked(db)
    ann, bob = mint(db, TENANT, label="ann"), mint(db, TENANT, label="bob")
    url = f"/v1/approvals/{park_id}/approve"
    first = client.post(url, json={}, headers=bearer(ann))
    assert first.status_code == 200, first.get_json()
    assert first.get_json() | {"run_id": None} == first.get_json() | {
        "run_id": None,
        "resumed": False,
        "approvals": 1,
        "required": 2,
        "vote": "counted",
    }
    repeat = client.post(url, json={}, headers=bearer(ann)).get_json()
    assert repeat["vote"] == "duplicate" and repeat["resumed"] is False
    assert dispatched.ids == []
    done = client.post(url, json={}, headers=bearer(bob)).get_json()
    assert done["resumed"] is True and done["approvals"] == 2
    assert len(dispatched.ids) == 1
    late = client.post(url, json={}, headers=bearer(ann))
    assert late.status_code == 409


GATE = """\
name: wf
tenant: acme
trigger:
  events: [hubspot.deal.created]
steps:
  - id: gate
    type: approval
    config:
      summary: "ok?"
      approvers: {users: [erin, fay]}
      expires_in: {days: 1}
"""


@pytest.mark.parametrize(
    ("extra", "where", "at", "said"),
    [
        (
            "      required: 3\n",
            "steps[0].config.required",
            (12, 17),
            "required is 3 but only 2 users are named (and no role)",
        ),
        (
            "      reject_quorum: 0\n",
            "steps[0].config.reject_quorum",
            (12, 22),
            "greater than or equal to 1",
        ),
        (
            "      remind_after: {days: 2}\n",
            "steps[0].config.remind_after",
            (12, 21),
            "remind_after must be positive and shorter than expires_in",
        ),
        (
            "      escalate_to: {role: vp}\n",
            "steps[0].config.escalate_to",
            (12, 20),
            "escalate_to needs escalate_after",
        ),
        (
            "      channels: {slack: {channel: '#deals'}}\n",
            "steps[0].config.channels.slack.channel",
            (12, 35),
            "should match pattern",
        ),
    ],
)
def test_validation_points_at_the_approval_field_it_is_about(
    extra: str, where: str, at: tuple[int, int], said: str
) -> None:
    report = validate_text(GATE + extra)
    (problem,) = report.problems
    assert (problem.where, (problem.line, problem.column)) == (where, at)
    assert said in problem.message


def test_a_quorum_of_a_role_and_slack_and_email_channels_validate() -> None:
    extra = (
        "      required: 2\n"
        "      channels: {slack: {channel: C0DEALS}, email: true}\n"
        "      remind_after: {hours: 4}\n"
        "      escalate_after: {hours: 20}\n"
        "      escalate_to: {role: vp}\n"
    )
    report = validate_text(GATE.replace("{users: [erin, fay]}", "{role: manager}") + extra)
    assert report.ok, [str(p) for p in report.problems]


def test_the_ops_list_shows_the_quorums_progress_and_lists_it_to_those_escalated_to(
    db: Database, client: Any
) -> None:
    _, park_id, _, _ = _parked(db, escalate_after={"hours": 4}, escalate_to={"role": "vp"})
    ann, vp = mint(db, TENANT, label="ann"), mint(db, TENANT, label="vera", roles=("vp",))
    _vote(db, park_id, "ann")
    (item,) = client.get("/v1/approvals", headers=bearer(ann)).get_json()["items"]
    assert (item["required"], item["approved_by"], item["escalated_at"]) == (2, ["ann"], None)
    assert client.get("/v1/approvals", headers=bearer(vp)).get_json()["items"] == []
    with db.transaction() as tx:
        tx.execute(
            "UPDATE step_parks SET escalated_at = now(), escalate_at = now() WHERE id = :p",
            p=park_id,
        )
    (listed,) = client.get("/v1/approvals", headers=bearer(vp)).get_json()["items"]
    assert listed["id"] == park_id and listed["escalate_role"] == "vp"
    done = client.post(f"/v1/approvals/{park_id}/approve", json={}, headers=bearer(vp))
    assert done.status_code == 200 and done.get_json()["resumed"] is True
