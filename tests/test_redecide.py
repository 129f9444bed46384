"""Re-decide (issue 30, item 2): after the rule is fixed, the refused events are previewed with
what the current version says of each, then decided once per (event, workflow, version)
through `/v1/bulk/preview` + `/v1/bulk/act` (action `redecide`): the events the fixed rule
matches start runs, the others keep their refusal and get a new recorded decision beside it;
acting again does nothing more; a re-decision racing a live admission of a new event for the
same record keeps once_per_record (one run); another tenant's token is not found."""

from __future__ import annotations

import io
from typing import Any

import pytest

from shared.admission import redecide
from shared.admission.admit import admit_event
from shared.core.db import Database
from shared.ops import cli
from shared.sweep.retention import Retention, prune
from tests.admission_support import (
    admit,
    at_barrier,
    bind_workflow,
    count,
    emit_event,
    make_connection,
    make_tenant,
)
from tests.ops_support import Dispatched, bearer, mint

WRONG = 'record.lifecyclestage == "customer"'
FIXED = 'record.lifecyclestage == "lead"'


def _refused_then_fixed(db: Database, dedup: str = "once_per_record") -> tuple[str, str, list[int]]:
    """acme's `enroll` refuses a lead (101) and a subscriber (102), then its rule is fixed to
    take leads: (workflow id, connection id, the two events)."""
    make_tenant(db, "acme")
    conn = make_connection(db, "acme")
    wf = bind_workflow(db, "enroll", rule=WRONG, dedup=dedup)
    events = [
        emit_event(db, connection_id=conn, object_id="101", changed={"lifecyclestage": "lead"}),
        emit_event(
            db, connection_id=conn, object_id="102", changed={"lifecyclestage": "subscriber"}
        ),
    ]
    assert [admit(db, e) for e in events] == [None, None]
    assert bind_workflow(db, "enroll", rule=FIXED, dedup=dedup) == wf  # a new version, now current
    return wf, conn, events


def _refusal_ids(db: Database) -> list[int]:
    with db.transaction() as tx:
        return [r["id"] for r in tx.all("SELECT id FROM admission_refusals ORDER BY event_id")]


