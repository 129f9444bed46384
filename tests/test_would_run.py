""" "Would this record enroll?" agrees with admission: for each case the question is asked first
(in a READ ONLY transaction, the record read from the fake CRM through the connection's port),
then the same change is announced as a real event and admitted by real admission on the same
state; both must give the same outcome, reason and detail. Asking changes no table."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm
from shared.admission.admit import admit_event
from shared.admission.would_run import WouldRun, WouldRunError, would_run
from shared.core.db import Database
from shared.ingest.echo import record_echo_marker
from shared.providers import connect
from tests.admission_support import (
    EVENT_TYPE,
    Published,
    activate_text,
    admit,
    bind_workflow,
    emit_event,
    make_tenant,
)
from tests.blocks_support import fake_crm, seed_connection
from tests.ops_support import mint

TENANT = "acme"
PAID_ENTRY = [
    {"id": "fetch", "type": "crm.get", "config": {"object_type": "contacts", "object_id": "1"}}
]


@dataclass
class Scene:
    db: Database
    conn: str
    crm: FakeCrm

    def contact(self, **properties: Any) -> str:
        """A contact in the fake CRM; its id."""
        return connect.port_for(self.db, self.conn).create("contact", properties).id

    def key(self, object_id: str) -> str:
        return f"{self.conn}:contact:{object_id}"

    def sql(self, statement: str, **params: Any) -> None:
        with self.db.transaction() as tx:
            tx.execute(statement, **params)


@pytest.fixture
def scene(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scene]:
    with fake_crm(monkeypatch) as crm:
        make_tenant(db, TENANT)
        yield Scene(db, seed_connection(db, crm.url), crm)


def _announce(scene: Scene, answer: WouldRun, object_id: str) -> int:
    """The event the CRM would send now for the record: the carried fields and its
    properties, as would-run assumed them."""
    return emit_event(
        scene.db,
        connection_id=scene.conn,
        event_type=answer.event_type,
        object_id=object_id,
        changed=dict(answer.changed_fields),
        payload={
            "properties": {
                k: v
                for k, v in answer.record.items()
                if k not in {"id", "object_type", "key", "connection_id"}
            }
        },
    )


def _paused(scene: Scene, wf: str, state: str = "open", trials: int = 0) -> None:
    scene.sql(
        "INSERT INTO workflow_breakers (workflow_id, state, consecutive_failures, opened_at,"
        " reason, probes_admitted) VALUES (:w, :s, 5, now(), 'five failures in a row', :t)",
        w=wf,
        s=state,
        t=trials,
    )


def _enrolled_before(scene: Scene, object_id: str, dedup: str) -> str:
    wf = bind_workflow(scene.db, "wf", dedup=dedup, rule='record.lifecyclestage == "lead"')
    earlier = emit_event(
        scene.db, connection_id=scene.conn, object_id=object_id, changed={"lifecyclestage": "lead"}
    )
    assert admit(scene.db, earlier) is not None  # the run stays running
    return wf


def _matched(s: Scene, oid: str) -> str:
    return bind_workflow(s.db, "wf", rule='record.lifecyclestage == "lead"')


def _rule_false(s: Scene, oid: str) -> str:
    return bind_workflow(s.db, "wf", rule='record.lifecyclestage == "customer"')


def _rule_reads_unread_field(s: Scene, oid: str) -> str:
    return bind_workflow(s.db, "wf", rule='record.city == "Paris"', watch=["lifecyclestage"])


def _open_breaker(s: Scene, oid: str) -> str:
    wf = _matched(s, oid)
    _paused(s, wf)
    return wf


def _half_open_full(s: Scene, oid: str) -> str:
    wf = _matched(s, oid)
    _paused(s, wf, "half_open", trials=3)
    return wf


def _half_open_free(s: Scene, oid: str) -> str:
    wf = _matched(s, oid)
    _paused(s, wf, "half_open", trials=1)
    return wf


def _once_per_record(s: Scene, oid: str) -> str:
    return _enrolled_before(s, oid, "once_per_record")


def _not_while_running(s: Scene, oid: str) -> str:
    return _enrolled_before(s, oid, "not_while_running")


def _echo(s: Scene, oid: str) -> str:
    wf = bind_workflow(s.db, "wf", dedup="every_time", watch=["lifecyclestage"])
    with s.db.transaction() as tx:
        record_echo_marker(
            tx,
            connection_id=s.conn,
            object_type="contact",
            object_id=oid,
            fields={"lifecyclestage": "lead"},
            step_id=None,
        )
    return wf


def _paused_connection(s: Scene, oid: str) -> str:
    wf = _matched(s, oid)
    s.sql("UPDATE connections SET status = 'paused' WHERE id = CAST(:c AS uuid)", c=s.conn)
    return wf


def _no_credits(s: Scene, oid: str) -> str:
    s.sql("UPDATE tenants SET credit_balance = 0 WHERE id = :t", t=TENANT)
    return bind_workflow(s.db, "wf", steps=PAID_ENTRY)


def _no_record(s: Scene, oid: str) -> str:
    return bind_workflow(s.db, "wf", record="trigger.nowhere")


def _run_ended(s: Scene, oid: str) -> str:
    wf = _enrolled_before(s, oid, "not_while_running")
    s.sql("UPDATE workflow_runs SET status = 'succeeded', finished_at = now()")
    return wf


def _unreadable(s: Scene, oid: str) -> str:
    """A stored definition this release can't parse (a row another release wrote)."""
    wf = _matched(s, oid)
    with s.db.transaction() as tx:  # as tests/test_admission.py damages one
        tx.execute("ALTER TABLE workflow_versions DISABLE TRIGGER workflow_versions_no_update")
        tx.execute(
            "UPDATE workflow_versions SET definition = jsonb_set(definition, '{steps}', "
            '\'[{"id": "start", "type": 42}]\') WHERE workflow_id = CAST(:w AS uuid)',
            w=wf,
        )
        tx.execute("ALTER TABLE workflow_versions ENABLE TRIGGER workflow_versions_no_update")
    return wf


