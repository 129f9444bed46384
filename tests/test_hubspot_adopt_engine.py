"""Issue 13, item 6, through the step engine (not only the block): a crm.create whose response
was lost, on a connection with a unique-value key property, is retried by the engine after its
backoff and adopted from HubSpot's 409 (ADOPTED_EXISTING, one record); without the property the
same loss stays OUTCOME_UNKNOWN and the create is never sent again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ops.replay import replay_run
from shared.providers.hubspot import versions
from shared.steps import repairs
from shared.steps.advance import advance_step
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.steps_support import TENANT, definition, publish_version, run_row, start_run, steps_of

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
    fake.add_fault(
        action="drop_after_commit", method="POST", path=versions.crm_objects("tasks") + "$"
    )
    advance_step(db, step_id, dispatch=lambda ids: None)
    first = steps_of(db, run_id)["create_task"]
    if first["status"] == "waiting_for_retry":
        with db.transaction() as tx:
            tx.execute(
                "UPDATE workflow_steps SET wake_at = now() WHERE id = CAST(:s AS uuid)", s=step_id
            )
        woken: list[str] = []
        repairs.wake_due_steps(db, SweepConfig(), woken.extend, SweepReport())
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


# --- issue 23, item 5: a create whose process died, its replay, and whose record a 409 names --
LEASE_ENV = {"ONCEFLOW_STEP_LEASE_SECONDS": "1.5", "ONCEFLOW_STEP_HEARTBEAT_SECONDS": "0.5"}
CHILD = (
    "import sys\n"
    "from shared.core.db import get_database\n"
    "from shared.steps.advance import advance_step\n"
    "advance_step(get_database(), sys.argv[1], dispatch=lambda ids: None)\n"
)


def create_run(db: Database, fake: FakeCrm, object_type: str, properties: dict[str, Any]) -> str:
    """A one-step run creating a record on a connection whose portal has the unique-value
    key property for `object_type`; the run's id."""
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    fake.config.unique_properties = {object_type: ["onceflow_key"]}
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET idempotency_property = 'onceflow_key'"
            " WHERE id = CAST(:c AS uuid)",
            c=connection_id,
        )
    step = {
        "id": "create_task",
        "type": "crm.create",
        "config": {
            "object_type": object_type,
            "connection_id": connection_id,
            "properties": properties,
        },
    }
    run_id, _ = start_run(db, publish_version(db, definition([step])))
    return run_id


