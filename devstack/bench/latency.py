"""`make bench-latency`: how long a user waits from a webhook to its admission decision and to
its run's first step, through the local stack as `make dev` runs it.

It starts its own stack (free ports, a fresh database), binds one every_time workflow, sends
signed HubSpot webhooks at a steady rate from a few client threads, waits until every event is
decided, and prints p50/p99/max of:
- webhook → decision: `delivery_claims.claimed_at - webhook_inbox.received_at`
- webhook → first step started: `workflow_steps.started_at - webhook_inbox.received_at`
Both ends are stamped by the database's clock, so no process clock skews the figures. The
path measured is the one a user has: webhook → inbox → (nudge) drain → outbox → publish →
Pub/Sub emulator push → admit_event → step-ready push → advance_step.

Options: BENCH_LATENCY_EVENTS (default 300), BENCH_LATENCY_RATE per second (default 20),
BENCH_LATENCY_KEEP=1 to leave the stack running afterwards (its logs, to see where time went).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import httpx

from devstack.bench.baseline import percentile
from devstack.bench.local import throwaway_stack
from devstack.fakecrm.webhooks import property_change_body, signed_headers
from devstack.seed import hubspot_tenant
from shared.core.db import Database, connector_from_env

SECRET_ENV = "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET"  # noqa: S105 - a variable name
TENANT = "bench-latency"
PORTAL = 7373


def _seed(db: Database) -> str:
    connection_id, _ = hubspot_tenant(
        db,
        tenant_id=TENANT,
        portal=PORTAL,
        secret_env=SECRET_ENV,
        credits=10_000_000,
        triggers={"latency": {"dedup": "every_time"}},
    )
    return connection_id


def _body(n: int) -> bytes:
    return property_change_body(
        event_id=9_000_000 + n, portal_id=PORTAL, object_id=100_000 + n, value="lead"
    )


def main() -> int:
    events = int(os.environ.get("BENCH_LATENCY_EVENTS", "300"))
    rate = float(os.environ.get("BENCH_LATENCY_RATE", "20"))
    keep = os.environ.get("BENCH_LATENCY_KEEP") == "1"
    with throwaway_stack("onceflow-bench-latency-", keep=keep) as running:
        db = Database(connector_from_env({"DATABASE_URL": running.database_url}), pool_size=2)
        connection_id = _seed(db)
        uri = f"{running.url('webhook')}/hubspot/{connection_id}"
        secret = running.env[SECRET_ENV]
        client = httpx.Client(timeout=10)
        started = time.monotonic()
        lock = threading.Lock()
        failures = 0

        def send(n: int) -> None:
            nonlocal failures
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
            payload = _body(n)
            got = client.post(uri, content=payload, headers=signed_headers(secret, uri, payload))
            if got.status_code >= 300:
                with lock:
                    failures += 1

        threads = [
            threading.Thread(target=lambda k=k: [send(n) for n in range(k, events, 8)])
            for k in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 120
        rows: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            with db.transaction() as tx:
                rows = tx.all(
                    "SELECT EXTRACT(EPOCH FROM c.claimed_at - i.received_at) AS decided,"
                    "       EXTRACT(EPOCH FROM s.started_at - i.received_at) AS first_step,"
                    "       EXTRACT(EPOCH FROM e.created_at - i.received_at) AS drained,"
                    "       EXTRACT(EPOCH FROM e.published_at - e.created_at) AS published,"
                    "       EXTRACT(EPOCH FROM c.claimed_at - e.published_at) AS admitted"
                    " FROM webhook_inbox i"
                    " JOIN workflow_trigger_events e ON e.inbox_id = i.id"
                    " JOIN delivery_claims c ON c.event_id = e.id"
                    " LEFT JOIN workflow_steps s ON s.run_id = c.run_id"
                    " WHERE e.tenant_id = :t",
                    t=TENANT,
                )
            if len(rows) >= events and all(r["first_step"] is not None for r in rows):
                break
            time.sleep(0.5)

        def ms(column: str) -> list[float]:
            return [float(str(r[column])) * 1000 for r in rows if r[column] is not None]

        decided = ms("decided")
        print(
            f"webhooks sent: {events} at {rate:g}/s ({failures} not 2xx); decided: {len(decided)}"
        )
        for name, values in (
            ("webhook → decision", decided),
            ("webhook → first step", ms("first_step")),
            ("  stored → drained", ms("drained")),
            ("  drained → published", ms("published")),
            ("  published → decided", ms("admitted")),
        ):
            if values:
                print(
                    f"{name:22s} p50 {percentile(values, 0.5):7.0f} ms   "
                    f"p99 {percentile(values, 0.99):7.0f} ms   max {max(values):7.0f} ms"
                )
        db.close()
        return 0 if len(decided) >= events and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
