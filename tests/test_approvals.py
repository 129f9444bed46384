"""Approvals (the `approval` block, decided through the ops API) against real Postgres: the gate
is a row; two decisions at a barrier, one wins and the other says who; who may decide; the
timeout's reject and proceed; every decision audited; validation warns about `proceed`."""

from __future__ import annotations

import json
import textwrap
import threading
from typing import Any

import pytest

from shared.core.db import Database
from shared.publishing.validate import validate_text
from shared.steps import parks
from shared.sweep.loop import run_sweep
from tests.ops_support import (
    Dispatched,
    bearer,
    mint,
)
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import TENANT, definition, publish_version, run_row, start_run
from tests.steps_support import steps_of as steps
from tests.test_steps_engine import Queue, make_past


def _gate(**config: Any) -> list[dict[str, Any]]:
    approval = {
        "summary": "20% discount on deal 7",
        "approvers": {"role": "manager", "users": ["erin"]},
        "expires_in": {"days": 2},
        **config,
    }
    return [
        {"id": "gate", "type": "approval", "config": approval, "next": "apply"},
        {"id": "apply", "type": "test.noop"},
        {"id": "tell_rep", "type": "test.noop"},
    ]


def _parked(db: Database, **config: Any) -> tuple[str, int, Queue, Any]:
    lookup = block_lookup(Recorder())
    run_id, ids = start_run(db, publish_version(db, definition(_gate(**config))))
    q = Queue()
    q(ids)
    q.drain(db, lookup)
    gate = steps(db, run_id)["gate"]
    assert gate["status"] == "waiting_for_approval"
    with db.transaction() as tx:
        park = tx.one("SELECT * FROM step_parks WHERE id = :p", p=gate["park_id"])
    assert park is not None and park["kind"] == "approval"
    assert park["deadline"] == gate["wake_at"] and park["summary"] == "20% discount on deal 7"
    return run_id, int(park["id"]), q, lookup


def _decide(
    db: Database, park_id: int, decision: str, user: str, roles: tuple[str, ...] = ()
) -> Any:
    return parks.decide_approval(
        db,
        park_id,
        decision=decision,
        user=user,
        roles=roles,
        comment=f"{user} says {decision}",
        tenant_scope=TENANT,
    )


