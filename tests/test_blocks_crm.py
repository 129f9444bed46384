"""CRM blocks against the fake CRM over real HTTP, with real step rows for the journal marks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.blocks import crm
from shared.blocks.base import BlockFailure
from shared.core.db import Database
from shared.providers import connect
from shared.providers.hubspot import versions
from tests.blocks_support import StepRunner, fake_crm, seed_connection, seed_tenant
from tests.crm_providers_support import CrmUnderTest


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch, FakeCrmConfig(token="tok")) as server:
        yield server


@pytest.fixture
def connection_id(db: Database, fake: FakeCrm) -> str:
    seed_tenant(db, credits=100)
    return seed_connection(db, fake.url)


# HubSpot refuses a task without hs_timestamp (https://developers.hubspot.com/docs/api/crm/tasks).
TASK = {
    "object_type": "tasks",
    "properties": {"hs_task_subject": "Call Ada", "hs_timestamp": "2026-12-03T10:00:00Z"},
}


def test_dropped_create_response_gives_one_record_and_outcome_unknown(
    db: Database, crm_under_test: CrmUnderTest
) -> None:
    """The vendor replay test, through onceflow: the same fault that made two records when the
    identical request was replayed now makes exactly one, and the step says OUTCOME_UNKNOWN.
    For every provider without write idempotency (HubSpot without a key property, Pipedrive)."""
    crm_ = crm_under_test
    crm_.drop_next_create()
    step = StepRunner(db, "crm.create", connection_id=crm_.connection_id)
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, crm_.create)
    assert err.value.outcome_code == "OUTCOME_UNKNOWN"
    assert err.value.error_class == "permanent"
    # Even if something ran the step again, the mark stops the second call.
    with pytest.raises(BlockFailure) as again:
        step.run(crm.CREATE, crm_.create)
    assert again.value.outcome_code == "OUTCOME_UNKNOWN"
    assert len(crm_.records()) == 1
    assert crm_.creates_sent() == 1
    with db.transaction() as tx:
        assert tx.scalar("SELECT credit_balance FROM tenants") == 98  # charged once


def test_create_succeeds_and_returns_the_record(
    db: Database, fake: FakeCrm, connection_id: str
) -> None:
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    result = step.run(crm.CREATE, TASK)
    assert result.output is not None
    assert result.output["object_type"] == "tasks"
    assert fake.records("tasks")[0]["id"] == result.output["id"]
    assert step.side_effect_started()


def test_rate_limited_create_withdraws_the_mark_and_the_retry_creates_once(
    db: Database, crm_under_test: CrmUnderTest
) -> None:
    crm_ = crm_under_test
    crm_.rate_limit_next()
    step = StepRunner(db, "crm.create", connection_id=crm_.connection_id)
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, crm_.create)
    assert err.value.error_class == "transient"
    assert err.value.retry_after == crm_.rate_limit_wait  # from the 429's own headers
    assert err.value.outcome_code == "PROVIDER_RATE_LIMITED"
    assert not step.side_effect_started()  # provably not applied: the retry may call
    # A retry before the 429's wait is over is parked by the connection's budget (the 429
    # left nothing until then), without calling the CRM.
    with pytest.raises(BlockFailure) as early:
        step.run(crm.CREATE, crm_.create)
    assert early.value.outcome_code == "THROTTLED" and "rate window is spent" in str(early.value)
    assert crm_.records() == []
    # The engine retries after `retry_after`: here that wait is over.
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connection_rate_budgets SET remaining_until = now()"
            " WHERE connection_id = CAST(:c AS uuid)",
            c=crm_.connection_id,
        )
    step.run(crm.CREATE, crm_.create)
    assert len(crm_.records()) == 1


def test_5xx_on_create_is_outcome_unknown_not_a_retry(
    db: Database, crm_under_test: CrmUnderTest
) -> None:
    crm_under_test.fail_next()
    step = StepRunner(db, "crm.create", connection_id=crm_under_test.connection_id)
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, crm_under_test.create)
    assert err.value.outcome_code == "OUTCOME_UNKNOWN"


def test_conflict_on_create_is_permanent_with_the_existing_id(
    db: Database, fake: FakeCrm, connection_id: str
) -> None:
    contact = {"object_type": "contact", "properties": {"email": "ada@x.io"}}
    first = StepRunner(db, "crm.create", connection_id=connection_id).run(crm.CREATE, contact)
    assert first.output is not None
    with pytest.raises(BlockFailure) as err:
        StepRunner(db, "crm.create", connection_id=connection_id).run(crm.CREATE, contact)
    assert err.value.outcome_code == "ALREADY_EXISTS" and err.value.error_class == "permanent"
    assert f"existing id {first.output['id']}" in str(err.value)


def test_dry_run_creates_nothing_charges_nothing_marks_nothing(
    db: Database, fake: FakeCrm, connection_id: str
) -> None:
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    result = step.run(crm.CREATE, TASK, dry_run=True)
    assert result.output is not None and result.output["dry_run"] is True
    assert fake.records("tasks") == [] and fake.state()["requests"] == []
    assert not step.side_effect_started()
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 0


def test_throttled_create_parks_without_an_attempt_and_without_a_mark(
    db: Database, fake: FakeCrm, connection_id: str
) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET rate_limit_per_window = 1, rate_limit_window_seconds = 60"
        )
    StepRunner(db, "crm.create", connection_id=connection_id).run(crm.CREATE, TASK)
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, TASK)
    assert err.value.outcome_code == "THROTTLED" and err.value.consumes_attempt is False
    assert not step.side_effect_started()
    assert len(fake.records("tasks")) == 1


def test_insufficient_credits_fails_before_the_call(
    db: Database, fake: FakeCrm, connection_id: str
) -> None:
    with db.transaction() as tx:
        tx.execute("UPDATE tenants SET credit_balance = 1")
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, TASK)
    assert err.value.outcome_code == "INSUFFICIENT_CREDITS"
    assert fake.records("tasks") == [] and not step.side_effect_started()


def test_get_and_search(db: Database, fake: FakeCrm, connection_id: str) -> None:
    made = StepRunner(db, "crm.create", connection_id=connection_id).run(
        crm.CREATE, {"object_type": "deals", "properties": {"dealname": "Big", "amount": 9}}
    )
    assert made.output is not None
    got = StepRunner(db, "crm.get", connection_id=connection_id).run(
        crm.GET, {"object_type": "deal", "object_id": made.output["id"]}
    )
    assert got.output is not None and got.output["properties"]["dealname"] == "Big"
    found = StepRunner(db, "crm.search", connection_id=connection_id).run(
        crm.SEARCH,
        {
            "object_type": "deals",
            "filters": [{"property": "amount", "operator": "gte", "value": 9}],
        },
    )
    assert found.output is not None and found.output["count"] == 1
    with pytest.raises(BlockFailure) as err:
        StepRunner(db, "crm.get", connection_id=connection_id).run(
            crm.GET, {"object_type": "deals", "object_id": "99999999"}
        )
    assert err.value.outcome_code == "RECORD_NOT_FOUND"


def test_a_rehearsals_read_claims_no_live_throttle_slot(
    db: Database, fake: FakeCrm, connection_id: str
) -> None:
    """Invariant 13: a rehearsal's crm.get still reads the CRM but takes no slot of the
    connection's live window (the first release claimed one before its dry-run check), and
    charges nothing; the live read does both."""

    def slots() -> int:
        with db.transaction() as tx:
            return int(tx.scalar("SELECT coalesce(sum(used), 0) FROM throttle_windows"))

    made = StepRunner(db, "crm.create", connection_id=connection_id).run(
        crm.CREATE, {"object_type": "deals", "properties": {"dealname": "Big"}}
    )
    assert made.output is not None
    before = slots()
    rehearsed = StepRunner(db, "crm.get", connection_id=connection_id).run(
        crm.GET, {"object_type": "deal", "object_id": made.output["id"]}, dry_run=True
    )
    assert rehearsed.output is not None and rehearsed.output["properties"]["dealname"] == "Big"
    assert slots() == before
    StepRunner(db, "crm.get", connection_id=connection_id).run(
        crm.GET, {"object_type": "deal", "object_id": made.output["id"]}
    )
    assert slots() == before + 1


def test_missing_connection_and_missing_token_fail_clearly(
    db: Database, fake: FakeCrm, connection_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(BlockFailure) as err:
        StepRunner(db, "crm.create").run(crm.CREATE, TASK)
    assert err.value.outcome_code == "NO_CONNECTION"
    monkeypatch.delenv("FAKECRM_TOKEN")
    connect.forget_ports()
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, TASK)
    assert err.value.outcome_code == "PROVIDER_UNAUTHORIZED"
    assert "FAKECRM_TOKEN" in str(err.value)
    assert not step.side_effect_started()


def test_update_records_an_echo_marker_before_the_call(
    db: Database, fake: FakeCrm, connection_id: str
) -> None:
    made = StepRunner(db, "crm.create", connection_id=connection_id).run(
        crm.CREATE, {"object_type": "contacts", "properties": {"email": "e@x.io"}}
    )
    assert made.output is not None
    rid = made.output["id"]
    # The update's response is dropped: the marker must already be committed regardless.
    fake.add_fault(action="drop_after_commit", method="PATCH")
    step = StepRunner(db, "crm.update", connection_id=connection_id)
    config = {"object_type": "contact", "object_id": rid, "properties": {"lifecyclestage": "lead"}}
    with pytest.raises(BlockFailure) as err:
        step.run(crm.UPDATE, config)
    assert err.value.error_class == "transient"  # idempotent: retried, unlike a create
    with db.transaction() as tx:
        marker = tx.one(
            "SELECT object_type, object_id, field, step_id::text AS step_id, "
            "expires_at > now() AS live FROM echo_markers WHERE step_id = :s",
            s=step.step_id,
        )
    assert marker == {
        "object_type": "contact",
        "object_id": rid,
        "field": "lifecyclestage",
        "step_id": step.step_id,
        "live": True,
    }
    result = step.run(crm.UPDATE, config)  # the retry
    assert result.output is not None
    assert result.output["properties"]["lifecyclestage"] == "lead"


# ---------------------------------------------------------------- HubSpot as it really is


@pytest.fixture
def keyed_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    """A portal with a unique-value property for onceflow's key, and HubSpot's task rules."""
    config = FakeCrmConfig(
        token="tok", strict_tasks=True, unique_properties={"tasks": ["onceflow_key"]}
    )
    with fake_crm(monkeypatch, config) as server:
        yield server


def _keyed_connection(db: Database, fake: FakeCrm) -> str:
    seed_tenant(db, credits=100)
    connection_id = seed_connection(db, fake.url)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET idempotency_property = 'onceflow_key'"
            " WHERE id = CAST(:c AS uuid)",
            c=connection_id,
        )
    return connection_id


KEYED_TASK = {
    "object_type": "tasks",
    "properties": {"hs_task_subject": "Call Ada", "hs_timestamp": "2026-12-03T10:00:00Z"},
}


def test_a_lost_create_response_is_adopted_when_the_portal_has_a_key_property(
    db: Database, keyed_fake: FakeCrm
) -> None:
    """Issue 13, item 6: the same lost response that gives OUTCOME_UNKNOWN without a key
    property is, with one, retried and resolved by HubSpot's 409 "Existing ID: N"."""
    connection_id = _keyed_connection(db, keyed_fake)
    keyed_fake.add_fault(
        action="drop_after_commit", method="POST", path=versions.crm_objects("tasks") + "$"
    )
    step = StepRunner(db, "crm.create", connection_id=connection_id)
    with pytest.raises(BlockFailure) as err:
        step.run(crm.CREATE, KEYED_TASK)
    assert err.value.error_class == "transient"  # safe to retry, not OUTCOME_UNKNOWN
    assert step.side_effect_started()
    (made,) = keyed_fake.records("tasks")
    assert made["properties"]["onceflow_key"] == step.idempotency_key
    result = step.run(crm.CREATE, KEYED_TASK)
    assert result.outcome_code == "ADOPTED_EXISTING"
    assert result.output is not None
    assert (result.output["id"], result.output["adopted_existing"]) == (made["id"], made["id"])
    assert len(keyed_fake.records("tasks")) == 1
    with db.transaction() as tx:
        assert tx.scalar("SELECT credit_balance FROM tenants") == 98  # charged once


def test_a_created_task_is_associated_with_its_contact(db: Database, keyed_fake: FakeCrm) -> None:
    connection_id = _keyed_connection(db, keyed_fake)
    contact = crm.CREATE  # the contact the task is for, made by a step too
    who = StepRunner(db, "crm.create", connection_id=connection_id).run(
        contact, {"object_type": "contacts", "properties": {"email": "ada@x.io"}}
    )
    assert who.output is not None
    task = {**KEYED_TASK, "associations": [{"object_type": "contacts", "id": who.output["id"]}]}
    StepRunner(db, "crm.create", connection_id=connection_id).run(crm.CREATE, task)
    (stored,) = keyed_fake.records("tasks")
    assert stored["associations"] == {
        "contacts": {"results": [{"id": who.output["id"], "type_id": 204}]}
    }
