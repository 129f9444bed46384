"""GET /v1/health and the page's health section: "is the machinery running?", through the
real `ops` entry point against real Postgres. Admins see the machinery (scheduler, queues,
dead letters, sweep duties); a tenant sees only its own connections."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from google.cloud import scheduler_v1

from shared.core.db import Database
from shared.ops.health import (
    SCHEDULED_JOBS,
    UNAVAILABLE_LOCALLY,
    _problems,
    job_health,
    read_scheduler,
)
from shared.ops.models import (
    BacklogHealth,
    DeadLetterHealth,
    MachineryHealth,
    SchedulerHealth,
)
from tests.ops_support import (
    bearer,
    mint,
    seed_connection,
    seed_tenant,
)


def _world(db: Database) -> dict[str, Any]:
    """Two tenants with a connection each; a dead inbox row, a poisoned message, an old
    unpublished outbox row; a failed reconcile for one connection."""
    out: dict[str, Any] = {}
    for tenant in ("health-a", "health-b"):
        seed_tenant(db, tenant)
        out[tenant] = seed_connection(db, tenant)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET api_credentials_env = 'HEALTH_A_TOKEN' WHERE id = :c",
            c=out["health-a"],
        )
        tx.execute(
            "INSERT INTO subscription_reconciles (connection_id, desired, result, ok)"
            " VALUES (:c, '{}', CAST(:r AS jsonb), false)",
            c=out["health-b"],
            r=json.dumps({"errors": ["create contact.creation: 401 unauthorized"]}),
        )
        tx.execute(
            "INSERT INTO webhook_inbox (connection_id, body_sha256, body, status, finished_at,"
            " last_error) VALUES (:c, sha256('health-dead'::bytea), 'x', 'dead', now(), 'gone')",
            c=out["health-a"],
        )
        tx.execute(
            "INSERT INTO poisoned_messages (source, message_id, reason)"
            " VALUES ('trigger-events', 'm-health', 'no event_id')"
        )
        tx.execute(
            "INSERT INTO workflow_trigger_events (tenant_id, event_type, payload, created_at)"
            " VALUES ('health-a', 'test.health', '{}', now() - interval '15 minutes')"
        )
        tx.execute(
            "INSERT INTO workflow_trigger_events (tenant_id, event_type, payload, published_at,"
            " redeliveries, undelivered_at, undelivered_reason)"
            " VALUES ('health-a', 'test.health', '{}', now(), 5, now(), 'never decided')"
        )
    return out


def test_health_needs_a_token(client: Any) -> None:
    assert client.get("/v1/health").status_code == 401


def test_admin_sees_the_machinery_and_every_connection(
    db: Database, client: Any, monkeypatch: Any
) -> None:
    world = _world(db)
    monkeypatch.setenv("HEALTH_A_TOKEN", "secret-value")
    monkeypatch.delenv("SCHEDULER_LOCATION", raising=False)
    resp = client.get("/v1/health", headers=bearer(mint(db, None)))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()

    machinery = body["machinery"]
    # No scheduler configured here: said plainly, and the rest still answered.
    assert machinery["scheduler"] == {
        "available": False,
        "detail": UNAVAILABLE_LOCALLY,
        "jobs": [],
    }
    assert machinery["backlog"]["outbox_unpublished"] >= 1
    assert machinery["backlog"]["outbox_oldest_seconds"] >= 900
    assert machinery["dead_letters"]["dead_inbox_rows"] >= 1
    assert machinery["dead_letters"]["poisoned_messages_24h"] >= 1
    assert machinery["dead_letters"]["undelivered_events"] >= 1

    by_id = {c["connection_id"]: c for c in body["connections"]}
    a, b = by_id[world["health-a"]], by_id[world["health-b"]]
    assert a["credentials_configured"] is True and a["last_reconcile_ok"] is None
    assert b["credentials_configured"] is False  # names no variable
    assert b["last_reconcile_ok"] is False
    assert b["last_reconcile_errors"] == ["create contact.creation: 401 unauthorized"]

    problems = " | ".join(body["problems"])
    assert "outbox row waiting to be published" in problems
    assert "inbox rows are dead" in problems
    assert "trigger events were given up as undelivered" in problems
    assert f"connection {world['health-b']}: the last call to its provider failed" in problems
    # The secret's value never appears, only whether it is set.
    assert "secret-value" not in resp.get_data(as_text=True)


def test_a_tenant_sees_only_its_connections_and_no_machinery(db: Database, client: Any) -> None:
    world = _world(db)
    resp = client.get("/v1/health", headers=bearer(mint(db, "health-a")))
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["machinery"] is None
    assert {c["tenant_id"] for c in body["connections"]} == {"health-a"}
    assert world["health-b"] not in resp.get_data(as_text=True)
    # Machinery problems (the dead inbox row, the old outbox row) are not a tenant's business.
    assert not any("inbox" in p or "outbox" in p for p in body["problems"])


def test_the_page_shows_the_health_section(db: Database, client: Any) -> None:
    _world(db)
    assert client.post("/ui/login", data={"token": mint(db, None)}).status_code == 303
    page = client.get("/ui").get_data(as_text=True)
    assert "<h2>Health</h2>" in page
    assert UNAVAILABLE_LOCALLY in page
    assert 'class="backlog"' in page and "Dead inbox rows:" in page
    client.post("/ui/login", data={"token": mint(db, "health-b")})
    tenant_page = client.get("/ui").get_data(as_text=True)
    assert "<h2>Health</h2>" in tenant_page and 'class="backlog"' not in tenant_page


def test_scheduler_is_not_contacted_unless_configured() -> None:
    # Creating the client looks for credentials; without configuration it is never created.
    assert read_scheduler({}).detail == UNAVAILABLE_LOCALLY
    assert read_scheduler({"GOOGLE_CLOUD_PROJECT": "p"}).available is False


def test_a_configured_scheduler_without_credentials_says_so(
    monkeypatch: Any, tmp_path: Any
) -> None:
    # No key file, no gcloud login, no metadata server (NO_GCE_CHECK): not a 500, a sentence.
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    got = read_scheduler({"GOOGLE_CLOUD_PROJECT": "p", "SCHEDULER_LOCATION": "europe-west1"})
    assert got.available is False and got.jobs == []
    assert got.detail is not None and got.detail.startswith("no credentials")


def test_the_health_view_asks_for_the_jobs_infra_declares() -> None:
    from devstack.scheduler import declared_jobs

    assert set(SCHEDULED_JOBS) == {job.name for job in declared_jobs()}


def test_a_scheduler_job_reads_as_its_last_attempt_and_status() -> None:
    at = datetime.now(UTC) - timedelta(seconds=30)
    ok = scheduler_v1.Job(
        name="projects/p/locations/l/jobs/sweep",
        state=scheduler_v1.Job.State.ENABLED,
        last_attempt_time=at,
        schedule_time=at + timedelta(minutes=1),
    )
    failed = scheduler_v1.Job(
        state=scheduler_v1.Job.State.ENABLED,
        last_attempt_time=at,
        status={"code": 7, "message": "PERMISSION_DENIED: run.invoker"},
    )
    never = scheduler_v1.Job(state=scheduler_v1.Job.State.PAUSED)
    assert job_health("sweep", ok).last_status == "ok"
    assert job_health("sweep", ok).last_attempt_at == at
    assert job_health("drain-inbox", failed).last_status == (
        "error 7: PERMISSION_DENIED: run.invoker"
    )
    assert job_health("publish-outbox", never).last_status is None

    machinery = MachineryHealth(
        scheduler=SchedulerHealth(
            available=True,
            detail=None,
            jobs=[
                job_health("sweep", ok),
                job_health("drain-inbox", failed),
                job_health("publish-outbox", never),
            ],
        ),
        backlog=BacklogHealth(
            inbox_pending=0,
            inbox_oldest_seconds=0,
            outbox_unpublished=0,
            outbox_oldest_seconds=0,
            steps_pending=0,
            steps_oldest_pending_seconds=0,
        ),
        dead_letters=DeadLetterHealth(
            poisoned_messages=0, poisoned_messages_24h=0, dead_inbox_rows=0, undelivered_events=0
        ),
        sweep_duties=[],
    )
    assert _problems(machinery, []) == [
        "scheduler job drain-inbox last failed: error 7: PERMISSION_DENIED: run.invoker",
        "scheduler job publish-outbox is PAUSED",
    ]
