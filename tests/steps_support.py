"""Seeding for the step engine's tests: a tenant, a workflow version and live runs of it.

Rows are written with plain SQL (what admission would have committed), so the engine's tests
don't depend on the admission code being finished."""

from __future__ import annotations

import json
import uuid
from typing import Any

from devstack import seed
from shared.core.db import Database
from shared.steps.journal import insert_steps
from shared.workflows.definition import WorkflowDefinition

TENANT = "acme"


def definition(steps: list[dict[str, Any]], name: str = "wf") -> WorkflowDefinition:
    return WorkflowDefinition.model_validate(
        {
            "name": name,
            "tenant": TENANT,
            "trigger": {"events": ["test.thing.created"]},
            "steps": steps,
        }
    )


def chain(n: int, block_type: str = "end") -> list[dict[str, Any]]:
    """n steps s0 -> s1 -> … of one block type."""
    return [
        {"id": f"s{i}", "type": block_type, **({"next": f"s{i + 1}"} if i + 1 < n else {})}
        for i in range(n)
    ]


def publish_version(db: Database, wf: WorkflowDefinition, workflow_id: str | None = None) -> str:
    """Insert (tenant,) workflow and a new version row; returns the version id."""
    with db.transaction() as tx:
        seed.tenant(tx, TENANT, existing="keep")
        if workflow_id is None:
            workflow_id = str(
                tx.scalar(
                    "INSERT INTO workflows (tenant_id, name) VALUES (:t, :n) "
                    "ON CONFLICT (tenant_id, name) DO UPDATE SET name = EXCLUDED.name "
                    "RETURNING id",
                    t=TENANT,
                    n=wf.name,
                )
            )
        number = tx.scalar(
            "SELECT coalesce(max(number), 0) + 1 FROM workflow_versions WHERE workflow_id = :w",
            w=workflow_id,
        )
        return str(
            tx.scalar(
                "INSERT INTO workflow_versions (workflow_id, number, content_hash, definition,"
                " source_text) VALUES (:w, :n, :h, CAST(:d AS jsonb), :d) RETURNING id",
                w=workflow_id,
                n=number,
                h=uuid.uuid4().hex * 2,
                d=json.dumps(wf.model_dump(mode="json")),
            )
        )


def workflow_of(db: Database, version_id: str) -> str:
    with db.transaction() as tx:
        return str(
            tx.scalar("SELECT workflow_id FROM workflow_versions WHERE id = :v", v=version_id)
        )


def start_run(
    db: Database,
    version_id: str,
    *,
    payload: dict[str, Any] | None = None,
    namespace: str = "live",
) -> tuple[str, list[str]]:
    """A running run of `version_id` with its entry step row; (run id, ids to dispatch)."""
    with db.transaction() as tx:
        row = tx.one(
            "SELECT workflow_id, definition FROM workflow_versions WHERE id = :v", v=version_id
        )
        assert row is not None
        wf = WorkflowDefinition.model_validate(row["definition"])
        run_id = str(uuid.uuid4())
        tx.execute(
            "INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,"
            " dedup_mode, namespace, trigger_payload, lineage_root)"
            " VALUES (:id, :t, :w, :v, :k, 'every_time', :ns, CAST(:p AS jsonb), :id)",
            id=run_id,
            t=TENANT,
            w=row["workflow_id"],
            v=version_id,
            k=f"test:{run_id}",
            ns=namespace,
            p=json.dumps(payload or {}),
        )
        ids = insert_steps(tx, run_id=run_id, lineage_root=run_id, nodes=[wf.entry])
    return run_id, ids


def steps_of(db: Database, run_id: str) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT *, CAST(id AS text) AS id FROM workflow_steps WHERE run_id = :r", r=run_id
        )
    return {r["step_key"]: r for r in rows}


def run_row(db: Database, run_id: str) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one("SELECT * FROM workflow_runs WHERE id = :r", r=run_id)
    assert row is not None
    return row