def test_preview_then_act_readmits_what_the_fixed_rule_matches_once(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    wf, _, events = _refused_then_fixed(db)
    lead, subscriber = _refusal_ids(db)
    h = bearer(mint(db, "acme", label="ann"))
    r = client.post(
        "/v1/bulk/preview",
        headers=h,
        json={"action": "redecide", "workflow_id": wf, "reason": "rule fixed"},
    )
    assert r.status_code == 200, r.get_json()
    preview = r.get_json()
    assert preview["targets"] == [str(lead), str(subscriber)]
    said = {d["refusal_id"]: d for d in preview["redecisions"]}
    assert said[lead]["would_run"] is True and said[lead]["was_reason"] == "rule_not_matched"
    assert said[lead]["record_key"].endswith(":contact:101")
    assert said[subscriber]["would_run"] is False
    assert said[subscriber]["outcome"] == "rule_not_matched"
    assert FIXED in said[subscriber]["detail"]
    assert count(db, "SELECT count(*) FROM workflow_runs") == 0  # a preview decides nothing

    act = client.post("/v1/bulk/act", headers=h, json={"token": preview["token"]})
    assert act.status_code == 200, act.get_json()
    out = {o["target"]: o for o in act.get_json()["outcomes"]}
    assert out[str(lead)]["ok"] is True and out[str(lead)]["run_id"]
    assert out[str(subscriber)]["ok"] is False
    assert out[str(subscriber)]["code"] == "rule_not_matched"
    with db.transaction() as tx:
        runs = tx.all(
            "SELECT CAST(id AS text) AS id, event_id, start_key, record_key FROM workflow_runs"
        )
        decisions = tx.all(
            "SELECT refusal_id, outcome, CAST(run_id AS text) AS run_id FROM "
            "admission_redecisions ORDER BY refusal_id"
        )
        current = tx.scalar(
            "SELECT CAST(version_id AS text) FROM trigger_bindings WHERE workflow_id = :w", w=wf
        )
    assert [(r["event_id"], r["id"]) for r in runs] == [(events[0], out[str(lead)]["run_id"])]
    assert runs[0]["start_key"] == f"redecide:{events[0]}:{current}"
    assert len(dispatched.ids) == 1  # the run's first step
    assert decisions == [
        {"refusal_id": lead, "outcome": "admitted", "run_id": runs[0]["id"]},
        {"refusal_id": subscriber, "outcome": "rule_not_matched", "run_id": None},
    ]
    # The refusals stay as admission wrote them.
    assert count(db, "SELECT count(*) FROM admission_refusals WHERE reason = 'rule_not_matched'")
    assert count(db, "SELECT count(*) FROM admission_refusals") == 2
    assert count(db, "SELECT count(*) FROM ops_audit WHERE action = 'admission.redecide'") == 2

    # The refusals list shows each re-decision beside its refusal.
    listed = client.get(f"/v1/refusals?workflow_id={wf}", headers=h).get_json()["items"]
    beside = {item["id"]: item for item in listed}
    assert beside[lead]["reason"] == "rule_not_matched"
    assert [(d["outcome"], d["run_id"]) for d in beside[lead]["redecisions"]] == [
        ("admitted", runs[0]["id"])
    ]
    assert beside[subscriber]["redecisions"][0]["bulk_id"] == preview["token"]

    # Acting again on the token: its outcomes, nothing more.
    again = client.post("/v1/bulk/act", headers=h, json={"token": preview["token"]}).get_json()
    assert again["repeated"] is True
    # A new preview leaves out the event that started its run; acting on the one still
    # refused finds it decided on this version already.
    second = client.post(
        "/v1/bulk/preview", headers=h, json={"action": "redecide", "workflow_id": wf}
    ).get_json()
    assert second["targets"] == [str(subscriber)]
    redo = client.post("/v1/bulk/act", headers=h, json={"token": second["token"]}).get_json()
    assert redo["outcomes"][0]["ok"] is False and "decided before" in redo["outcomes"][0]["message"]
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1
    assert count(db, "SELECT count(*) FROM admission_redecisions") == 2
    assert len(dispatched.ids) == 1


def test_another_tenants_token_is_refused(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    _refused_then_fixed(db)
    make_tenant(db, "globex")
    mine = client.post(
        "/v1/bulk/preview", headers=bearer(mint(db, "acme")), json={"action": "redecide"}
    ).get_json()
    assert len(mine["targets"]) == 2
    g = bearer(mint(db, "globex"))
    theirs = client.post("/v1/bulk/preview", headers=g, json={"action": "redecide"}).get_json()
    assert theirs["targets"] == [] and theirs["redecisions"] == []
    refused = client.post("/v1/bulk/act", headers=g, json={"token": mine["token"]})
    assert refused.status_code == 404 and refused.get_json()["code"] == "not_found"
    # Nor does globex's scope reach acme's refusal by id.
    with db.transaction() as tx:
        rid = tx.scalar("SELECT min(id) FROM admission_refusals")
    assert redecide.redecide(db, rid, tenant_id="globex", publish=dispatched) is None
    assert count(db, "SELECT count(*) FROM workflow_runs") == 0
    assert count(db, "SELECT count(*) FROM admission_redecisions") == 0


@pytest.mark.parametrize(
    ("dedup", "loser"), [("once_per_record", "duplicate"), ("not_while_running", "already_running")]
)
def test_redecide_racing_a_live_admission_for_the_record_keeps_the_dedup_mode(
    db: Database, database_url: str, dedup: str, loser: str
) -> None:
    _, conn, _ = _refused_then_fixed(db, dedup)
    lead = _refusal_ids(db)[0]
    # A new event for the same record arrives while the operator re-decides the old one.
    fresh = emit_event(db, connection_id=conn, object_id="101", changed={"lifecyclestage": "lead"})
    redecided, admitted = at_barrier(
        database_url,
        [
            lambda own: redecide.redecide(own, lead, tenant_id="acme", publish=lambda ids: None),
            lambda own: admit_event(own, fresh, publish=lambda ids: None).outcomes[0],
        ],
    )
    assert redecided is not None
    runs = count(db, "SELECT count(*) FROM workflow_runs WHERE record_key LIKE '%:contact:101'")
    assert runs == 1
    # Exactly one of the two started it; the other was refused by the mode, recorded.
    won = [redecided.outcome == "admitted", admitted.outcome == "admitted"]
    assert won.count(True) == 1, (redecided, admitted)
    if won[0]:
        assert admitted.reason == loser
    else:
        assert redecided.outcome == loser
        assert count(db, "SELECT count(*) FROM admission_redecisions WHERE outcome = :o", o=loser)


def _onceflow(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_the_cli_previews_then_acts_on_the_token(
    db: Database, ops_server: str, dispatched: Dispatched
) -> None:
    wf, _, _ = _refused_then_fixed(db)
    lead, subscriber = _refusal_ids(db)
    auth = ["--url", ops_server, "--token", mint(db, "acme")]
    code, out, err = _onceflow("redecide", "--workflow", wf, "--refusal", "rule_not_matched", *auth)
    assert code == cli.EXIT_OK, err
    assert "1 of 2 refused event(s) would run now; nothing was done" in out
    assert "would run" in out and "rule_not_matched" in out
    token = out.rsplit("--bulk-token ", 1)[1].strip()
    assert count(db, "SELECT count(*) FROM workflow_runs") == 0
    code, out, _ = _onceflow("redecide", "--bulk-token", token, *auth)
    assert code == cli.EXIT_PROBLEMS  # one stays refused (rule_not_matched), said so
    assert "1 of 2 re-admitted" in out and "refused (rule_not_matched)" in out
    code, out, _ = _onceflow("redecide", "--bulk-token", token, *auth)
    assert "acted on before: nothing more done" in out
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1 and len(dispatched.ids) == 1
    assert {lead, subscriber} == set(_refusal_ids(db))


def test_retention_takes_re_decisions_with_their_refusals_and_runs(db: Database) -> None:
    _refused_then_fixed(db)
    lead, subscriber = _refusal_ids(db)
    for refusal in (lead, subscriber):
        assert redecide.redecide(db, refusal, tenant_id="acme", publish=lambda ids: None)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET status = 'succeeded',"
            " finished_at = now() - interval '91 days'"
        )
        tx.execute("UPDATE workflow_trigger_events SET decided_at = now() - interval '91 days'")
    done = prune(db, Retention(batch=10))
    assert done["runs"] == 1 and done["events"] == 2 and done["refusals"] == 2
    assert count(db, "SELECT count(*) FROM admission_redecisions") == 0


def test_events_refused_while_the_breaker_was_open_run_once_it_is_closed(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    make_tenant(db, "acme")
    conn = make_connection(db, "acme")
    wf = bind_workflow(db, "enroll", rule=FIXED)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_breakers (workflow_id, state, opened_at, reason)"
            " VALUES (:w, 'open', now(), 'three failures')",
            w=wf,
        )
    event = emit_event(db, connection_id=conn, object_id="101", changed={"lifecyclestage": "lead"})
    assert admit(db, event) is None
    h = bearer(mint(db, "acme"))
    body = {"action": "redecide", "reasons": ["workflow_paused"]}
    still = client.post("/v1/bulk/preview", headers=h, json=body).get_json()
    assert [d["outcome"] for d in still["redecisions"]] == ["workflow_paused"]
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_breakers SET state = 'closed' WHERE workflow_id = :w", w=wf)
    preview = client.post("/v1/bulk/preview", headers=h, json=body).get_json()
    assert [d["would_run"] for d in preview["redecisions"]] == [True]
    out = client.post("/v1/bulk/act", headers=h, json={"token": preview["token"]}).get_json()
    assert [o["ok"] for o in out["outcomes"]] == [True]
    assert count(db, "SELECT count(*) FROM workflow_runs WHERE event_id = :e", e=event) == 1
    assert len(dispatched.ids) == 1
