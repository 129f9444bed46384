"""Vendor-neutral workflows (issue 28 item 2): object kinds and event types a workflow writes
once, read in each CRM's own terms.

A workflow names contact, company, deal, task or note (or a CRM's own name for one); each
provider declares its names (`Provider.object_kinds`) and the registry is the one place they
are read (shared/providers/registry.py). `crm.<kind>.<action>` triggers on that event of
whichever CRM sends it. The HubSpot half of the shipped example runs end to end in
tests/test_examples_engine.py (`new-company-any-crm`); this file is its Pipedrive half, up to
the port (the Pipedrive adapter is built elsewhere).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from devstack import seed
from shared import triggers
from shared.admission import admit as admission
from shared.blocks import crm
from shared.blocks.base import BlockContext, BlockFailure
from shared.core.db import Database
from shared.ingest.inbox import drain_inbox
from shared.providers import kinds, registry
from shared.publishing import subscriptions, versions
from shared.publishing.validate import validate_file, validate_text
from tests.admission_support import make_tenant
from tests.ingest_support import (
    PIPEDRIVE_CREDENTIALS,
    basic_auth,
    make_connection,
    trigger_events,
    webhook_client,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "workflows" / "new-company-any-crm.yaml"


def test_pipedrive_names_each_neutral_kind_its_own_way_and_takes_either() -> None:
    pipedrive = registry.get("pipedrive")
    hubspot = registry.get("hubspot")
    assert pipedrive is not None and hubspot is not None
    # Neutral -> Pipedrive's own (what its adapter sends: /api/v2/persons, …).
    assert [
        pipedrive.own_object_kind(k) for k in ("contact", "company", "deal", "task", "note")
    ] == [
        "person",
        "organization",
        "deal",
        "activity",
        "note",
    ]
    # Any spelling a workflow may use -> the neutral kind events and record keys carry.
    for name, kind in [
        ("contacts", "contact"),
        ("Person", "contact"),
        ("persons", "contact"),
        ("organization", "company"),
        ("organizations", "company"),
        ("activities", "task"),
        ("notes", "note"),
    ]:
        assert registry.object_kind(name, "pipedrive") == kind, name
    # HubSpot's names are onceflow's: a Pipedrive word means nothing there.
    assert hubspot.own_object_kind("companies") == "company"
    assert registry.object_kind("person", "hubspot") is None
    assert registry.object_kind("person") == "contact"  # no provider known: any CRM's word
    assert registry.object_kind("widget") is None


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")  # the tests drain the inbox themselves
    monkeypatch.setenv("PIPEDRIVE_CREDENTIALS_ACME", PIPEDRIVE_CREDENTIALS)
    yield webhook_client()


def pipedrive_connection(db: Database) -> str:
    make_tenant(db, balance=1000)  # enough credits for the runs admission starts
    return make_connection(db, provider="pipedrive", secret_env="PIPEDRIVE_CREDENTIALS_ACME")


def _context(db: Database, connection_id: str) -> BlockContext:
    return BlockContext(
        tenant_id="acme",
        run_id="r",
        step_id="s",
        step_key="s0",
        attempt=1,
        idempotency_key="k",
        scope={},
        dry_run=True,
        connection_id=connection_id,
        db=db,  # the step's database, as the executor hands it down
    )


def test_a_crm_step_on_a_pipedrive_connection_resolves_pipedrives_names(db: Database) -> None:
    """The crm blocks resolve a config's kind on the step's connection: Pipedrive's `person`
    is the neutral `contacts` the port is given, which its adapter sends as `person`; the
    same word on a HubSpot connection is refused before any call."""
    connection_id = pipedrive_connection(db)
    assert kinds.provider_of(db, connection_id) == "pipedrive"
    for name in ("person", "contact", "contacts"):
        config = crm.CreateConfig(object_type=name, properties={"name": "Ada"})
        result = crm.execute_create(_context(db, connection_id), config)
        assert result.output is not None and result.output["object_type"] == "contacts"
    found = registry.get(kinds.provider_of(db, connection_id) or "")
    assert found is not None and found.own_object_kind("contacts") == "person"

    hubspot_connection = make_connection(db)
    with pytest.raises(BlockFailure) as refused:
        crm.execute_create(
            _context(db, hubspot_connection),
            crm.CreateConfig(object_type="person", properties={"name": "Ada"}),
        )
    assert refused.value.outcome_code == "PROVIDER_REJECTED"
    with pytest.raises(ValidationError, match="no object kind"):
        crm.CreateConfig(object_type="widget", properties={"name": "Ada"})


def test_the_example_binds_to_both_crms_and_a_pipedrive_organization_starts_it(
    client: Any, db: Database
) -> None:
    """`crm.company.created` binds to HubSpot's and Pipedrive's company creation; a Pipedrive
    organization added (webhook v2) becomes `pipedrive.company.created` and is admitted for
    the very file the HubSpot fake runs (tests/test_examples_engine.py)."""
    report = validate_file(EXAMPLE)
    assert report.ok and not report.problems, [str(p) for p in report.problems]
    assert report.definition is not None
    bound = triggers.binding_event_types(report.definition.trigger, "w")
    assert set(bound) == {"hubspot.company.created", "pipedrive.company.created"}
    definition = report.definition.model_dump(mode="json")
    # Reconcile subscribes each provider to its own part of it.
    assert subscriptions.desired_subscriptions("hubspot", [definition]).keys == {
        ("company", "creation", None)
    }

    connection_id = pipedrive_connection(db)
    with db.transaction() as tx:
        published = versions.publish(tx, EXAMPLE.read_text(), filename=str(EXAMPLE))
        versions.activate(
            tx,
            tenant_id="acme",
            workflow_id=published.workflow_id,
            version_id=published.version_id,
        )
    body = {
        "meta": {
            "action": "create",
            "entity": "organization",
            "entity_id": "31",
            "id": "org-evt-1",
            "company_id": "8087566",
            "user_id": "777",
            "change_source": "app",
            "attempt": 1,
            "timestamp": "2026-12-01T10:00:00.000Z",
            "version": "2.0",
        },
        "data": {"id": 31, "name": "Acme"},
        "previous": None,
    }
    answer = client.post(
        f"/pipedrive/{connection_id}", data=json.dumps(body).encode(), headers=basic_auth()
    )
    assert answer.status_code == 200
    drain_inbox(db, budget_seconds=10, until_empty=True)
    (event,) = trigger_events(db)
    assert (event["event_type"], event["record_object_type"]) == (
        "pipedrive.company.created",
        "company",
    )
    assert event["payload"]["meta"]["entity"] == "organization"  # the vendor's name is kept
    result = admission.admit_event(db, int(event["id"]), publish=lambda ids: None)
    (outcome,) = result.outcomes
    assert (outcome.workflow_id, outcome.reason) == (str(published.workflow_id), None)
    assert outcome.run_id is not None


def test_a_record_expression_may_name_the_kind_in_pipedrives_words(
    client: Any, db: Database
) -> None:
    """A deal's person named `person` in a record expression is the same record (same key)
    as that person's own events, which carry the neutral `contact`."""
    connection_id = pipedrive_connection(db)
    with db.transaction() as tx:
        seed.workflow(
            tx,
            "acme",
            "deal-person",
            {
                "events": ["pipedrive.deal.created"],
                "record": '{"id": trigger.data.person_id, "object_type": "person"}',
            },
        )
    body = {
        "meta": {
            "action": "create",
            "entity": "deal",
            "entity_id": "5",
            "id": "deal-evt-1",
            "user_id": "777",
            "change_source": "app",
            "timestamp": "2026-12-01T10:00:00.000Z",
        },
        "data": {"id": 5, "title": "Big", "person_id": 8},
    }
    client.post(f"/pipedrive/{connection_id}", data=json.dumps(body).encode(), headers=basic_auth())
    drain_inbox(db, budget_seconds=10, until_empty=True)
    (event,) = trigger_events(db)
    result = admission.admit_event(db, int(event["id"]), publish=lambda ids: None)
    (outcome,) = result.outcomes
    assert outcome.reason is None, outcome.detail
    with db.transaction() as tx:
        key = tx.scalar(
            "SELECT record_key FROM workflow_runs WHERE id = CAST(:r AS uuid)", r=outcome.run_id
        )
    assert key == f"{connection_id}:contact:8"


