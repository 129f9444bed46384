"""End to end through the local stack: a change in a portal of a HubSpot app becomes exactly
one run, however HubSpot delivers it, and the same event delivered again starts nothing.

The fake CRM sends the webhooks to the app's one URL in its realistic mode (concurrent,
shuffled, some batches twice, some acknowledged ones again with attemptNumber + 1); on top of
that the test sends HubSpot's own retry of the first change itself (attemptNumber + 1, so not
byte-identical, re-signed), so the property does not depend on which batches the fake chose
to repeat. A later 'customer' and a second 'lead' for the same contact are refused by
admission, with reasons."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from devstack.fakecrm.webhooks import signed_headers
from devstack.seed import hubspot_tenant
from devstack.stack import RunningStack
from shared.core.db import Database
from tests.e2e.fake_hubspot import FAKE_APP_ID, SECRET_ENV, app_delivery

pytestmark = pytest.mark.e2e

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


def test_a_change_delivered_realistically_admits_one_run_and_its_retry_none(
    stack: RunningStack, stack_db: Database
) -> None:
    connection_id, _ = hubspot_tenant(
        stack_db,
        tenant_id=TENANT,
        portal=PORTAL,
        secret_env=SECRET_ENV,
        credits=100,
        app_id=FAKE_APP_ID,
        triggers={
            "e2e-lead": {"rule": 'record.lifecyclestage == "lead"', "dedup": "once_per_record"}
        },
    )

    def rows(query: str) -> list[dict[str, Any]]:
        with stack_db.transaction() as tx:
            return tx.all(query, t=TENANT, a=FAKE_APP_ID)

    runs_query = "SELECT id, status, record_key FROM workflow_runs WHERE tenant_id = :t"
    events_query = "SELECT id FROM workflow_trigger_events WHERE tenant_id = :t"
    pending_query = (
        "SELECT id FROM webhook_inbox WHERE app_id = :a AND status = 'pending'"
        " UNION ALL SELECT i.id FROM webhook_inbox i JOIN connections c"
        " ON c.id = i.connection_id WHERE c.tenant_id = :t AND i.status = 'pending'"
    )
    with app_delivery(stack, stack_db) as fake:
        contact = fake.create_contact(PORTAL, {"email": "ada@e2e-admission.example"})
        sent_before = len(fake.deliveries())
        fake.deliver()
        fake.update_contact(PORTAL, contact, {"lifecyclestage": "lead"})
        assert fake.flush()
        (run,) = wait_for("the run", lambda: rows(runs_query))
        assert run["record_key"] == f"{connection_id}:contact:{contact}"
        # advance_step executed the `end` step: the run is finished.
        wait_for("the run to finish", lambda: rows(runs_query + " AND status = 'succeeded'"))

        # HubSpot's own retry of that change: attemptNumber + 1, re-signed, to the app URL.
        (lead,) = {
            json.dumps(dict(e, attemptNumber=0), sort_keys=True)
            for d in fake.deliveries()[sent_before:]
            for e in d["events"]
            if e["portalId"] == PORTAL and 200 <= (d["status"] or 0) < 300
        }
        retry = json.dumps([dict(json.loads(lead), attemptNumber=1)]).encode()
        headers = signed_headers(stack.env[SECRET_ENV], fake.app_url, retry)
        assert httpx.post(fake.app_url, content=retry, headers=headers, timeout=10).is_success
        wait_for("the retry to be drained", lambda: not rows(pending_query))
        assert len(rows(events_query)) == 1, "a delivery of the same change made a new event"
        assert len(rows(runs_query)) == 1

        # New changes for the same contact: admission refuses them (once_per_record), with
        # reasons. One at a time: delivered together in the other order, the 'customer'
        # change would be older than the record's last known stage and dropped before
        # admission (out of order), the second 'lead' an unchanged value.
        refusals_query = "SELECT reason, detail FROM admission_refusals WHERE tenant_id = :t"

        def refused(reason: str) -> dict[str, Any] | None:
            found = [r for r in rows(refusals_query) if r["reason"] == reason]
            return found[0] if found else None

        fake.update_contact(PORTAL, contact, {"lifecyclestage": "customer"})
        assert fake.flush()
        wait_for("the customer stage refused", lambda: refused("rule_not_matched"))
        fake.update_contact(PORTAL, contact, {"lifecyclestage": "lead"})
        assert fake.flush()
        duplicate = wait_for("the second lead refused", lambda: refused("duplicate"))
    assert {r["reason"] for r in rows(refusals_query)} == {"rule_not_matched", "duplicate"}
    assert f"already enrolled by run {run['id']}" in duplicate["detail"]
    assert len(rows(runs_query)) == 1
    assert len(rows(events_query)) == 3  # lead, customer, lead: each change once