CASES: dict[str, tuple[Callable[[Scene, str], str], str | None]] = {
    "matched": (_matched, None),
    "rule_false": (_rule_false, "rule_not_matched"),
    "rule_reads_a_field_not_carried": (_rule_reads_unread_field, "rule_not_matched"),
    "breaker_open": (_open_breaker, "workflow_paused"),
    "half_open_trials_used_up": (_half_open_full, "workflow_paused"),
    "half_open_trial_free": (_half_open_free, None),
    "once_per_record": (_once_per_record, "duplicate"),
    "not_while_running": (_not_while_running, "already_running"),
    "not_while_running_after_the_run_ended": (_run_ended, None),
    "echo": (_echo, "echo_suppressed"),
    "connection_paused": (_paused_connection, "provider_suppressed"),
    "no_credits": (_no_credits, "insufficient_credits"),
    "no_record_identity": (_no_record, "missing_record_identity"),
    "definition_unreadable": (_unreadable, "definition_unreadable"),
}


def _row_counts(db: Database) -> dict[str, int]:
    with db.transaction() as tx:
        tables = [
            r["t"]
            for r in tx.all(
                "SELECT tablename AS t FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            )
        ]
        return {t: int(tx.scalar(f'SELECT count(*) FROM "{t}"')) for t in tables}


def _breaker(db: Database, wf: str) -> dict[str, Any] | None:
    with db.transaction() as tx:
        return tx.one(
            "SELECT state, probes_admitted FROM workflow_breakers WHERE workflow_id = :w", w=wf
        )


@pytest.mark.parametrize("case", list(CASES))
def test_would_run_agrees_with_admission(scene: Scene, case: str) -> None:
    arrange, expected = CASES[case]
    object_id = scene.contact(lifecyclestage="lead", city="Lyon")
    wf = arrange(scene, object_id)
    before, breaker_before = _row_counts(scene.db), _breaker(scene.db, wf)

    answer = would_run(scene.db, workflow_id=wf, record_key=scene.key(object_id))

    assert _row_counts(scene.db) == before, "asking wrote something"
    assert _breaker(scene.db, wf) == breaker_before  # no trial slot taken
    assert answer.reason == expected, answer.detail
    assert answer.would_run is (expected is None)
    result = admit_event(scene.db, _announce(scene, answer, object_id), publish=Published())
    decided = result.outcome_for(wf)
    assert decided.outcome == ("admitted" if answer.would_run else "refused")
    assert decided.reason == answer.reason
    assert decided.detail == answer.detail


def test_the_rule_reads_the_record_as_the_crm_has_it_now(scene: Scene) -> None:
    object_id = scene.contact(lifecyclestage="subscriber")
    wf = bind_workflow(
        scene.db, "wf", rule='record.lifecyclestage == "lead"', watch=["lifecyclestage"]
    )
    first = would_run(scene.db, workflow_id=wf, record_key=scene.key(object_id))
    assert first.reason == "rule_not_matched"
    assert "was false" in (first.detail or "")
    connect.port_for(scene.db, scene.conn).update("contact", object_id, {"lifecyclestage": "lead"})
    now = would_run(scene.db, workflow_id=wf, record_key=scene.key(object_id))
    assert now.would_run and now.changed_fields == {"lifecyclestage": "lead"}
    assert now.record["lifecyclestage"] == "lead" and now.event_type == EVENT_TYPE


def test_the_question_runs_in_a_read_only_transaction(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write slipped into the answer's transaction is refused by Postgres itself."""
    object_id = scene.contact(lifecyclestage="lead")
    wf = _matched(scene, object_id)

    def write_while_reading(tx: Any, connection_id: str) -> Any:
        tx.execute("UPDATE tenants SET credit_balance = 1 WHERE id = :t", t=TENANT)
        raise AssertionError("the write went through")

    with pytest.raises(Exception, match="read-only transaction"):
        would_run(
            scene.db,
            workflow_id=wf,
            record_key=scene.key(object_id),
            read_record=write_while_reading,
        )


def test_unknown_or_unbound(scene: Scene) -> None:
    object_id = scene.contact(lifecyclestage="lead")
    wf = _matched(scene, object_id)
    with pytest.raises(WouldRunError) as missing:
        would_run(scene.db, workflow_id=wf, record_key=scene.key(object_id), tenant_scope="another")
    assert missing.value.code == "not_found"
    with pytest.raises(WouldRunError) as unbound:
        would_run(
            scene.db,
            workflow_id=wf,
            record_key=scene.key(object_id),
            event_type="hubspot.deal.created",
        )
    assert unbound.value.code == "not_bound"


def test_the_dedup_rule_is_inlined_into_admissions_statement(db: Database) -> None:
    """admission_dedup (the one definition admission and would-run read) is a single-SELECT
    SQL function, inlined into the calling statement: no function scan, so admission's plan
    keeps its indexes and its snapshot."""
    with db.transaction() as tx:
        plan = tx.all(
            "EXPLAIN SELECT i.w, dd.reason FROM unnest(CAST(:w AS uuid[])) AS i (w)"
            " LEFT JOIN admission_dedup(CAST(:w AS uuid[]), CAST(:m AS text[]),"
            " CAST(:k AS text[])) dd ON dd.workflow_id = i.w",
            w=["00000000-0000-0000-0000-000000000001"],
            m=["not_while_running"],
            k=["c:contact:1"],
        )
    text = "\n".join(str(next(iter(r.values()))) for r in plan)
    assert "admission_dedup" not in text, text
    assert "workflow_runs" in text and "workflow_enrollments" in text, text


def test_the_record_page_asks_would_it_run_now(scene: Scene, client: Any) -> None:
    """The record page's form: the API's answer, in words, for the signed-in tenant."""
    object_id = scene.contact(lifecyclestage="lead")
    wf = _once_per_record(scene, object_id)  # enrolled once already
    client.post("/ui/login", data={"token": mint(scene.db, TENANT)})
    page = client.get("/ui", query_string={"record_key": scene.key(object_id)})
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and "Would it run now?" in html
    before = _row_counts(scene.db)
    asked = client.get(
        "/ui", query_string={"record_key": scene.key(object_id), "would_run": wf}
    ).get_data(as_text=True)
    assert 'data-reason="duplicate"' in asked and "No, because duplicate" in asked
    assert "already went through this workflow once" in asked
    assert _row_counts(scene.db) == before
    scene.sql("DELETE FROM workflow_enrollments")
    asked = client.get(
        "/ui", query_string={"record_key": scene.key(object_id), "would_run": wf}
    ).get_data(as_text=True)
    assert "Yes, a new run." in asked
    nonsense = client.get(
        "/ui", query_string={"record_key": scene.key(object_id), "would_run": "nope"}
    ).get_data(as_text=True)
    assert "Choose one of the workflows." in nonsense


def test_a_budget_is_said_beside_the_answer_never_a_reason(scene: Scene) -> None:
    object_id = scene.contact(lifecyclestage="lead")
    wf = activate_text(
        scene.db,
        "name: capped\ntenant: acme\n"
        "trigger: {events: [hubspot.contact.property_changed], watch: [lifecyclestage]}\n"
        "budget: {credits: 5, per: 1d}\n"
        "steps: [{id: done, type: end}]\n",
    )
    answer = would_run(scene.db, workflow_id=wf, record_key=scene.key(object_id))
    assert answer.would_run
    assert answer.notes == (
        "budget: 0 of 5 credits used in the current 1d window; a priced step that would go "
        "over it fails BUDGET_EXCEEDED with nothing sent",
    )


@pytest.mark.parametrize(
    ("held", "refused", "outcome"),
    [
        ("debounce: {period: 5s}", None, "debounced"),
        ("debounce: {period: 5s, key: 'trigger.nowhere'}", "missing_record_identity", "refused"),
        ("throttle: {limit: 10, period: 1h}", None, "admitted"),
    ],
)
def test_debounce_and_throttle_hold_a_start_as_admission_does(
    scene: Scene, held: str, refused: str | None, outcome: str
) -> None:
    object_id = scene.contact(lifecyclestage="lead")
    wf = activate_text(
        scene.db,
        "name: held\ntenant: acme\n"
        "trigger: {events: [hubspot.contact.property_changed], watch: [lifecyclestage], "
        f"{held}}}\nsteps: [{{id: done, type: end}}]\n",
    )
    answer = would_run(scene.db, workflow_id=wf, record_key=scene.key(object_id))
    assert answer.reason == refused, answer.detail
    if refused is None:
        assert answer.notes[0].startswith(held.split(":", maxsplit=1)[0] + ": ")
    decided = admit_event(
        scene.db, _announce(scene, answer, object_id), publish=Published()
    ).outcome_for(wf)
    assert decided.outcome == outcome
    assert decided.reason == answer.reason
    if refused is not None:
        assert decided.detail == answer.detail


@pytest.mark.parametrize(
    ("key", "refused", "outcome"),
    [
        ("record.lifecyclestage", None, "admitted"),
        ("trigger.nowhere", "missing_record_identity", "refused"),
    ],
)
def test_keyed_concurrency_is_said_as_admission_takes_it(
    scene: Scene, key: str, refused: str | None, outcome: str
) -> None:
    """Keyed concurrency (shared/admission/concurrency.py): a key admission can't have is
    refused alike; otherwise the limit is said beside the answer (it holds, never refuses)."""
    object_id = scene.contact(lifecyclestage="lead")
    wf = activate_text(
        scene.db,
        "name: keyed\ntenant: acme\n"
        "trigger: {events: [hubspot.contact.property_changed], watch: [lifecyclestage], "
        f"dedup: every_time}}\nconcurrency: {{key: '{key}', limit: 1}}\n"
        "steps: [{id: done, type: end}]\n",
    )
    answer = would_run(scene.db, workflow_id=wf, record_key=scene.key(object_id))
    assert answer.reason == refused, answer.detail
    if refused is None:
        assert answer.notes[0].startswith("concurrency: at most 1 runs run at once for key")
    decided = admit_event(
        scene.db, _announce(scene, answer, object_id), publish=Published()
    ).outcome_for(wf)
    assert decided.outcome == outcome
    assert decided.reason == answer.reason
