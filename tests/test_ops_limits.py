"""`GET /v1/limits` (issue 29, item 7): what each limit holds back now. The state is made by
the real paths: steps parked THROTTLED by the connection-limit gate through `advance_step`,
events queued by a run-start throttle and held in a debounce burst by real admission."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm
from shared.core.db import Database
from shared.ops.statements import (
    LIMITS_DEBOUNCE_BURSTS,
    LIMITS_PARKED_STEPS,
    LIMITS_RUN_START_QUEUE,
)
from shared.steps.advance import advance_step
from tests.admission_support import activate_text, emit_event, make_tenant
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.ops_support import bearer, mint
from tests.steps_support import TENANT, definition, publish_version, start_run


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch) as server:
        yield server


THROTTLED = """
name: throttled
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
  throttle: {limit: 1, period: 1h}
steps:
  - id: start
    type: end
"""

DEBOUNCED = """
name: follow-up-on-edits
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
  debounce: {period: 5s, max_wait: 1m}
steps:
  - id: start
    type: end
"""


def _limits(client: Any, token: str, query: str = "") -> dict[str, Any]:
    got = client.get(f"/v1/limits{query}", headers=bearer(token))
    assert got.status_code == 200, got.get_json()
    body: dict[str, Any] = got.get_json()
    return body


def _admit(db: Database, event_id: int) -> None:
    from shared.admission.admit import admit_event

    admit_event(db, event_id, publish=lambda ids: None)


def _create_task(db: Database, connection_id: str) -> str:
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
                        "properties": {"hs_task_subject": "Call Ada"},
                    },
                }
            ]
        ),
    )
    _, [step_id] = start_run(db, version)
    return step_id


def test_a_connection_limit_shows_the_steps_parked_behind_it_and_the_oldest_wait(
    db: Database, fake: FakeCrm, client: Any
) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET rate_limit_per_window = 1, rate_limit_window_seconds = 3600"
        )
    steps = [_create_task(db, connection_id) for _ in range(4)]
    for step_id in steps:
        advance_step(db, step_id, dispatch=lambda ids: None)
    with db.transaction() as tx:
        parked = tx.all(
            "SELECT started_at FROM workflow_steps WHERE outcome_code = 'THROTTLED' "
            "AND status = 'waiting_for_retry' ORDER BY started_at"
        )
    assert len(parked) == 3  # one window slot: the first ran, three wait

    body = _limits(client, mint(db, tenant=TENANT))
    (view,) = [i for i in body["items"] if i["kind"] == "connection"]
    assert view["subject"] == connection_id and view["tenant_id"] == TENANT
    assert view["limit"] == 1 and view["period_seconds"] == 3600
    # The first refused claim counts (the window ends anyway); the steps after it find it in
    # the limit's line and join it without claiming (shared/gates/limit_queue.py).
    assert view["admitted"] == 2
    assert view["waiting"] == 3 and view["waiting_what"] == "steps"
    assert _same_instant(view["oldest_wait_since"], parked[0]["started_at"])
    assert view["oldest_wait_seconds"] >= 0
    assert view["next_at"] == view["window_end"]
    assert body["truncated"] is False


def test_workflow_and_host_limits_show_the_steps_parked_behind_them(
    db: Database, monkeypatch: pytest.MonkeyPatch, client: Any
) -> None:
    from shared.workflows.definition import WorkflowDefinition
    from tests.blocks_support import http_target

    seed_tenant(db)
    with http_target(monkeypatch) as fake:
        per_limit = {}
        for name, limits in (
            ("per-workflow", {"rate_limit": {"max": 1, "per": "1h"}}),
            ("per-host", {"host_rate_limit": {"max": 1, "per": "1h"}}),
        ):
            version = publish_version(
                db,
                WorkflowDefinition.model_validate(
                    {
                        "name": name,
                        "tenant": TENANT,
                        "trigger": {"events": ["test.thing.created"]},
                        "steps": [
                            {
                                "id": "call",
                                "type": "http.request",
                                "config": {"url": f"{fake.url}/_sink/hook"},
                            }
                        ],
                        **limits,
                    }
                ),
            )
            for _ in range(3):
                _, [step_id] = start_run(db, version)
                advance_step(db, step_id, dispatch=lambda ids: None)
            with db.transaction() as tx:
                per_limit[name] = tx.scalar(
                    "SELECT CAST(workflow_id AS text) FROM workflow_versions WHERE id = :v",
                    v=version,
                )
    items = _limits(client, mint(db, tenant=TENANT))["items"]
    (workflow,) = [i for i in items if i["kind"] == "workflow"]
    assert workflow["subject"] == per_limit["per-workflow"]
    assert (workflow["limit"], workflow["admitted"], workflow["waiting"]) == (1, 2, 2)
    (host,) = [i for i in items if i["kind"] == "host"]
    assert host["subject"] == f"{TENANT}|127.0.0.1" and host["tenant_id"] == TENANT
    assert (host["limit"], host["admitted"], host["waiting"]) == (1, 2, 2)


def _same_instant(shown: str, at: Any) -> bool:
    from datetime import datetime

    return datetime.fromisoformat(shown.replace("Z", "+00:00")) == at


def test_a_run_start_throttle_shows_its_queued_events(db: Database, client: Any) -> None:
    make_tenant(db)
    workflow_id = activate_text(db, THROTTLED)
    for i in range(4):
        _admit(db, emit_event(db, object_id=str(i)))
    body = _limits(client, mint(db, tenant="acme"))
    (view,) = [i for i in body["items"] if i["kind"] == "run_start"]
    assert view["subject"] == f"{workflow_id}|workflow"
    assert view["limit"] == 1 and view["period_seconds"] == 3600
    # The first started; the second claimed (over) and queued; the rest queued behind it.
    assert view["admitted"] == 2
    assert view["waiting"] == 3 and view["waiting_what"] == "events"
    with db.transaction() as tx:
        oldest = tx.scalar("SELECT min(queued_at) FROM run_start_queue")
    assert _same_instant(view["oldest_wait_since"], oldest)


def test_a_debounce_burst_shows_the_events_it_holds(db: Database, client: Any) -> None:
    make_tenant(db)
    workflow_id = activate_text(db, DEBOUNCED)
    for _ in range(3):
        _admit(db, emit_event(db, object_id="7"))
    body = _limits(client, mint(db, tenant="acme"))
    (view,) = [i for i in body["items"] if i["kind"] == "debounce"]
    assert view["subject"].startswith(f"{workflow_id}|")
    assert view["waiting"] == 3 and view["waiting_what"] == "events"
    assert view["period_seconds"] == 5 and view["limit"] is None
    with db.transaction() as tx:
        burst = tx.one("SELECT first_event_at, fire_at FROM debounce_bursts")
    assert burst is not None
    assert _same_instant(view["oldest_wait_since"], burst["first_event_at"])
    assert _same_instant(view["next_at"], burst["fire_at"])


def test_another_tenants_limits_are_not_shown(db: Database, client: Any) -> None:
    make_tenant(db)
    make_tenant(db, "globex")
    activate_text(db, THROTTLED)
    for i in range(2):
        _admit(db, emit_event(db, object_id=str(i)))
    assert _limits(client, mint(db, tenant="globex"))["items"] == []
    refused = client.get("/v1/limits?tenant_id=acme", headers=bearer(mint(db, tenant="globex")))
    assert refused.status_code == 404
    admin = mint(db, tenant=None)
    assert {i["tenant_id"] for i in _limits(client, admin)["items"]} == {"acme"}
    assert _limits(client, admin, "?tenant_id=globex")["items"] == []
    assert [i["tenant_id"] for i in _limits(client, mint(db, tenant="acme"))["items"]] == ["acme"]


@pytest.mark.parametrize(
    ("statement", "index"),
    [
        (LIMITS_PARKED_STEPS, "workflow_steps_throttled"),
        (LIMITS_RUN_START_QUEUE, "run_start_queue_"),
        (LIMITS_DEBOUNCE_BURSTS, "debounce_bursts_due"),
    ],
)
@pytest.mark.parametrize("tenant", ["acme", None])
def test_what_waits_is_read_from_indexes(
    db: Database, statement: Any, index: str, tenant: str | None
) -> None:
    """Each "what waits" read is served by a partial index of the waiting rows only: 0500's
    index of the THROTTLED steps (not the sweep's due index, which holds every waiting step),
    the run-start queue's queued-only indexes, the bursts' unfired-only due index."""
    with db.transaction() as tx:
        tx.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in tx.all("EXPLAIN " + statement.text, tenant_id=tenant, limit=101)
        )
    assert index in plan and "Seq Scan" not in plan, plan


@pytest.mark.e2e
def test_onceflow_limits_prints_the_table_against_a_running_ops_function(
    db: Database, ops_process: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import json

    from shared.ops import cli

    make_tenant(db)
    workflow_id = activate_text(db, THROTTLED)
    for i in range(3):
        _admit(db, emit_event(db, object_id=str(i)))
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_process)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", mint(db, tenant="acme"))

    def onceflow(*argv: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        return cli.main(list(argv), out=out, err=err), out.getvalue()

    code, out = onceflow("limits")
    assert code == cli.EXIT_OK
    header, row = (
        out.splitlines()[0],
        next(line for line in out.splitlines() if line.startswith("run_start")),
    )
    assert header.split() == [
        "LIMIT",
        "TENANT",
        "SUBJECT",
        "WINDOW",
        "ADMITTED",
        "WAITING",
        "OLDEST",
        "NEXT",
    ]
    assert workflow_id[:8] in row
    assert "1 per 3600s" in row and "2 events" in row and "ago" in row
    code, out = onceflow("limits", "--json")
    assert code == cli.EXIT_OK
    (view,) = json.loads(out)["items"]
    assert view["kind"] == "run_start" and view["waiting"] == 2


def test_the_ops_page_shows_the_limits_section(db: Database, client: Any) -> None:
    make_tenant(db)
    make_tenant(db, "globex")
    workflow_id = activate_text(db, THROTTLED)
    for i in range(3):
        _admit(db, emit_event(db, object_id=str(i)))
    assert client.post("/ui/login", data={"token": mint(db, "acme")}).status_code == 303
    page = client.get("/ui").get_data(as_text=True)
    assert "<h2>Limits</h2>" in page and 'class="limit-run_start"' in page
    row = page.split('class="limit-run_start"')[1].split("</tr>")[0]
    assert f"{workflow_id}|workflow" in row and "1 per 3600s" in row and "2 events" in row
    client.post("/ui/login", data={"token": mint(db, "globex")})
    other = client.get("/ui").get_data(as_text=True)
    assert "<h2>Limits</h2>" in other and workflow_id not in other
