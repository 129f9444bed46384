"""`make bench-ingest`: the events-in path against a pgbench baseline from the same run.

Prints JSON lines (see `devstack.bench.baseline.emit`):
- `webhook_accepted`: signed HubSpot webhooks answered 200 per second by a real
  functions-framework `webhook` process over loopback (nudge off: the bare receive path);
- `inbox_drained`: inbox rows (one property change each) drained per second by one drainer,
  with `round_trips_per_row` (statements sent, counted by `Database.round_trips`);
- `outbox_published`: outbox ids published per second to the Pub/Sub emulator;
- `outbox_claim_1k_published` / `outbox_claim_1m_published`: the publisher's claim statement
  (median ms) with 1,000 and then 1,000,000 already-published rows in the table — the partial
  "unpublished" index should keep the two close.

Everything runs on one durable (fsync on) throwaway cluster; the load generator shares the
machine's cores with the server, so the figures are a floor, comparable through `ratio`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import statistics
import threading
import time
import uuid
from contextlib import AbstractContextManager

import httpx

from devstack import emulator, postgres
from devstack.bench.baseline import bench_cluster, emit, pgbench_tps
from devstack.fakecrm.webhooks import signed_headers
from devstack.function_process import serve
from shared.accounts.connections import create_connection
from shared.core.db import Database, connector_from_env
from shared.core.pubsub import Publisher
from shared.ingest import inbox, outbox

SECRET = secrets.token_hex(16)  # per run: the webhook process gets it through its env
WEBHOOK_SECONDS = float(os.environ.get("BENCH_WEBHOOK_SECONDS", "8"))
CLIENT_THREADS = int(os.environ.get("BENCH_CLIENT_THREADS", "8"))
CLAIM_SAMPLES = 50


def migrated_database(cluster: postgres.Cluster, name: str) -> Database:
    url = postgres.create_migrated_database(cluster, name)
    return Database(connector_from_env({"DATABASE_URL": url}), pool_size=8)


def webhook_process(database_url: str) -> AbstractContextManager[str]:
    env = {
        "DATABASE_URL": database_url,
        "BENCH_HUBSPOT_SECRET": SECRET,
        "WEBHOOK_NUDGE": "off",
        "DB_POOL_SIZE": "8",
        "LOG_LEVEL": "WARNING",
    }
    return serve("webhook", env)


def hubspot_body(event_id: int) -> bytes:
    event = {
        "eventId": event_id,
        "subscriptionType": "contact.propertyChange",
        "objectId": event_id % 5000,
        "propertyName": "lifecyclestage",
        "propertyValue": f"stage-{event_id}",
        "occurredAt": 1_700_000_000_000 + event_id,
        "changeSource": "CRM_UI",
        "sourceId": "userId:1",
        "portalId": 1,
        "attemptNumber": 0,
    }
    return json.dumps([event]).encode()


def bench_webhooks(base: str, connection_id: str) -> tuple[float, int]:
    path = f"/hubspot/{connection_id}"
    counter = iter(range(1, 10**9))
    lock = threading.Lock()
    accepted = [0] * CLIENT_THREADS
    refused: list[int] = []
    stop_at = time.monotonic() + WEBHOOK_SECONDS

    def client(n: int) -> None:
        with httpx.Client(timeout=10) as http:
            while time.monotonic() < stop_at:
                with lock:
                    event_id = next(counter)
                body = hubspot_body(event_id)
                response = http.post(
                    base + path, content=body, headers=signed_headers(SECRET, base + path, body)
                )
                if response.status_code == 200:
                    accepted[n] += 1
                else:
                    refused.append(response.status_code)

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENT_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    if refused:
        raise RuntimeError(f"{len(refused)} webhooks refused, e.g. {refused[:3]}")
    return sum(accepted) / elapsed, sum(accepted)


def claim_median_ms(cluster: postgres.Cluster, database: str) -> float:
    """Median time of the claim statement; each sample is rolled back, so all see one table."""
    import pg8000.native

    conn = pg8000.native.Connection(
        user="postgres", host="127.0.0.1", port=cluster.port, database=database
    )
    samples = []
    try:
        # Start from a clean table: each rolled-back sample leaves dead row versions behind,
        # and the second measurement must not pay for the first one's.
        conn.run("VACUUM ANALYZE workflow_trigger_events")
        for _ in range(CLAIM_SAMPLES):
            conn.run("BEGIN")
            started = time.perf_counter()
            conn.run(outbox.CLAIM.text, hold_id=str(uuid.uuid4()), hold_seconds=60.0, limit=100)
            samples.append((time.perf_counter() - started) * 1000)
            conn.run("ROLLBACK")
    finally:
        conn.close()
    return statistics.median(samples)


def seed_published(db: Database, tenant: str, total: int) -> None:
    """Top the table up to `total` rows of already-published history, in 100k-row chunks
    (each statement stays well inside the driver's socket timeout)."""
    with db.transaction() as tx:
        have = int(tx.scalar("SELECT count(*) FROM workflow_trigger_events") or 0)
    missing = max(0, total - have)
    while missing > 0:
        chunk = min(missing, 100_000)
        with db.transaction() as tx:
            tx.execute(
                "INSERT INTO workflow_trigger_events"
                " (tenant_id, event_type, payload, published_at)"
                " SELECT :tenant, 'bench.row.seeded', '{}'::jsonb, now()"
                " FROM generate_series(1, :n)",
                tenant=tenant,
                n=chunk,
            )
        missing -= chunk
    with db.transaction() as tx:
        tx.execute("ANALYZE workflow_trigger_events")


def main() -> None:
    os.environ.setdefault("NO_GCE_CHECK", "true")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    with bench_cluster() as cluster:
        baseline = pgbench_tps(cluster)
        db = migrated_database(cluster, "onceflow")
        with db.transaction() as tx:
            tx.execute("INSERT INTO tenants (id, name) VALUES ('bench', 'bench')")
            connection_id = create_connection(
                tx,
                tenant_id="bench",
                provider="hubspot",
                webhook_secret_env="BENCH_HUBSPOT_SECRET",  # noqa: S106 - a variable name
                watched_fields={"contact": ["lifecyclestage"]},
            )

        with webhook_process(cluster.url("onceflow")) as base:
            rate, stored = bench_webhooks(base, connection_id)
        emit("webhook_accepted", rate, "webhooks/s", baseline, count=stored)

        started = time.monotonic()
        db.round_trips.reset()
        report = inbox.drain_inbox(db, budget_seconds=600, until_empty=True)
        elapsed = time.monotonic() - started
        emit(
            "inbox_drained",
            report.processed / elapsed,
            "rows/s",
            baseline,
            count=report.processed,
            events=report.events,
            round_trips_per_row=round(db.round_trips.count / max(report.processed, 1), 2),
        )

        with emulator.running() as host:
            os.environ["PUBSUB_EMULATOR_HOST"] = host
            publisher = Publisher("onceflow-bench")
            publisher._get_client().create_topic(name=publisher.topic_path("trigger-events"))
            started = time.monotonic()
            published = outbox.publish_outbox(
                db, budget_seconds=600, until_empty=True, publisher=publisher
            )
            elapsed = time.monotonic() - started
        emit(
            "outbox_published",
            published.published / elapsed,
            "ids/s",
            baseline,
            count=published.published,
        )
        db.close()

        claims = migrated_database(cluster, "claims")
        with claims.transaction() as tx:
            tx.execute("INSERT INTO tenants (id, name) VALUES ('bench', 'bench')")
        seed_published(claims, "bench", 1_000)
        with claims.transaction() as tx:  # a batch waiting to be published, as in production
            for n in range(100):
                outbox.emit(tx, outbox.TriggerEvent("bench", "bench.row.pending", {"n": n}))
        emit("outbox_claim_1k_published", claim_median_ms(cluster, "claims"), "ms", baseline)
        seed_published(claims, "bench", 1_000_000)
        emit("outbox_claim_1m_published", claim_median_ms(cluster, "claims"), "ms", baseline)
        claims.close()


if __name__ == "__main__":
    main()
