"""Echo suppression end to end, over real HTTP: crm.update commits an echo marker, the fake
CRM applies the write and sends its signed v3 webhook to the real webhook function, the inbox
drains it into a trigger event, and admission refuses it as `echo_suppressed`, visible by
record. A person's change to the same field afterwards is admitted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import functions_framework
import pytest
from werkzeug.serving import make_server

from devstack.fakecrm import FakeCrm
from shared.admission import admit as admission
from shared.blocks import crm
from shared.core.db import Database
from shared.ingest.inbox import drain_inbox
from shared.publishing import versions
from shared.workflows import scope
from tests.blocks_support import StepRunner, fake_crm, seed_connection, seed_tenant

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def webhook_url(db: Database) -> Iterator[str]:
    app = functions_framework.create_app(target="webhook", source=str(ROOT / "main.py"))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")  # this test drains the inbox itself
    with fake_crm(monkeypatch) as server:
        monkeypatch.setenv("FAKECRM_APP_SECRET", server.config.app_secret)
        yield server


def _events(db: Database) -> list[int]:
    drain_inbox(db, budget_seconds=10, until_empty=True)
    with db.transaction() as tx:
        return [
            int(r["id"])
            for r in tx.all(
                "SELECT id FROM workflow_trigger_events "
                "WHERE event_type = 'hubspot.contact.property_changed' ORDER BY id"
            )
        ]


def _watching_lifecycle_stage(db: Database, fake: FakeCrm) -> tuple[str, str]:
    """Tenant acme, its connection to the fake CRM, and an active workflow triggered by
    lifecyclestage changes: (connection id, workflow id)."""
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    source = {
        "name": "on-lifecycle",
        "tenant": "acme",
        "trigger": {"events": ["hubspot.contact.property_changed"], "watch": ["lifecyclestage"]},
        "steps": [{"id": "start", "type": "end"}],
    }
    with db.transaction() as tx:
        published = versions.publish(tx, json.dumps(source), tenant_id="acme")
        versions.activate(
            tx,
            tenant_id="acme",
            workflow_id=published.workflow_id,
            version_id=published.version_id,
        )
    return connection_id, str(published.workflow_id)


def test_crm_update_echo_is_refused_and_a_person_change_is_admitted(
    db: Database, fake: FakeCrm, webhook_url: str
) -> None:
    connection_id, workflow_id = _watching_lifecycle_stage(db, fake)
    contact = fake.create_record("contacts", {"email": "lead@x.io"}, ("CRM_UI", "userId:7"))
    fake.config.webhook_url = f"{webhook_url}/hubspot/{connection_id}"

    step = StepRunner(db, "crm.update", connection_id=connection_id)
    step.run(
        crm.UPDATE,
        {
            "object_type": "contacts",
            "object_id": contact.id,
            "properties": {"lifecyclestage": "lead"},
        },
    )
    assert fake.webhooks.wait_idle()
    delivered = [w for w in fake.state()["webhooks"] if w["status"] is not None]
    assert delivered and all(200 <= w["status"] < 300 for w in delivered), delivered
    events = _events(db)
    with db.transaction() as tx:
        debug = (
            tx.all("SELECT * FROM webhook_inbox"),
            tx.all("SELECT id, event_type, changed_fields FROM workflow_trigger_events"),
        )
    assert len(events) == 1, debug
    echo_event = events[0]
    result = admission.admit_event(db, echo_event, publish=lambda ids: None)
    assert [o.reason for o in result.outcomes] == ["echo_suppressed"]
    record_key = scope.record_key(connection_id, "contact", contact.id)
    with db.transaction() as tx:
        by_record = admission.refusals_for_record(tx, tenant_id="acme", record_key=record_key)
    assert [r["reason"] for r in by_record] == ["echo_suppressed"]
    assert str(by_record[0]["workflow_id"]) == workflow_id

    # The same field changed by a person in the CRM is a real trigger.
    fake.update_record(
        "contacts", contact.id, {"lifecyclestage": "customer"}, ("CRM_UI", "userId:7")
    )
    assert fake.webhooks.wait_idle()
    events = _events(db)
    assert len(events) == 2
    result = admission.admit_event(db, events[1], publish=lambda ids: None)
    assert [o.reason for o in result.outcomes] == [None]
    assert result.outcomes[0].run_id is not None


def test_crm_create_records_markers_so_its_own_property_changes_are_refused(
    db: Database, fake: FakeCrm, webhook_url: str
) -> None:
    """HubSpot sends a propertyChange for every property set at creation. Without markers a
    workflow that creates a contact with a watched property triggers every workflow bound to
    that property, itself included (the first release recorded none for crm.create)."""
    connection_id, _ = _watching_lifecycle_stage(db, fake)
    fake.config.webhook_url = f"{webhook_url}/hubspot/{connection_id}"
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    created = step.run(
        crm.CREATE,
        {"object_type": "contacts", "properties": {"email": "x@y.io", "lifecyclestage": "lead"}},
    )
    assert fake.webhooks.wait_idle()
    events = _events(db)
    assert events, "the fake sent no propertyChange for the create"
    reasons = [
        o.reason
        for e in events
        for o in admission.admit_event(db, e, publish=lambda ids: None).outcomes
    ]
    assert reasons and set(reasons) == {"echo_suppressed"}, reasons
    with db.transaction() as tx:
        marker = tx.one(
            "SELECT m.object_id, m.sent_at, s.side_effect_started_at FROM echo_markers m"
            " JOIN workflow_steps s ON s.id = m.step_id WHERE m.field = 'lifecyclestage'"
        )
    assert marker is not None and marker["object_id"] == created.output["id"]
    # Sent when the at-most-once mark was set, before the request left, not after it returned.
    assert marker["sent_at"] == marker["side_effect_started_at"]