HEAD = "name: w\ntenant: acme\n"


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (
            "trigger: {events: [crm.organization.created]}\nsteps:\n  - {id: a, type: end}\n",
            (3, 20),
            "did you mean 'crm.company.created'",
        ),
        (
            "trigger: {events: [pipedrive.person.created]}\nsteps:\n  - {id: a, type: end}\n",
            (3, 20),
            "did you mean 'pipedrive.contact.created'",
        ),
        (
            "trigger: {events: [crm.contact.created]}\nsteps:\n"
            "  - id: a\n    type: crm.get\n    config: {object_type: widget, object_id: '1'}\n",
            (7, 27),
            "'widget' is no object kind",
        ),
        (
            "trigger: {events: [hubspot.contact.created]}\nsteps:\n"
            "  - id: a\n    type: crm.get\n    config: {object_type: person, object_id: '1'}\n",
            (7, 27),
            "'person' is no object kind on HubSpot",
        ),
    ],
    ids=["neutral-event-in-vendor-words", "vendor-event-in-vendor-words", "no-kind", "wrong-crm"],
)
def test_validation_points_at_an_unknown_kind(
    text: str, where: tuple[int, int], message: str
) -> None:
    report = validate_text(HEAD + text, "w.yaml")
    (error,) = report.errors
    assert message in error.message, str(error)
    assert (error.line, error.column) == where, str(error)


