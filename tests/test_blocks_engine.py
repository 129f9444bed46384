"""The outbound blocks through the real step engine (`advance_step`), against the fake CRM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack import seed
from devstack.fakecrm import FakeCrm
from shared.core.db import Database
from shared.providers.hubspot import versions
from shared.steps.advance import advance_step
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.steps_support import TENANT, definition, publish_version, run_row, start_run, steps_of


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch) as server:
        yield server


def _run_create(db: Database, connection_id: str) -> tuple[str, str]:
    version = publish_version(
        db,
        definition(
            [
                {
                    "id": "create_task",
                    "type": "crm.create",
                    "config": {
                        "object_type": "tasks",
                        "connection_id": connection_id,
                        "properties": {
                            "hs_task_subject": "Call Ada",
                            "hs_timestamp": "2026-12-03T10:00:00Z",
                        },
                    },
                }
            ]
        ),
    )
    run_id, [step_id] = start_run(db, version)
    return run_id, step_id


def test_vendor_replay_through_onceflow_one_record_one_outcome_unknown(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    fake.add_fault(
        action="drop_after_commit", method="POST", path=versions.crm_objects("tasks") + "$"
    )
    run_id, step_id = _run_create(db, connection_id)
    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["create_task"]
    assert step["status"] == "failed" and step["outcome_code"] == "OUTCOME_UNKNOWN"
    assert step["side_effect_started_at"] is not None
    assert "check the CRM" in step["error"]
    assert run_row(db, run_id)["status"] == "failed"
    assert len(fake.records("tasks")) == 1
    # Delivered again (Pub/Sub redelivery): the step is terminal, nothing is called.
    advance_step(db, step_id, dispatch=lambda ids: None)
    assert len([r for r in fake.state()["requests"] if r["method"] == "POST"]) == 1


def test_rate_limited_create_parks_with_retry_after_and_no_mark(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    fake.add_fault(action="rate_limit", retry_after=120)
    run_id, step_id = _run_create(db, connection_id)
    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["create_task"]
    assert step["status"] == "waiting_for_retry"
    assert step["outcome_code"] == "PROVIDER_RATE_LIMITED"
    assert step["side_effect_started_at"] is None  # withdrawn: the retry may call
    with db.transaction() as tx:
        wait = tx.scalar(
            "SELECT extract(epoch FROM wake_at - now()) FROM workflow_steps WHERE id = :s",
            s=step_id,
        )
    assert 100 < float(wait) <= 120
    assert fake.records("tasks") == []


def test_throttled_step_parks_until_the_window_ends_without_using_an_attempt(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET rate_limit_per_window = 1, rate_limit_window_seconds = 30"
        )
    first_run, first = _run_create(db, connection_id)
    advance_step(db, first, dispatch=lambda ids: None)
    assert steps_of(db, first_run)["create_task"]["status"] == "succeeded"
    run_id, step_id = _run_create(db, connection_id)
    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["create_task"]
    assert step["status"] == "waiting_for_retry" and step["outcome_code"] == "THROTTLED"
    assert step["attempt"] == 0  # the attempt was given back
    assert step["side_effect_started_at"] is None
    assert len(fake.records("tasks")) == 1


def test_a_portal_validation_rule_fails_the_step_permanently_with_the_rules_message(
    db: Database, fake: FakeCrm
) -> None:
    """HubSpot (2026-09) refuses a write its portal's admin rules forbid: the step fails at once
    (no retry would pass), nothing was created, and the step's error is the rule's message."""
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    rule = {"property": "hs_task_priority", "message": "Every task needs a priority"}
    fake.config.validation_rules[fake.config.portal_id] = {"tasks": [rule]}
    run_id, step_id = _run_create(db, connection_id)
    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["create_task"]
    assert step["status"] == "failed" and step["outcome_code"] == "PROVIDER_REJECTED"
    assert "hs_task_priority: Every task needs a priority" in step["error"]
    assert run_row(db, run_id)["status"] == "failed"
    assert fake.records("tasks") == []


def test_a_service_key_connection_acts_and_a_rotated_key_fails_the_step_naming_it(
    db: Database, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service key (HubSpot's replacement for private-app tokens) is a bearer that neither
    expires nor refreshes: the connection uses it as is. Once an admin rotates it, HubSpot
    answers 401 and there is nothing to refresh: the step fails at once, permanently, saying
    which connection's service key was refused and where its key comes from."""
    key = fake.mint_service_key()
    monkeypatch.setenv("ACME_SERVICE_KEY", key)
    seed_tenant(db)
    with db.transaction() as tx:
        connection_id = seed.connection(
            tx,
            TENANT,
            api_credentials_env="ACME_SERVICE_KEY",
            credential_kind="service_key",
            api_base_url=fake.url,
        )
    run_id, step_id = _run_create(db, connection_id)
    advance_step(db, step_id, dispatch=lambda ids: None)
    assert steps_of(db, run_id)["create_task"]["status"] == "succeeded"
    fake.revoke_service_key(key)  # rotated by an admin: the old key is refused
    run_id, step_id = _run_create(db, connection_id)
    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["create_task"]
    assert step["status"] == "failed" and step["outcome_code"] == "PROVIDER_UNAUTHORIZED"
    assert f"connection {connection_id}" in step["error"]
    assert "service key" in step["error"] and "ACME_SERVICE_KEY" in step["error"]
    assert key not in step["error"]
    assert len(fake.records("tasks")) == 1
    refused = [r for r in fake.state()["requests"] if r["status"] == 401]
    assert len(refused) == 1  # no refresh, no second try
