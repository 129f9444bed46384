"""Issue 13, item 6, through the step engine (not only the block): a crm.create whose response
was lost, on a connection with a unique-value key property, is retried by the engine after its
backoff and adopted from HubSpot's 409 (ADOPTED_EXISTING, one record); without the property the
same loss stays OUTCOME_UNKNOWN and the create is never sent again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.fakecrm import FakeCrm
from shared.db import Database
from shared.steps import sweep
from shared.steps.advance import advance_step
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.steps_support import definition, publish_version, start_run, steps_of

TASK = {"hs_task_subject": "Call Ada", "hs_timestamp": "2026-12-03T10:00:00Z"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch) as server:
        server.config.unique_properties = {"tasks": ["onceflow_key"]}
        yield server


def lost_create(db: Database, fake: FakeCrm, key_property: str | None) -> tuple[str, str]:
    """A one-step run whose create commits at the fake and loses its response; after the
    engine's first attempt and the sweep's wake of the retry (backoff skipped), the second
    attempt has run. (run id, step id)."""
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET idempotency_property = :p WHERE id = CAST(:c AS uuid)",
            p=key_property,
            c=connection_id,
        )
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
                        "properties": TASK,
                    },
                }
            ]
        ),
    )
    run_id, [step_id] = start_run(db, version)
    fake.add_fault(action="drop_after_commit", method="POST", path="/crm/v3/objects/tasks$")
    advance_step(db, step_id, dispatch=lambda ids: None)
    first = steps_of(db, run_id)["create_task"]
    if first["status"] == "waiting_for_retry":
        with db.transaction() as tx:
            tx.execute(
                "UPDATE workflow_steps SET wake_at = now() WHERE id = CAST(:s AS uuid)", s=step_id
            )
        woken: list[str] = []
        sweep.wake_due_steps(db, sweep.SweepConfig(), woken.extend, sweep.SweepReport())
        assert woken == [step_id]
        advance_step(db, step_id, dispatch=lambda ids: None)
    return run_id, step_id


def test_the_engine_retries_a_lost_create_and_adopts_the_record(
    db: Database, fake: FakeCrm
) -> None:
    run_id, _ = lost_create(db, fake, "onceflow_key")
    step = steps_of(db, run_id)["create_task"]
    (task,) = fake.records("tasks")
    assert (step["status"], step["outcome_code"], step["attempt"]) == (
        "succeeded",
        "ADOPTED_EXISTING",
        2,
    )
    assert step["output"]["adopted_existing"] == task["id"]
    creates = [r for r in fake.store.requests if r["method"] == "POST" and "tasks" in r["path"]]
    assert len(creates) == 2  # sent again (safe: the key guards), made once
    with db.transaction() as tx:
        assert tx.scalar("SELECT credit_balance FROM tenants") == 998  # charged once


def test_without_a_key_property_the_lost_create_stays_outcome_unknown(
    db: Database, fake: FakeCrm
) -> None:
    run_id, _ = lost_create(db, fake, None)
    step = steps_of(db, run_id)["create_task"]
    assert (step["status"], step["outcome_code"]) == ("failed", "OUTCOME_UNKNOWN")
    creates = [r for r in fake.store.requests if r["method"] == "POST" and "tasks" in r["path"]]
    assert len(creates) == 1  # never sent again
    assert len(fake.records("tasks")) == 1
