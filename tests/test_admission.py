"""Admission on real Postgres: each of the seven refusal reasons, the run and its first step,
redeliveries, refusals that commit with their claims, the partial-unique-index
backstop, poisoned messages and the round trips per event."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from shared.admission.admit import (
    AdmissionSeams,
    admit_delivery,
    admit_event,
    refusals_for_record,
)
from shared.core.db import Database
from shared.core.errors import PermanentError, TransientError
from shared.ingest.echo import record_echo_marker
from shared.steps.journal import idempotency_key, step_key
from tests.admission_support import (
    Published,
    bind_workflow,
    count,
    emit_event,
    finish_run,
    make_connection,
    make_tenant,
    refusals,
)


@pytest.fixture
def conn(db: Database) -> str:
    make_tenant(db)
    return make_connection(db)


def only_refusal(db: Database, workflow_id: str) -> dict[str, Any]:
    rows = refusals(db, workflow_id)
    assert len(rows) == 1, rows
    return rows[0]


def test_admitted_run_is_pinned_live_with_its_first_step_journaled(db: Database, conn: str) -> None:
    wf = bind_workflow(
        db,
        "pinned",
        steps=[
            {"id": "first", "type": "delay", "config": {"seconds": 5}, "next": "last"},
            {"id": "last", "type": "end"},
        ],
    )
    event_id = emit_event(db, connection_id=conn, payload={"portalId": 7, "objectId": 101})
    published = Published()
    result = admit_event(db, event_id, publish=published)

    (outcome,) = result.outcomes
    assert outcome.outcome == "admitted" and outcome.run_id
    with db.transaction() as tx:
        run = tx.one("SELECT * FROM workflow_runs WHERE id = :r", r=outcome.run_id)
        steps = tx.all("SELECT * FROM workflow_steps WHERE run_id = :r", r=outcome.run_id)
        claim = tx.one("SELECT * FROM delivery_claims WHERE event_id = :e", e=event_id)
        version = tx.scalar(
            "SELECT version_id FROM workflow_activations WHERE workflow_id = :w", w=wf
        )
    assert run is not None and claim is not None
    assert run["start_key"] == f"workflow_event:{event_id}"
    assert run["namespace"] == "live" and run["status"] == "running"
    assert str(run["lineage_root"]) == outcome.run_id  # a first run is its own lineage root
    assert run["version_id"] == version
    assert run["record_key"] == f"{conn}:contact:101"
    assert run["trigger_payload"] == {"portalId": 7, "objectId": 101}
    assert run["payload_truncated"] is False
    assert str(claim["run_id"]) == outcome.run_id
    # Only the entry step, journaled exactly as the step engine's insert_steps would.
    assert [s["step_key"] for s in steps] == ["first"]
    assert steps[0]["status"] == "pending" and steps[0]["block_type"] == "delay"
    assert steps[0]["idempotency_key"] == idempotency_key(outcome.run_id, step_key("first"))
    assert published.ids == [str(steps[0]["id"])]
    assert refusals(db) == []


# --- the seven reasons, one test each --------------------------------------------------------


def test_refusal_duplicate_once_per_record(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "once", dedup="once_per_record")
    first = admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    run_id = first.outcomes[0].run_id
    finish_run(db, str(run_id))  # even after the first run finished: at most once, ever
    second_event = emit_event(db, connection_id=conn, changed={"lifecyclestage": "customer"})
    second = admit_event(db, second_event, publish=Published())
    assert second.outcomes[0].reason == "duplicate"
    row = only_refusal(db, wf)
    assert row["reason"] == "duplicate" and row["event_id"] == second_event
    assert f"already enrolled by run {run_id} at " in row["detail"]
    assert row["record_key"] == f"{conn}:contact:101"


def test_refusal_already_running_not_while_running(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "nwr", dedup="not_while_running")
    first = admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    run_id = first.outcomes[0].run_id
    second = admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    assert second.outcomes[0].reason == "already_running"
    assert (
        f"run {run_id} for record {conn}:contact:101 is still running"
        in (only_refusal(db, wf)["detail"])
    )
    finish_run(db, str(run_id))
    third = admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    assert third.outcomes[0].outcome == "admitted"


def test_refusal_rule_not_matched(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "rule", rule='record.lifecyclestage == "customer"')
    matched = bind_workflow(db, "rule-ok", rule='record.lifecyclestage == "lead"')
    broken = bind_workflow(db, "rule-missing", rule='record.nosuchfield == "x"')
    result = admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    assert result.outcome_for(wf).reason == "rule_not_matched"
    assert result.outcome_for(matched).outcome == "admitted"
    assert "was false" in only_refusal(db, wf)["detail"]
    # A rule that can't be evaluated on this event refuses too, and says why.
    assert result.outcome_for(broken).reason == "rule_not_matched"
    assert "could not be evaluated" in only_refusal(db, broken)["detail"]


def test_a_trigger_does_not_start_on_a_change_of_a_field_it_does_not_watch(
    db: Database, conn: str
) -> None:
    """Watched fields are a tenant-wide union, and include what waits listen to (issue 23
    item 2), so a change can be delivered for another listener: a trigger with a watch list
    starts only on a change of a field it watches itself (before, any watched change did)."""
    changes = "hubspot.contact.property_changed"
    stage = bind_workflow(db, "on-stage", events=(changes,), watch=("lifecyclestage",))
    anything = bind_workflow(db, "on-anything", events=(changes,))
    event = emit_event(
        db, connection_id=conn, event_type=changes, changed={"hs_lead_status": "CONNECTED"}
    )
    result = admit_event(db, event, publish=Published())
    assert result.outcome_for(stage).reason == "rule_not_matched"
    assert (
        "none of the fields the trigger watches (lifecyclestage)"
        in (only_refusal(db, stage)["detail"])
    )
    assert result.outcome_for(anything).outcome == "admitted"
    both = emit_event(
        db,
        connection_id=conn,
        event_type=changes,
        object_id="102",
        changed={"hs_lead_status": "NEW", "lifecyclestage": "lead"},
    )
    assert admit_event(db, both, publish=Published()).outcome_for(stage).outcome == "admitted"


def test_refusal_insufficient_credits(db: Database) -> None:
    make_tenant(db, balance=0)
    conn = make_connection(db)
    paid = bind_workflow(
        db,
        "paid",
        steps=[
            {
                "id": "fetch",
                "type": "crm.get",
                "config": {"object_type": "contacts", "object_id": "1"},
            }
        ],
    )
    free = bind_workflow(db, "free")  # `end` costs nothing: admitted with a zero balance
    result = admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    assert result.outcome_for(paid).reason == "insufficient_credits"
    assert result.outcome_for(free).outcome == "admitted"
    assert (
        "has 0 credits; the first step fetch (crm.get) costs 1"
        in (only_refusal(db, paid)["detail"])
    )


def test_refusal_echo_suppressed(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "echo", dedup="every_time")
    with db.transaction() as tx:
        record_echo_marker(
            tx,
            connection_id=conn,
            object_type="contact",
            object_id="101",
            fields={"lifecyclestage": "customer"},
            step_id=None,
        )
    echo = emit_event(db, connection_id=conn, changed={"lifecyclestage": "customer"})
    assert admit_event(db, echo, publish=Published()).outcomes[0].reason == "echo_suppressed"
    assert "matches a write onceflow made" in only_refusal(db, wf)["detail"]
    # The marker is not consumed: HubSpot's retry of the same webhook is refused the same way.
    again = emit_event(db, connection_id=conn, changed={"lifecyclestage": "customer"})
    assert admit_event(db, again, publish=Published()).outcomes[0].reason == "echo_suppressed"
    # A person's change to another value, or to another field as well, is a real trigger.
    real = emit_event(db, connection_id=conn, changed={"lifecyclestage": "lead"})
    assert admit_event(db, real, publish=Published()).outcomes[0].outcome == "admitted"
    mixed = emit_event(
        db, connection_id=conn, changed={"lifecyclestage": "customer", "phone": "555"}
    )
    assert admit_event(db, mixed, publish=Published()).outcomes[0].outcome == "admitted"


def test_refusal_provider_suppressed(db: Database) -> None:
    make_tenant(db, excluded=["tenant-bot"])
    paused = make_connection(db, status="paused")
    gone = make_connection(db, status="disconnected")
    active = make_connection(db, excluded=["conn-bot"])
    wf = bind_workflow(db, "prov", dedup="every_time")
    cases = {
        emit_event(db, connection_id=paused): "is paused",
        emit_event(db, connection_id=gone): "is disconnected",
        emit_event(db, connection_id=active, author_id="tenant-bot"): "author tenant-bot",
        emit_event(db, connection_id=active, author_id="conn-bot"): "author conn-bot",
    }
    for event_id, expected in cases.items():
        outcome = admit_event(db, event_id, publish=Published()).outcomes[0]
        assert outcome.reason == "provider_suppressed", (event_id, outcome)
        assert expected in str(outcome.detail)
    person = emit_event(db, connection_id=active, author_id="a-person")
    assert admit_event(db, person, publish=Published()).outcomes[0].outcome == "admitted"
    assert len(refusals(db, wf)) == 4


def test_a_binding_whose_definition_no_longer_parses_is_refused_alone(
    db: Database, conn: str
) -> None:
    """Issue 23 item 16: one bound version whose stored definition no longer parses (a row
    written by another release, or damaged) used to fail the whole admission — the event
    was poisoned for every workflow bound to its type. Now that binding alone is refused
    `definition_unreadable`, with the parse error in the detail, and the others are decided
    as usual; a redelivery changes nothing."""
    healthy = bind_workflow(db, "healthy")
    broken = bind_workflow(db, "broken")
    with db.transaction() as tx:
        tx.execute("ALTER TABLE workflow_versions DISABLE TRIGGER workflow_versions_no_update")
        tx.execute(
            "UPDATE workflow_versions SET definition = jsonb_set(definition, '{steps}', "
            '\'[{"id": "start", "type": 42}]\') WHERE workflow_id = CAST(:w AS uuid)',
            w=broken,
        )
        tx.execute("ALTER TABLE workflow_versions ENABLE TRIGGER workflow_versions_no_update")
    event = emit_event(db, connection_id=conn)
    result = admit_event(db, event, publish=Published())
    assert result.outcome_for(healthy).outcome == "admitted"
    refused = result.outcome_for(broken)
    assert (refused.outcome, refused.reason) == ("refused", "definition_unreadable")
    row = only_refusal(db, broken)
    assert row["reason"] == "definition_unreadable"
    assert "unreadable definition" in row["detail"] and row["version_id"] is not None
    again = admit_event(db, event, publish=Published())
    assert {o.outcome for o in again.outcomes} == {"handled"}
    assert count(db, "SELECT count(*) FROM poisoned_messages") == 0


def test_the_refusal_reasons_check_mirrors_the_one_list(db: Database) -> None:
    import re

    from shared.admission.admit import REASONS
    from shared.ops.explain import REASON_WORDS

    with db.transaction() as tx:
        check = tx.scalar(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'admission_refusals_reason_check'"
        )
    assert set(re.findall(r"'([a-z_]+)'", str(check))) == REASONS
    assert set(REASON_WORDS) == REASONS


def test_refusal_missing_record_identity(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "needs-record", dedup="once_per_record")
    by_expr = bind_workflow(db, "expr-record", dedup="every_time", record="trigger.dealId")
    any_time = bind_workflow(db, "no-record-ok", dedup="every_time")
    event_id = emit_event(db, connection_id=conn, object_id=None, changed={})
    result = admit_event(db, event_id, publish=Published())
    assert result.outcome_for(wf).reason == "missing_record_identity"
    assert "names no record" in only_refusal(db, wf)["detail"]
    assert result.outcome_for(by_expr).reason == "missing_record_identity"
    assert "record expression failed" in only_refusal(db, by_expr)["detail"]
    # every_time needs no record: one run per event is all it promises.
    assert result.outcome_for(any_time).outcome == "admitted"


def test_record_from_an_expression_gives_the_run_its_record_key(db: Database, conn: str) -> None:
    bind_workflow(db, "deal-record", dedup="once_per_record", record="trigger.dealId")
    event_id = emit_event(db, connection_id=conn, payload={"dealId": 555})
    run_id = admit_event(db, event_id, publish=Published()).outcomes[0].run_id
    with db.transaction() as tx:
        key = tx.scalar("SELECT record_key FROM workflow_runs WHERE id = :r", r=run_id)
    assert key == f"{conn}:contact:555"
    second = admit_event(
        db, emit_event(db, connection_id=conn, payload={"dealId": 555}), publish=Published()
    )
    assert second.outcomes[0].reason == "duplicate"


# --- redelivery, rollback, backstop ----------------------------------------------------------


def _state(db: Database) -> dict[str, Any]:
    with db.transaction() as tx:
        return {
            table: tx.all(f"SELECT * FROM {table} ORDER BY 1, 2")
            for table in (
                "workflow_runs",
                "workflow_steps",
                "delivery_claims",
                "workflow_enrollments",
                "admission_refusals",
            )
        }


def test_redelivery_changes_nothing_and_resumes_dispatch(db: Database, conn: str) -> None:
    admitted = bind_workflow(db, "a")
    refused = bind_workflow(db, "r", rule="false")
    event_id = emit_event(db, connection_id=conn)
    first = Published()
    admit_event(db, event_id, publish=first)
    before = _state(db)
    again = Published()
    result = admit_event(db, event_id, publish=again)
    assert _state(db) == before
    assert {o.workflow_id: o.outcome for o in result.outcomes} == {
        admitted: "handled",
        refused: "handled",
    }
    # The run's pending first step is published again (its first dispatch may have been lost).
    assert again.ids == first.ids and len(first.ids) == 1


def test_a_failed_admission_transaction_decides_nothing_and_the_redelivery_decides_all(
    db: Database, conn: str
) -> None:
    """Refusals commit with their delivery claims and the event's decided_at, or not at all:
    after a failure no pairing is half-decided (a claim without its explanation, or a refusal
    that a later decision contradicts), and the redelivery decides every pairing once."""
    once = bind_workflow(db, "once")
    ruled = bind_workflow(db, "ruled", rule="false")
    admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    event_id = emit_event(db, connection_id=conn)

    def crash() -> None:
        raise RuntimeError("injected: the admission transaction fails after deciding")

    with pytest.raises(PermanentError, match="injected"):
        admit_event(db, event_id, publish=Published(), seams=AdmissionSeams(before_commit=crash))
    # (shared.core.db reports any failure inside a transaction as a onceflow error.)
    assert count(db, "SELECT count(*) FROM delivery_claims WHERE event_id = :e", e=event_id) == 0
    assert count(db, "SELECT count(*) FROM admission_refusals WHERE event_id = :e", e=event_id) == 0
    assert (
        count(
            db,
            "SELECT count(*) FROM workflow_trigger_events WHERE id = :e AND decided_at IS NULL",
            e=event_id,
        )
        == 1
    )
    admit_event(db, event_id, publish=Published())
    assert count(db, "SELECT count(*) FROM delivery_claims WHERE event_id = :e", e=event_id) == 2
    reasons = {r["workflow_id"]: r["reason"] for r in refusals(db) if r["event_id"] == event_id}
    assert reasons == {once: "duplicate", ruled: "rule_not_matched"}
    assert (
        count(
            db,
            "SELECT count(*) FROM workflow_trigger_events WHERE id = :e AND decided_at IS NOT NULL",
            e=event_id,
        )
        == 1
    )


def test_a_stale_refusal_gives_way_to_the_decision_made_now(db: Database, conn: str) -> None:
    """A refusal row without a claim (left by an earlier release, which wrote refusals on a
    second connection before a transaction that then rolled back) never outlives the real
    decision: a run replaces it, and a different refusal reason overwrites it."""
    admitted = bind_workflow(db, "nwr", dedup="not_while_running")
    ruled = bind_workflow(db, "ruled", rule="false")
    event_id = emit_event(db, connection_id=conn)
    with db.transaction() as tx:
        for wf in (admitted, ruled):
            tx.execute(
                "INSERT INTO admission_refusals (tenant_id, event_id, workflow_id, reason,"
                " detail) VALUES ('acme', :e, :w, 'already_running', 'stale')",
                e=event_id,
                w=wf,
            )
    result = admit_event(db, event_id, publish=Published())
    assert result.outcome_for(admitted).outcome == "admitted"
    assert refusals(db, admitted) == []
    assert only_refusal(db, ruled)["reason"] == "rule_not_matched"


def test_an_event_with_nothing_bound_is_decided(db: Database, conn: str) -> None:
    event_id = emit_event(db, connection_id=conn)
    assert admit_event(db, event_id, publish=Published()).outcomes == ()
    assert (
        count(
            db,
            "SELECT count(*) FROM workflow_trigger_events WHERE id = :e AND decided_at IS NOT NULL",
            e=event_id,
        )
        == 1
    )


def test_admission_needs_one_pooled_connection_even_with_refusals(
    db: Database, conn: str, database_url: str
) -> None:
    """A pool of one (allowed by infra/) admits and refuses: the first release took a second
    connection for the refusals and waited 30 s for it, then nacked until dead-letter. Eight
    threads sharing a pool of two, each admitting an event with refusals, all finish: nobody
    holds one connection while waiting for another."""
    from shared.core.db import Database as Pool
    from shared.core.db import connector_from_env

    bind_workflow(db, "refuses", rule="false")
    bind_workflow(db, "runs", dedup="every_time")
    single = Pool(connector_from_env({"DATABASE_URL": database_url}), pool_size=1)
    try:
        started = time.monotonic()
        result = admit_event(single, emit_event(db, connection_id=conn), publish=Published())
        assert len(result.refused) == 1 and len(result.admitted) == 1
        assert time.monotonic() - started < 5
    finally:
        single.close()

    shared_pool = Pool(connector_from_env({"DATABASE_URL": database_url}), pool_size=2)
    events = [emit_event(db, connection_id=conn) for _ in range(8)]
    barrier = threading.Barrier(len(events))
    errors: list[BaseException] = []

    def admit(event_id: int) -> None:
        barrier.wait()
        try:
            admit_event(shared_pool, event_id, publish=Published())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=admit, args=(e,)) for e in events]
    try:
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert time.monotonic() - started < 20
    finally:
        shared_pool.close()
    assert (
        count(
            db,
            "SELECT count(*) FROM delivery_claims WHERE event_id = ANY(CAST(:e AS bigint[]))",
            e=events,
        )
        == 16
    )


def _wait_for_lock_wait(db: Database, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db.transaction() as tx:
            if tx.scalar("SELECT count(*) FROM pg_locks WHERE NOT granted"):
                return
        time.sleep(0.02)
    raise AssertionError("the second admission never blocked")


def test_backstop_partial_unique_index_catches_a_race_the_lock_would_have_prevented(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "nwr", dedup="not_while_running")
    event_a = emit_event(db, connection_id=conn)
    event_b = emit_event(db, connection_id=conn)
    unlocked = AdmissionSeams(take_locks=False, attempts=1)
    a_decided, release_a = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        a_decided.set()
        assert release_a.wait(30)

    def admit_a() -> None:
        admit_event(
            db,
            event_a,
            publish=Published(),
            seams=AdmissionSeams(take_locks=False, before_commit=hold),
        )

    def admit_b() -> None:
        try:
            admit_event(db, event_b, publish=Published(), seams=unlocked)
        except BaseException as exc:
            errors.append(exc)

    ta = threading.Thread(target=admit_a)
    ta.start()
    assert a_decided.wait(30)
    # B decides from a snapshot without A's uncommitted run: check-then-insert would admit it.
    tb = threading.Thread(target=admit_b)
    tb.start()
    _wait_for_lock_wait(db)  # B's insert waits on A's entry in the partial unique index
    release_a.set()
    ta.join(30)
    tb.join(30)
    (error,) = errors
    assert isinstance(error, TransientError)
    assert getattr(error.__cause__, "constraint", None) == "workflow_runs_one_active_per_record"
    assert count(db, "SELECT count(*) FROM workflow_runs WHERE status = 'running'") == 1
    # Redelivered (normal path), B is refused with the reason the lock would have given.
    assert admit_event(db, event_b, publish=Published()).outcomes[0].reason == "already_running"
    assert only_refusal(db, wf)["event_id"] == event_b


# --- poisoned messages, support's query, round trips ------------------------------------------


def _push(data: Any) -> dict[str, Any]:
    import base64
    import json

    return {"message": {"data": base64.b64encode(json.dumps(data).encode()).decode()}}


def test_poisoned_messages_are_recorded_and_acked(db: Database, conn: str) -> None:
    bind_workflow(db, "a")
    cases: list[Any] = [
        _push({"event_id": 999_999}),  # no such event
        _push({"event_id": "abc"}),
        _push({"something": 1}),
        {"message": {"data": "%%% not base64"}},
        "not even an object",
    ]
    for i, data in enumerate(cases):
        assert admit_delivery(db, data, message_id=f"m{i}", publish=Published()) is None
    with db.transaction() as tx:
        rows = tx.all("SELECT message_id, reason FROM poisoned_messages ORDER BY id")
    assert [r["message_id"] for r in rows] == [f"m{i}" for i in range(len(cases))]
    assert "does not exist" in rows[0]["reason"]
    # A good message goes through the same door.
    good = admit_delivery(
        db, _push({"event_id": emit_event(db, connection_id=conn)}), publish=Published()
    )
    assert good is not None and good.outcomes[0].outcome == "admitted"


def test_support_answers_why_a_record_did_not_run_with_one_query(db: Database, conn: str) -> None:
    bind_workflow(db, "nope", rule="false")
    admit_event(db, emit_event(db, connection_id=conn), publish=Published())
    with db.transaction() as tx:
        rows = refusals_for_record(tx, tenant_id="acme", record_key=f"{conn}:contact:101")
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in tx.all(
                "EXPLAIN SELECT * FROM admission_refusals WHERE tenant_id = 'acme' "
                "AND record_key = 'x' ORDER BY created_at DESC"
            )
        )
    assert [(r["workflow_name"], r["reason"]) for r in rows] == [("nope", "rule_not_matched")]
    assert "admission_refusals_record" in plan


@pytest.mark.parametrize("k", [1, 10, 50])
def test_round_trips_per_event_do_not_grow_with_bindings(db: Database, conn: str, k: int) -> None:
    for i in range(k):
        bind_workflow(db, f"wf-{i}", dedup="every_time")
    event_id = emit_event(db, connection_id=conn)
    db.round_trips.reset()
    result = admit_event(db, event_id, publish=Published())
    assert len(result.admitted) == k
    # BEGIN + context (+ locks) in one round trip, admit (runs, claims, steps for all K) +
    # COMMIT in the other.
    assert db.round_trips.count == 2
    # With a refusal: still two (the admit statement writes the refusals too).
    bind_workflow(db, "refuses", rule="false")
    second = emit_event(db, connection_id=conn)
    db.round_trips.reset()
    result = admit_event(db, second, publish=Published())
    assert db.round_trips.count == 2
    assert [o.reason for o in result.refused] == ["rule_not_matched"]
    assert [r["reason"] for r in refusals(db) if r["event_id"] == second] == ["rule_not_matched"]
