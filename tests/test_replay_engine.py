"""Replay through the real step engine and the real crm.create block against the fake CRM
over HTTP: a create whose outcome was lost is replayed by a person who checked the CRM, the
engine runs it again under the lineage's key, and the ledger still holds one charge."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.core.db import Database
from shared.ops import replay
from shared.providers.hubspot import versions
from shared.steps.advance import advance_step
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.steps_support import TENANT, definition, publish_version, start_run


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch, FakeCrmConfig(token="tok")) as server:
        yield server


def _step(db: Database, run_id: str, key: str) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one(
            "SELECT * FROM workflow_steps WHERE run_id = :r AND step_key = :k", r=run_id, k=key
        )
    assert row is not None
    return row


def test_replay_after_outcome_unknown_runs_again_under_the_lineage_key_and_charges_once(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db, credits=100)
    conn = seed_connection(db, fake.url)
    version = publish_version(
        db,
        definition(
            [
                {
                    "id": "create",
                    "type": "crm.create",
                    "config": {
                        "object_type": "tasks",
                        "connection_id": conn,
                        "properties": {
                            "hs_task_subject": "Call ${{ trigger.name }}",
                            "hs_timestamp": "2026-12-03T10:00:00Z",
                        },
                    },
                },
            ]
        ),
    )
    run_id, ids = start_run(db, version, payload={"name": "Ada"})
    sent: list[str] = []
    fake.add_fault(action="reset", method="POST", path=versions.crm_objects("tasks") + "$", times=1)
    first = advance_step(db, ids[0], dispatch=sent.extend)
    assert (first.status, first.outcome_code, first.run_status) == (
        "failed",
        "OUTCOME_UNKNOWN",
        "failed",
    )
    original = _step(db, run_id, "create")
    assert original["side_effect_started_at"] is not None
    # A person checks the CRM: the task was never created. They replay.
    assert fake.records("tasks") == []
    outcome = replay.replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=sent.extend)
    assert sent == list(outcome.restarted_step_ids)
    again = advance_step(db, sent[0], dispatch=sent.extend)
    assert (again.status, again.run_status) == ("succeeded", "succeeded")
    replayed = _step(db, outcome.run_id, "create")
    assert (
        replayed["idempotency_key"] == original["idempotency_key"] == (f"onceflow:{run_id}:create")
    )
    tasks = fake.records("tasks")
    assert len(tasks) == 1 and tasks[0]["properties"]["hs_task_subject"] == "Call Ada"
    with db.transaction() as tx:
        ledger = tx.all("SELECT lineage_key, amount FROM credit_ledger")
        balance = tx.scalar("SELECT credit_balance FROM tenants WHERE id = :t", t=TENANT)
    # The first attempt paid before its call left; the replay found the lineage's charge.
    assert ledger == [{"lineage_key": f"onceflow:{run_id}:create", "amount": 2}]
    assert balance == 98