def die_at(database_url: str, step_id: str, point: str) -> None:
    """Advance the step in a child process killed (os._exit(137)) at `point`."""
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS=point,
        **LEASE_ENV,
    )
    child = subprocess.run(
        [sys.executable, "-c", CHILD, step_id],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert child.returncode == 137, child.returncode


def reclaim(db: Database) -> SweepReport:
    """Sweep until the dead lease (1.5 s) has expired and been reclaimed."""
    report = SweepReport()
    deadline = time.monotonic() + 30
    while not repairs.reclaim_expired_leases(db, SweepConfig(), lambda ids: None, report):
        assert time.monotonic() < deadline, "the dead lease was never reclaimed"
        time.sleep(0.2)
    return report


def charge_of(db: Database, step: dict[str, Any]) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one(
            "SELECT l.outcome_unknown_at IS NOT NULL AS unknown,"
            " (SELECT count(*) FROM credit_refunds f WHERE f.charge_id = l.id) AS refunds,"
            " (SELECT credit_balance FROM tenants WHERE id = l.tenant_id) AS balance"
            " FROM credit_ledger l WHERE l.lineage_key = :k",
            k=step["idempotency_key"],
        )
    assert row is not None
    return row


@pytest.mark.parametrize(
    ("point", "code"),
    [("after_side_effect", "ADOPTED_EXISTING"), ("after_side_effect_mark", "OK")],
)
def test_a_create_whose_process_died_goes_back_to_pending_and_its_block_asks_the_crm(
    db: Database, database_url: str, fake: FakeCrm, point: str, code: str
) -> None:
    """The process dies after HubSpot created the task (its answer only in memory), or after
    the mark and before the request. Before the fix the sweep failed both OUTCOME_UNKNOWN
    although crm.create decides that retry itself; now the step goes back to pending, the
    dead attempt's charge is recorded outcome-unknown, and the retry creates the task or
    adopts the one the dead attempt made: one task, charged once."""
    run_id = create_run(db, fake, "tasks", TASK)
    step_id = steps_of(db, run_id)["create_task"]["id"]
    die_at(database_url, step_id, point)
    reclaim(db)
    step = steps_of(db, run_id)["create_task"]
    assert step["status"] == "pending" and step["side_effect_started_at"] is not None
    assert charge_of(db, step)["unknown"]

    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["create_task"]
    (task,) = fake.records("tasks")
    assert (step["status"], step["outcome_code"], step["attempt"]) == ("succeeded", code, 2)
    assert step["output"]["id"] == task["id"]
    assert task["properties"]["onceflow_key"] == step["idempotency_key"]
    assert run_row(db, run_id)["status"] == "succeeded"
    assert charge_of(db, step) == {"unknown": True, "refunds": 0, "balance": 998}


def test_the_replay_of_a_create_that_landed_adopts_it_and_keeps_the_charge(
    db: Database, database_url: str, fake: FakeCrm
) -> None:
    """The process dies on every attempt (twice before the call, then after HubSpot made the
    task): the step fails OUTCOME_UNKNOWN with no attempts left. Its replay's fresh step
    (same lineage key, so the same key property value) gets HubSpot's 409 naming that task.
    Before the fix that 409 failed ALREADY_EXISTS, "not applied", and refunded the charge of
    a task that exists; now the record carrying this step's key is adopted."""
    run_id = create_run(db, fake, "tasks", TASK)
    step_id = steps_of(db, run_id)["create_task"]["id"]
    for point in ("after_claim", "after_claim", "after_side_effect"):
        die_at(database_url, step_id, point)
        reclaim(db)
    step = steps_of(db, run_id)["create_task"]
    assert (step["status"], step["outcome_code"], step["attempt"]) == (
        "failed",
        "OUTCOME_UNKNOWN",
        3,
    )
    assert len(fake.records("tasks")) == 1

    queue: list[str] = []
    replayed = replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=queue.extend)
    for sid in queue:
        advance_step(db, sid, dispatch=lambda ids: None)
    again = steps_of(db, replayed.run_id)["create_task"]
    (task,) = fake.records("tasks")
    assert (again["status"], again["outcome_code"]) == ("succeeded", "ADOPTED_EXISTING")
    assert again["output"]["adopted_existing"] == task["id"]
    assert run_row(db, replayed.run_id)["status"] == "succeeded"
    assert charge_of(db, again) == {"unknown": True, "refunds": 0, "balance": 998}


def test_a_409_naming_a_record_without_this_steps_key_is_not_adopted(
    db: Database, fake: FakeCrm
) -> None:
    """Attempt 1's create answers 500 (the key makes its retry safe, so the mark stays);
    meanwhile a person adds a contact with the same email. Attempt 2's create answers 409
    naming that person's contact, for its email. Before the fix any 409 naming an "Existing
    ID" was adopted as this step's create; now only a record carrying this step's key is."""
    run_id = create_run(db, fake, "contacts", {"email": "ada@example.com", "firstname": "Ada"})
    step_id = steps_of(db, run_id)["create_task"]["id"]
    fake.add_fault(
        action="error_500", method="POST", path=versions.crm_objects("contacts") + "$", times=1
    )
    advance_step(db, step_id, dispatch=lambda ids: None)
    assert steps_of(db, run_id)["create_task"]["status"] == "waiting_for_retry"
    theirs = fake.create_record("contacts", {"email": "ada@example.com"}, ("CRM_UI", "userId:7"))
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET wake_at = now() WHERE id = CAST(:s AS uuid)", s=step_id
        )
    repairs.wake_due_steps(db, SweepConfig(), lambda ids: None, SweepReport())
    advance_step(db, step_id, dispatch=lambda ids: None)

    step = steps_of(db, run_id)["create_task"]
    assert (step["status"], step["outcome_code"]) == ("failed", "ALREADY_EXISTS")
    assert theirs.id in step["error"] and step["output"] is None
    (contact,) = fake.records("contacts")
    assert contact["id"] == theirs.id and "onceflow_key" not in contact["properties"]
