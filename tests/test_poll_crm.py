"""Polling triggers over a CRM search (shared/triggers/poll.py), through the real HubSpot port
against the fake CRM over HTTP: paging, each record enrolled once while stamps land late, the
stamp written back as a property (with its echo marker), a stamp the CRM refused owed until
written, a cleared stamp as a new generation, and sources refused by validate or activation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack import seed
from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.core.db import Database
from shared.port.interface import PortError
from shared.publishing.validate import DefinitionInvalid, validate_text
from shared.steps.cancel import cancel_run
from shared.triggers import poll
from tests.admission_support import activate_text, admit, count, finish_run, settle
from tests.blocks_support import TENANT, fake_crm, seed_connection, seed_tenant

# A pass's time budget is tested in test_poll_triggers.py; here a slow machine must not end a
# pass early.
UNBOUNDED = 3600.0
STAMP = "onceflow_enrolled_at"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    config = FakeCrmConfig(token="tok", rate_limit_max=100_000)
    with fake_crm(monkeypatch, config) as server:
        yield server


@pytest.fixture
def connection(db: Database, fake: FakeCrm) -> str:
    seed_tenant(db, credits=100_000)
    connection_id = seed_connection(db, fake.url)
    set_window(db, connection_id, 10_000)
    return connection_id


# Windows are fixed and aligned to the epoch (shared/sql/throttle.sql): with the default 10 s a
# pass that straddles a boundary gets a fresh window mid-pass (the CI run that failed this
# test). A window of 10^6 s makes that a 1-in-500,000 chance for a 2 s pass.
WIDE_WINDOW_SECONDS = 1_000_000


def set_window(db: Database, connection_id: str, calls: int) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET rate_limit_per_window = :n, rate_limit_window_seconds = :w"
            " WHERE id = :c",
            n=calls,
            w=WIDE_WINDOW_SECONDS,
            c=connection_id,
        )
        tx.execute(
            "DELETE FROM throttle_windows WHERE scope = 'connection' AND subject = :c",
            c=connection_id,
        )


def source(connection: str, policy: str = "on_success", *, object_type: str = "contact") -> str:
    dedup = "once_per_record" if policy == "on_attempt" else "not_while_running"
    return (
        f"name: leads\ntenant: {TENANT}\ntrigger:\n  dedup: {dedup}\n  poll:\n"
        "    every_seconds: 300\n"
        f"    crm: {{connection: {connection}, object_type: {object_type}, stamp: {STAMP},\n"
        "          filters: [{property: lifecyclestage, operator: EQ, value: lead}]}\n"
        f"    stamp_policy: {policy}\n"
        "steps:\n  - {id: done, type: end}\n"
    )


def contacts(fake: FakeCrm, n: int, stage: str) -> list[str]:
    return [
        fake.create_record(
            "contacts", {"email": f"{stage}{i}@x.test", "lifecyclestage": stage}, ("IMPORT", "")
        ).id
        for i in range(n)
    ]


def source_of(db: Database, workflow_id: str) -> poll.PollSource:
    with db.transaction() as tx:
        (row,) = [r for r in poll.active_sources(tx) if r[0] == workflow_id]
    return poll.load_source(*row)


def events(db: Database, workflow_id: str) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT id, record_object_id AS key, payload FROM workflow_trigger_events"
            " WHERE event_type = :e ORDER BY id",
            e=poll.event_type_for(workflow_id),
        )


def stamped(fake: FakeCrm) -> set[str]:
    return {r["id"] for r in fake.records("contacts") if r["properties"].get(STAMP)}


def test_each_lead_enrolled_once_while_stamps_land_late(
    db: Database, fake: FakeCrm, connection: str
) -> None:
    leads = contacts(fake, 150, "lead")
    contacts(fake, 40, "customer")
    workflow_id = activate_text(db, source(connection))
    src = source_of(db, workflow_id)
    first = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert (first.rows, first.emitted, first.pages) == (150, 150, 2)
    found = events(db, workflow_id)
    assert sorted(e["key"] for e in found) == sorted(leads)
    assert found[0]["payload"]["properties"]["lifecyclestage"] == "lead"
    # Re-polled while the runs haven't finished: nothing new.
    assert poll.poll_pass(db, src, budget_seconds=UNBOUNDED).emitted == 0
    for event in found[:2]:
        settle(db, event["id"], "succeeded")
    third = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert (third.stamped, third.emitted) == (2, 0)
    assert stamped(fake) == {found[0]["key"], found[1]["key"]}
    # The stamp is onceflow's own write: announced by an echo marker before it was sent.
    assert count(db, "SELECT count(*) FROM echo_markers WHERE field = :f", f=STAMP) == 2
    # Stamped records have left the search.
    assert poll.poll_pass(db, src, budget_seconds=UNBOUNDED).rows == 148


def test_on_attempt_stamps_after_paging_and_a_cleared_stamp_starts_a_new_run(
    db: Database, fake: FakeCrm, connection: str
) -> None:
    leads = contacts(fake, 120, "lead")
    workflow_id = activate_text(db, source(connection, "on_attempt"))
    src = source_of(db, workflow_id)
    report = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    # Stamping after the paging means no page was shifted: every lead was seen and started.
    assert (report.emitted, report.stamped) == (120, 120)
    assert stamped(fake) == set(leads)
    first_runs = [admit(db, e["id"]) for e in events(db, workflow_id)]
    assert all(first_runs)
    assert poll.poll_pass(db, src, budget_seconds=UNBOUNDED).rows == 0
    fake.store.records["contacts"][leads[5]].properties[STAMP] = ""  # the CRM user clears it
    # While generation 1's run is still going, the record is left alone.
    assert poll.poll_pass(db, src, budget_seconds=UNBOUNDED).waiting == 1
    (run,) = [
        r for e, r in zip(events(db, workflow_id), first_runs, strict=True) if e["key"] == leads[5]
    ]
    finish_run(db, run, "succeeded")
    again = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert (again.emitted, again.stamped) == (1, 1)
    last = events(db, workflow_id)[-1]
    assert (last["key"], last["payload"]["generation"]) == (leads[5], 2)
    # Generation 2 starts a new run under once_per_record: not refused as a duplicate.
    second_run = admit(db, last["id"])
    assert second_run is not None and second_run not in first_runs


def test_a_stamp_the_crm_refused_is_owed_and_written_on_the_next_pass(
    db: Database, fake: FakeCrm, connection: str
) -> None:
    (lead,) = contacts(fake, 1, "lead")
    workflow_id = activate_text(db, source(connection, "on_attempt"))
    src = source_of(db, workflow_id)
    fake.add_fault(action="rate_limit", method="PATCH", times=5)
    with pytest.raises(PortError):
        poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert len(events(db, workflow_id)) == 1 and stamped(fake) == set()
    fake.store.faults.clear()
    report = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert (report.emitted, report.stamped) == (0, 1)
    assert stamped(fake) == {lead} and len(events(db, workflow_id)) == 1


def test_a_record_whose_run_a_person_cancelled_is_stamped_not_started_again(
    db: Database, fake: FakeCrm, connection: str
) -> None:
    (lead,) = contacts(fake, 1, "lead")
    workflow_id = activate_text(db, source(connection, "on_success"))
    src = source_of(db, workflow_id)
    assert poll.poll_pass(db, src, budget_seconds=UNBOUNDED).emitted == 1
    (event,) = events(db, workflow_id)
    cancelled = cancel_run(db, str(admit(db, event["id"])), by="ops:ann", reason="wrong lead")
    assert cancelled is not None and cancelled.moved
    report = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert report.emitted == 0  # not started again
    assert report.cancelled == 1
    assert stamped(fake) == {lead} and len(events(db, workflow_id)) == 1
    assert poll.poll_pass(db, src, budget_seconds=UNBOUNDED).rows == 0


def test_activation_refuses_a_connection_that_is_not_the_tenants(
    db: Database, fake: FakeCrm, connection: str
) -> None:
    with db.transaction() as tx:
        seed.tenant(tx, "globex")
        theirs = str(
            tx.scalar(
                "INSERT INTO connections (tenant_id, provider, webhook_secret_env) VALUES"
                " ('globex', 'hubspot', 'X') RETURNING id"
            )
        )
    with pytest.raises(DefinitionInvalid) as refused:
        activate_text(db, source(theirs))
    (problem,) = refused.value.report.errors
    assert (
        problem.where == "trigger.poll.crm.connection" and "no such connection" in problem.message
    )


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        (("object_type: contact", "object_type: ticket"), "trigger.poll.crm.object_type", "one of"),
        (("operator: EQ", "operator: LIKE"), "trigger.poll.crm.filters[0].operator", "one of"),
        (
            ("property: lifecyclestage", f"property: {STAMP}"),
            "trigger.poll.crm.filters[0].property",
            "filtered by onceflow",
        ),
        (("connection: ", "connection: x"), "trigger.poll.crm.connection", "UUID"),
    ],
)
def test_bad_crm_sources_are_located_validate_errors(
    change: tuple[str, str], path: str, words: str
) -> None:
    text = source("5b0c0000-0000-4000-8000-000000000000").replace(*change)
    report = validate_text(text, "wf.yaml")
    problems = [p for p in report.errors if p.where == path]
    assert problems, report.problems
    assert words in problems[0].message and problems[0].line is not None


def test_the_poll_keeps_within_the_connections_throttle_window(
    db: Database, fake: FakeCrm, connection: str
) -> None:
    contacts(fake, 150, "lead")
    workflow_id = activate_text(db, source(connection, "on_attempt"))
    src = source_of(db, workflow_id)
    set_window(db, connection, 1)  # one call this window: the first search page
    first = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert (first.pages, first.emitted, first.stamped) == (1, 100, 0)
    assert first.throttled == 1 + 100  # the second page, and the 100 stamps now owed
    assert stamped(fake) == set()
    set_window(db, connection, 10_000)  # the next window
    second = poll.poll_pass(db, src, budget_seconds=UNBOUNDED)
    assert (second.emitted, second.stamped, second.throttled) == (50, 150, 0)
    assert len(stamped(fake)) == 150 and len(events(db, workflow_id)) == 150