def test_validation_takes_neutral_kinds_and_the_providers_own() -> None:
    for trigger, kind in [
        ("crm.contact.created", "contacts"),
        ("crm.task.created", "task"),
        ("pipedrive.contact.created", "person"),
        ("pipedrive.task.property_changed", "activity"),
        ("hubspot.deal.created", "deal"),
    ]:
        text = (
            f"trigger: {{events: [{trigger}], watch: [subject]}}\nsteps:\n"
            f"  - id: a\n    type: crm.get\n    config: {{object_type: {kind}, object_id: '1'}}\n"
        )
        report = validate_text(HEAD + text, "w.yaml")
        assert report.errors == [], [str(p) for p in report.errors]


def test_a_wait_on_any_crms_event_waits_for_its_connections() -> None:
    on = registry.event_type_on
    assert on("pipedrive", "crm.contact.property_changed") == "pipedrive.contact.property_changed"
    assert on("hubspot", "crm.contact.property_changed") == "hubspot.contact.property_changed"
    assert on("standard", "crm.contact.created") == "crm.contact.created"  # no CRM: as written
    assert on("pipedrive", "hubspot.deal.created") == "hubspot.deal.created"


@pytest.mark.parametrize(("kind", "ok"), [("person", True), ("companies", True), ("widget", False)])
def test_a_crm_poll_source_takes_neutral_kinds_and_a_crms_own(kind: str, ok: bool) -> None:
    text = (
        "trigger:\n  dedup: every_time\n  poll:\n    every_seconds: 600\n"
        "    stamp_policy: on_success\n    crm:\n"
        "      connection: 0c0ffee0-5a1e-4000-8000-00000000a11c\n"
        f"      object_type: {kind}\n      stamp: onceflow_routed_at\n"
        "steps:\n  - {id: a, type: end}\n"
    )
    report = validate_text(HEAD + text, "w.yaml")
    assert [p.where for p in report.errors] == ([] if ok else ["trigger.poll.crm.object_type"])


def test_a_generic_senders_own_names_are_left_as_it_sent_them() -> None:
    """Only providers that declare kinds are renamed: a Standard Webhooks sender's
    `contacts.updated` about `contacts` stays its own (it is no CRM of onceflow's)."""
    body = json.dumps(
        {
            "type": "contacts.updated",
            "timestamp": "2026-12-01T10:00:00Z",
            "data": {"object_type": "contacts", "id": "7"},
        }
    ).encode()
    (event,) = registry.normalize("standard", body, {"webhook-id": "msg_1"})
    assert (event.event_type, event.object_type) == ("standard.contacts.updated", "contacts")
