"""The `admit_event` function through functions-framework, publishing to the real Pub/Sub
emulator: the step-ready dispatch, run-twice, a crash between the run's commit and the
publish, and a failed publish that nacks."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import functions_framework

from shared.admission.admit import admit_event
from shared.core import pubsub as pubsub_mod
from shared.core.db import Database
from tests.admission_support import bind_workflow, count, emit_event, make_connection, make_tenant
from tests.pubsub_emulator import (
    PubsubProject,
)

ROOT = Path(__file__).resolve().parent.parent


def push_body(event_id: int, message_id: str = "m-1") -> dict[str, Any]:
    """What a Pub/Sub push subscription POSTs (functions-framework makes it a CloudEvent)."""
    data = base64.b64encode(json.dumps({"event_id": event_id}).encode()).decode()
    return {
        "subscription": "projects/p/subscriptions/admit",
        "message": {"data": data, "messageId": message_id, "publishTime": "2026-12-02T00:00:00Z"},
    }


def client() -> Any:
    app = functions_framework.create_app("admit_event", str(ROOT / "main.py"), "cloudevent")
    return app.test_client()


def snapshot(db: Database) -> dict[str, Any]:
    with db.transaction() as tx:
        return {
            t: tx.all(f"SELECT * FROM {t} ORDER BY 1, 2")
            for t in (
                "workflow_runs",
                "workflow_steps",
                "delivery_claims",
                "workflow_enrollments",
                "admission_refusals",
                "poisoned_messages",
            )
        }


def seed(db: Database) -> tuple[str, int]:
    make_tenant(db)
    conn = make_connection(db)
    bind_workflow(db, "admitted")
    bind_workflow(db, "refused", rule="false")
    return conn, emit_event(db, connection_id=conn)


def first_step_ids(db: Database) -> list[str]:
    with db.transaction() as tx:
        return [str(r["id"]) for r in tx.all("SELECT id FROM workflow_steps")]


def test_admit_event_dispatches_first_step_and_run_twice_changes_nothing(
    db: Database, pubsub: PubsubProject
) -> None:
    _, event_id = seed(db)
    http = client()
    response = http.post("/", json=push_body(event_id))
    assert response.status_code == 200, response.get_data(as_text=True)
    steps = first_step_ids(db)
    assert len(steps) == 1
    assert pubsub.pull_ids("step-ready", count=1) == steps

    before = snapshot(db)
    again = http.post("/", json=push_body(event_id, message_id="m-2"))
    assert again.status_code == 200
    assert snapshot(db) == before
    # The redelivery only re-publishes the run's still-pending first step.
    assert pubsub.drain("step-ready") == [{"step_id": steps[0]}]


def test_crash_between_run_commit_and_publish_redelivery_resumes_dispatch(
    db: Database, pubsub: PubsubProject
) -> None:
    _, event_id = seed(db)

    class Crash(BaseException):
        """Stands for the process dying: nothing after the commit runs."""

    def die(step_ids: Any) -> None:
        raise Crash

    with contextlib.suppress(Crash):
        admit_event(db, event_id, publish=die)
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1  # committed...
    assert pubsub.drain("step-ready", quiet_seconds=0.3) == []  # ...and never dispatched

    # Pub/Sub redelivers the unacked event to the function: same run, dispatch resumed.
    response = client().post("/", json=push_body(event_id))
    assert response.status_code == 200
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1
    assert pubsub.pull_ids("step-ready", count=1) == first_step_ids(db)


def test_failed_publish_nacks_and_the_redelivery_dispatches(
    db: Database, pubsub: PubsubProject
) -> None:
    _, event_id = seed(db)
    # A project without topics: every publish fails after the admission committed.
    pubsub_mod.set_publisher(pubsub_mod.Publisher(f"{pubsub.project}-missing"))
    try:
        response = client().post("/", json=push_body(event_id))
    finally:
        pubsub_mod.set_publisher(pubsub_mod.Publisher(pubsub.project))
    assert response.status_code == 500  # nack: Pub/Sub will deliver it again
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1
    response = client().post("/", json=push_body(event_id))
    assert response.status_code == 200
    assert count(db, "SELECT count(*) FROM workflow_runs") == 1
    assert pubsub.pull_ids("step-ready", count=1) == first_step_ids(db)


def test_poisoned_message_is_acked_through_the_function(
    db: Database, pubsub: PubsubProject
) -> None:
    seed(db)
    response = client().post("/", json=push_body(424242))
    assert response.status_code == 200
    assert count(db, "SELECT count(*) FROM poisoned_messages") == 1
    assert count(db, "SELECT count(*) FROM workflow_runs") == 0
