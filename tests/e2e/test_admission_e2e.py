"""End to end through the local stack: a signed HubSpot webhook becomes exactly one run, and
the same webhook sent again (re-signed, so not byte-identical on the wire; and as HubSpot's
own retry with attemptNumber + 1, so not byte-identical in the body either) starts nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from devstack.fakecrm.webhooks import property_change_body, signed_headers
from devstack.seed import hubspot_tenant
from devstack.stack import RunningStack
from shared.db import Database

pytestmark = pytest.mark.e2e

SECRET_ENV = "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET"
TENANT = "e2e-admission"
PORTAL = 4242


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def webhook_body(event_id: int, object_id: int, stage: str, attempt: int = 0) -> bytes:
    return property_change_body(
        event_id=event_id, portal_id=PORTAL, object_id=object_id, value=stage, attempt=attempt
    )


def test_signed_webhook_admits_one_run_and_the_resent_webhook_none(
    stack: RunningStack, stack_db: Database
) -> None:
    connection_id, _ = hubspot_tenant(
        stack_db,
        tenant=TENANT,
        portal=PORTAL,
        secret_env=SECRET_ENV,
        credits=100,
        triggers={
            "e2e-lead": {"rule": 'record.lifecyclestage == "lead"', "dedup": "once_per_record"}
        },
    )
    uri = f"{stack.url('webhook')}/hubspot/{connection_id}"
    secret = stack.env[SECRET_ENV]

    def post(body: bytes) -> httpx.Response:
        return httpx.post(uri, content=body, headers=signed_headers(secret, uri, body), timeout=10)

    def rows(query: str) -> list[dict[str, Any]]:
        with stack_db.transaction() as tx:
            return tx.all(query, t=TENANT)

    record = f"{connection_id}:contact:9001"
    runs_query = "SELECT id, status, record_key FROM workflow_runs WHERE tenant_id = :t"
    first = webhook_body(70001, 9001, "lead")
    assert post(first).status_code in (200, 204)
    (run,) = wait_for("the run", lambda: rows(runs_query))
    assert run["record_key"] == record
    # advance_step executed the `end` step: the run is finished.
    wait_for(
        "the run to finish",
        lambda: rows(runs_query + " AND status = 'succeeded'"),
    )

    # The same webhook again: re-signed (new timestamp header), and HubSpot's own retry.
    time.sleep(0.01)
    assert post(first).status_code in (200, 204)
    assert post(webhook_body(70001, 9001, "lead", attempt=1)).status_code in (200, 204)
    inbox_query = (
        "SELECT i.deliveries, i.status, i.outcome FROM webhook_inbox i "
        "JOIN connections c ON c.id = i.connection_id WHERE c.tenant_id = :t ORDER BY i.id"
    )

    def drained() -> list[dict[str, Any]] | None:
        r = rows(inbox_query)
        done = len(r) == 2 and all(x["status"] != "pending" for x in r)
        return r if done and r[0]["deliveries"] == 2 else None

    inbox = wait_for("the resent webhooks to be drained", drained)
    # Explained: the identical body was the same inbox row (deliveries = 2); the retry with a
    # new attemptNumber is a new row that produced no trigger event (same provider event id).
    assert inbox[0]["deliveries"] == 2
    assert inbox[1]["outcome"]["produced"] == 0, inbox[1]
    # A new provider event for the same record that matches the rule again: admission refuses
    # it as a duplicate (once_per_record), with the run that enrolled the record.
    assert post(webhook_body(70002, 9001, "customer")).status_code in (200, 204)
    assert post(webhook_body(70003, 9001, "lead")).status_code in (200, 204)
    refusals_query = "SELECT reason, detail FROM admission_refusals WHERE tenant_id = :t"

    def refused_both() -> dict[str, str] | None:
        found = {r["reason"]: r["detail"] for r in rows(refusals_query)}
        return found if len(found) == 2 else None

    # (The two events may be admitted in either order: compare by reason.)
    refused = wait_for("the refusals", refused_both)
    assert set(refused) == {"rule_not_matched", "duplicate"}
    assert f"already enrolled by run {run['id']}" in refused["duplicate"]
    assert len(rows(runs_query)) == 1