def test_two_decisions_at_a_barrier_one_wins_the_other_says_who(db: Database) -> None:
    run_id, park_id, q, lookup = _parked(db, on_reject={"goto": "tell_rep"})
    barrier = threading.Barrier(2)
    out: dict[str, Any] = {}

    def decide(user: str, decision: str, roles: tuple[str, ...]) -> None:
        barrier.wait()
        out[user] = _decide(db, park_id, decision, user, roles)

    threads = [
        threading.Thread(target=decide, args=("carol", "approved", ("manager",))),
        threading.Thread(target=decide, args=("erin", "rejected", ())),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [u for u, o in out.items() if o.moved]
    assert len(winners) == 1
    winner = winners[0]
    loser = out[next(u for u in out if u != winner)]
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None and park["decided_by"] == winner
    assert loser.why_not == (
        f"already decided by {winner} at {park['resumed_at'].isoformat()} ({park['decision']})"
    )
    q(steps_ids := [out[winner].step_id])
    assert steps_ids == [str(steps(db, run_id)["gate"]["id"])]
    q.drain(db, lookup)
    journal = steps(db, run_id)
    took = "apply" if winner == "carol" else "tell_rep"
    assert set(journal) == {"gate", took}
    assert journal["gate"]["output"]["resumed"]["decided_by"] == winner
    assert run_row(db, run_id)["status"] == "succeeded"


def test_ops_lists_approvals_to_those_who_may_decide_and_audits_each_decision(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    run_id, park_id, q, lookup = _parked(db)
    manager = mint(db, TENANT, label="carol", roles=("manager",))
    outsider = mint(db, TENANT, label="dave")
    assert [
        a["id"] for a in client.get("/v1/approvals", headers=bearer(manager)).get_json()["items"]
    ] == [park_id]
    assert client.get("/v1/approvals", headers=bearer(outsider)).get_json()["items"] == []

    # The run card says what the parked step waits for, and until when.
    card = client.get(f"/v1/runs/{run_id}", headers=bearer(manager)).get_json()
    (gate,) = [s for s in card["steps"] if s["step_key"] == "gate"]
    assert gate["status"] == "waiting_for_approval"
    assert gate["waits_for"]["kind"] == "approval" and gate["waits_for"]["id"] == park_id
    assert gate["waits_for"]["until"] == gate["wake_at"]
    assert gate["waits_for"]["approver_users"] == ["erin"]

    url = f"/v1/approvals/{park_id}"
    refused = client.post(f"{url}/approve", json={}, headers=bearer(outsider))
    assert refused.status_code == 403
    assert (
        refused.get_json()["message"] == "only role manager or user erin may decide this approval"
    )
    assert (
        client.post("/v1/approvals/999999/approve", json={}, headers=bearer(manager)).status_code
        == 404
    )

    done = client.post(f"{url}/approve", json={"comment": "margin ok"}, headers=bearer(manager))
    assert done.status_code == 200, done.get_json()
    assert done.get_json()["decided_by"] == "carol" and done.get_json()["step_key"] == "gate"
    assert dispatched.ids == [str(steps(db, run_id)["gate"]["id"])]
    again = client.post(f"{url}/reject", json={}, headers=bearer(manager))
    assert again.status_code == 409 and again.get_json()["code"] == "already_decided"
    assert again.get_json()["message"].startswith("already decided by carol at ")

    q(dispatched.ids)
    q.drain(db, lookup)
    gate = steps(db, run_id)["gate"]
    assert gate["status"] == "succeeded" and gate["outcome_code"] == "APPROVED"
    assert gate["output"]["resumed"]["comment"] == "margin ok"
    assert set(steps(db, run_id)) == {"gate", "apply"}
    with db.transaction() as tx:
        audits = tx.all(
            "SELECT action, detail FROM ops_audit WHERE target = :p ORDER BY id", p=str(park_id)
        )
    assert [(a["action"], a["detail"]["outcome"]) for a in audits] == [
        ("approvals.approve", "refused"),
        ("approvals.approve", "done"),
        ("approvals.reject", "refused"),
    ]
    assert audits[1]["detail"]["body"] == {"comment": "margin ok"}


@pytest.mark.parametrize(
    ("config", "step_status", "after", "run_status"),
    [
        ({}, "succeeded", set(), "succeeded"),  # reject, the path ends
        ({"on_reject": {"goto": "tell_rep"}}, "succeeded", {"tell_rep"}, "succeeded"),
        ({"on_reject": "fail"}, "failed", set(), "failed"),
        ({"on_timeout": "proceed"}, "succeeded", {"apply"}, "succeeded"),
    ],
)
def test_an_approval_nobody_decided_is_rejected_or_proceeds_at_its_deadline(
    db: Database, config: dict[str, Any], step_status: str, after: set[str], run_status: str
) -> None:
    run_id, park_id, q, lookup = _parked(db, **config)
    make_past(db, run_id)
    run_sweep(db, 0, duties=[], dispatch=q)
    q.drain(db, lookup)
    journal = steps(db, run_id)
    assert journal["gate"]["status"] == step_status
    assert set(journal) - {"gate"} == after
    assert run_row(db, run_id)["status"] == run_status
    late = _decide(db, park_id, "approved", "erin")
    assert not late.moved and late.why_not.startswith("already resumed by its deadline at ")


def test_validate_warns_about_proceeding_on_timeout() -> None:
    report = validate_text(
        textwrap.dedent(
            """\
            name: wf
            tenant: acme
            trigger:
              events: [hubspot.deal.created]
            steps:
              - id: gate
                type: approval
                config:
                  summary: "ok?"
                  approvers: {users: [erin]}
                  expires_in: {days: 1}
                  on_timeout: proceed
            """
        )
    )
    assert report.ok, [str(p) for p in report.problems]
    (warning,) = report.warnings
    assert warning.where == "steps[0].config.on_timeout" and "proceed" in warning.message
    assert (warning.line, warning.column) == (12, 19)


def test_a_signed_link_lets_a_named_approver_decide_once_without_a_token(
    db: Database, client: Any, dispatched: Dispatched, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, park_id, _, _ = _parked(db)
    operator = mint(db, TENANT, label="ops")
    url = f"/v1/approvals/{park_id}/links"
    # Without the secret no link is made; for someone the approval does not name, neither.
    assert client.post(url, json={"user": "erin"}, headers=bearer(operator)).status_code == 409
    monkeypatch.setenv("ONCEFLOW_APPROVAL_LINK_SECRET", "s" * 32)
    assert client.post(url, json={"user": "mallory"}, headers=bearer(operator)).status_code == 422
    made = client.post(url, json={"user": "erin"}, headers=bearer(operator))
    assert made.status_code == 201, made.get_json()
    path = made.get_json()["path"]

    # Opening it decides nothing (mail scanners fetch links); a forged one is refused.
    shown = client.get(path)
    assert shown.status_code == 200 and "20% discount on deal 7" in shown.get_data(as_text=True)
    forged = path[:-4] + ("0000" if not path.endswith("0000") else "1111")
    assert client.post(forged, data={"decision": "approve"}).status_code == 403
    assert client.post(path.replace("/erin/", "/mallory/"), data={}).status_code == 403
    assert steps(db, run_id)["gate"]["status"] == "waiting_for_approval"

    done = client.post(path, data={"decision": "reject", "comment": "too deep"})
    assert done.status_code == 200 and "rejected" in done.get_data(as_text=True)
    assert dispatched.ids == [str(steps(db, run_id)["gate"]["id"])]
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None and (park["decided_by"], park["decision"]) == ("erin", "rejected")
    again = client.post(path, data={"decision": "approve"})
    assert again.status_code == 409
    assert "already decided by erin at " in again.get_data(as_text=True)
    with db.transaction() as tx:
        uses = tx.all(
            "SELECT token_id, detail FROM ops_audit WHERE action = 'approvals.link_decide'"
            " ORDER BY id"
        )
    assert [u["detail"]["outcome"] for u in uses] == ["done", "refused"]
    assert all(u["token_id"] is None and u["detail"]["user"] == "erin" for u in uses)


def test_a_link_past_its_approvals_expiry_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import UTC, datetime, timedelta

    from shared.ops.approval_links import make_link, verified
    from shared.ops.errors import OpsError

    monkeypatch.setenv("ONCEFLOW_APPROVAL_LINK_SECRET", "s" * 32)
    expires = datetime.now(UTC) + timedelta(hours=1)
    parts = make_link(7, "erin", expires).path.split("/")[3:]
    assert verified(parts).user == "erin"
    with pytest.raises(OpsError) as late:
        verified(parts, now=expires + timedelta(seconds=1))
    assert late.value.status == 410


def test_the_cli_lists_and_decides_approvals_through_the_ops_api(
    db: Database, ops_server: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from shared.ops import cli

    run_id, park_id, _q, _lookup = _parked(db)
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_server)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", mint(db, TENANT, label="carol", roles=("manager",)))
    assert cli.main(["approvals", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [a["id"] for a in listed["items"]] == [park_id]
    assert cli.main(["approve", str(park_id), "--comment", "fine by me"]) == 0
    assert f"approval {park_id}: approved by carol" in capsys.readouterr().out
    assert cli.main(["reject", str(park_id)]) == cli.EXIT_REFUSED
    assert "already decided by carol at " in capsys.readouterr().err
    with db.transaction() as tx:
        row = tx.one("SELECT decision, decided_by FROM step_parks WHERE id = :p", p=park_id)
    assert row == {"decision": "approved", "decided_by": "carol"}
    assert run_row(db, run_id)["status"] == "running"


def test_a_retried_approval_asks_again_on_a_new_pending_approval(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    """Rejected with `on_reject: fail`, the run fails; the ops retry starts the gate again,
    and it asks the approvers again: a new pending approval (listed, decidable, with a fresh
    expiry), while the rejected one stays decided."""
    run_id, first, q, lookup = _parked(db, on_reject="fail")
    assert _decide(db, first, "rejected", "erin").moved
    gate_id = str(steps(db, run_id)["gate"]["id"])
    q([gate_id])
    q.drain(db, lookup)
    assert run_row(db, run_id)["status"] == "failed"
    manager = mint(db, TENANT, label="carol", roles=("manager",))

    retried = client.post(f"/v1/runs/{run_id}/retry", json={}, headers=bearer(manager))
    assert retried.status_code == 200, retried.get_json()
    q(dispatched.ids)
    q.drain(db, lookup)
    gate = steps(db, run_id)["gate"]
    assert gate["status"] == "waiting_for_approval" and str(gate["id"]) == gate_id
    listed = client.get("/v1/approvals", headers=bearer(manager)).get_json()["items"]
    assert [a["id"] for a in listed] == [gate["park_id"]] and gate["park_id"] != first
    with db.transaction() as tx:
        old = parks.park_row(tx, first)
        new = parks.park_row(tx, gate["park_id"])
    assert old is not None and (old["decision"], old["decided_by"]) == ("rejected", "erin")
    assert new is not None and new["resumed_at"] is None and new["deadline"] > old["resumed_at"]

    done = client.post(
        f"/v1/approvals/{gate['park_id']}/approve",
        json={"comment": "ok now"},
        headers=bearer(manager),
    )
    assert done.status_code == 200, done.get_json()
    q(dispatched.ids[-1:])
    q.drain(db, lookup)
    journal = steps(db, run_id)
    assert journal["gate"]["outcome_code"] == "APPROVED" and set(journal) == {"gate", "apply"}
    assert run_row(db, run_id)["status"] == "succeeded"


def test_an_expired_approval_is_refused_through_the_api_before_and_after_the_sweep(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    """Past its expiry an approval takes no decision, whether or not the sweep has run yet:
    the API answers 410 saying when it expired and what its expiry does, like the signed
    link; the sweep then rejects it as `on_timeout` says, and a decision after that is
    refused the same way."""
    run_id, park_id, q, lookup = _parked(db, on_reject={"goto": "tell_rep"})
    manager = mint(db, TENANT, label="carol", roles=("manager",))
    make_past(db, run_id)
    url = f"/v1/approvals/{park_id}/approve"
    with db.transaction() as tx:
        park = parks.park_row(tx, park_id)
    assert park is not None
    expired = f"this approval expired at {park['deadline'].isoformat()} (then: reject)"

    late = client.post(url, json={"comment": "sorry, late"}, headers=bearer(manager))
    assert late.status_code == 410, late.get_json()
    assert late.get_json()["code"] == "approval_expired"
    assert late.get_json()["message"].startswith(expired)
    assert dispatched.ids == [] and steps(db, run_id)["gate"]["status"] == "waiting_for_approval"
    # Not listed as waiting for a decision either.
    assert client.get("/v1/approvals", headers=bearer(manager)).get_json()["items"] == []

    run_sweep(db, 0, duties=[], dispatch=q)
    q.drain(db, lookup)
    journal = steps(db, run_id)
    assert journal["gate"]["outcome_code"] == "REJECTED" and set(journal) == {"gate", "tell_rep"}
    after = client.post(url, json={}, headers=bearer(manager))
    assert after.status_code == 410 and after.get_json()["message"].startswith(expired)
    with db.transaction() as tx:
        audits = tx.all(
            "SELECT detail FROM ops_audit WHERE action = 'approvals.approve' ORDER BY id"
        )
    assert [a["detail"]["outcome"] for a in audits] == ["refused", "refused"]
