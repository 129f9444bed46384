"""`make bench-admit`: admission throughput against a pgbench baseline from the same run.

Prints JSON lines (see `devstack.bench.baseline.emit`), for K = 1, 10 and 50 workflows bound
to the event type (once_per_record, every event for a different contact, so every binding
admits a run: the heaviest case):
- `admit_k<K>`: events admitted per second by 8 concurrent consumers (processes, each with
  its own connections, calling `shared.admission.admit.admit_event`), with `runs_per_s`, and
  `round_trips_per_event` counted by `Database.round_trips`;
- `admit_round_trips_k<K>`: the round trips per event on their own line.

Before the consumers start, the bench process admits HISTORY_RUNS runs' worth of earlier events
(at least one event) and ANALYZEs, so the database is one in use, as in production. On empty
tables every lookup admission makes (its generic plans, and the foreign-key checks Postgres
plans once per connection) is planned as a sequential scan, and the 8-second run never lasts
long enough for autovacuum to re-plan them: the scans then grow with every run admitted, and
K=10 measured ~110 events/s instead of ~400.

The step-ready publish is replaced by a no-op: this measures admission's database work, not
the Pub/Sub emulator. Everything runs on one durable (fsync on) throwaway cluster shared with
the load generator, so the figures are a floor, comparable through `ratio` (an admission with
one binding is one commit, like a pgbench -N transaction).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from collections.abc import Iterable
from typing import Any

from devstack import postgres
from devstack.bench.baseline import bench_cluster, emit, pgbench_tps
from shared.admission.admit import admit_event
from shared.core.db import Database, connector_from_env
from shared.publishing import versions

SECONDS = float(os.environ.get("BENCH_ADMIT_SECONDS", "8"))
CONSUMERS = int(os.environ.get("BENCH_ADMIT_CONSUMERS", "8"))
BINDINGS = (1, 10, 50)
# Enough events that the consumers don't run dry before SECONDS at the expected rates.
EVENTS = {1: 20_000, 10: 8_000, 50: 4_000}
HISTORY_RUNS = int(os.environ.get("BENCH_ADMIT_HISTORY_RUNS", "3000"))
TENANT = "bench"


def seed(db: Database, k: int, events: int) -> list[int]:
    """A tenant, a connection, K workflows bound to one event type, `events` events."""
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO tenants (id, name, credit_balance) VALUES (:t, :t, 1000000)", t=TENANT
        )
        conn = str(
            tx.scalar(
                "INSERT INTO connections (tenant_id, provider, webhook_secret_env) "
                "VALUES (:t, 'hubspot', 'BENCH_SECRET') RETURNING id",
                t=TENANT,
            )
        )
        for i in range(k):
            source = {
                "name": f"bench-{i}",
                "tenant": TENANT,
                "trigger": {
                    "events": ["hubspot.contact.property_changed"],
                    "rule": 'record.lifecyclestage == "lead"',
                    "dedup": "once_per_record",
                },
                "steps": [{"id": "start", "type": "end"}],
            }
            published = versions.publish(tx, json.dumps(source), tenant_id=TENANT)
            versions.activate(
                tx,
                tenant_id=TENANT,
                workflow_id=published.workflow_id,
                version_id=published.version_id,
            )
        # Seeding only (not runtime code): one statement for all the events.
        rows = tx.all(
            "INSERT INTO workflow_trigger_events (tenant_id, connection_id, event_type, "
            "source_event_id, record_object_type, record_object_id, changed_fields, payload) "
            "SELECT :t, CAST(:c AS uuid), 'hubspot.contact.property_changed', 'e' || n, "
            "'contact', CAST(n AS text), '{\"lifecyclestage\": \"lead\"}', "
            "jsonb_build_object('objectId', n, 'propertyName', 'lifecyclestage', "
            "'propertyValue', 'lead') FROM generate_series(1, CAST(:n AS integer)) AS n "
            "RETURNING id",
            t=TENANT,
            c=conn,
            n=events,
        )
    with db.transaction() as tx:
        tx.execute("ANALYZE")
    return [int(r["id"]) for r in rows]


def no_publish(step_ids: Iterable[str]) -> None:
    return None


def consumer(url: str, event_ids: list[int], barrier: Any, results: Any) -> None:
    """One consumer process (a Cloud Run instance's worth): admit its share of the events
    until they run out or SECONDS passed; reports (admitted, round trips, error)."""
    logging.getLogger().setLevel(logging.WARNING)  # one INFO line per event would be measured
    db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
    admitted = 0
    error = None
    try:
        # Warm the connection (one: a consumer admits one event at a time, and the pool
        # refuses a second checkout by the same thread, shared.core.db.NestedCheckout).
        with db.transaction() as tx:
            tx.scalar("SELECT 1")
        admit_event(db, event_ids[0], publish=no_publish)  # warm caches (not counted)
        barrier.wait()
        deadline = time.monotonic() + SECONDS
        db.round_trips.reset()
        for event_id in event_ids[1:]:
            if time.monotonic() >= deadline:
                break
            admit_event(db, event_id, publish=no_publish)
            admitted += 1
    except BaseException as exc:
        error = repr(exc)
    finally:
        results.put((admitted, db.round_trips.count, error))
        db.close()


def run_consumers(url: str, event_ids: list[int]) -> tuple[int, int, float]:
    """(events admitted, round trips, seconds) for CONSUMERS processes over `event_ids`.

    Processes, not threads: in production each consumer is its own instance, and threads in
    one interpreter would measure the GIL instead of admission."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(CONSUMERS + 1)
    results = ctx.Queue()
    shares = [event_ids[i::CONSUMERS] for i in range(CONSUMERS)]
    procs = [ctx.Process(target=consumer, args=(url, share, barrier, results)) for share in shares]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    started = time.monotonic()
    reports = [results.get(timeout=SECONDS + 120) for _ in procs]
    elapsed = time.monotonic() - started
    for p in procs:
        p.join(30)
    errors = [r[2] for r in reports if r[2]]
    if errors:
        raise RuntimeError(f"a consumer failed: {errors[0]}")
    return sum(r[0] for r in reports), sum(r[1] for r in reports), elapsed


def main() -> None:
    logging.getLogger().setLevel(logging.WARNING)  # one INFO line per event would be measured
    with bench_cluster() as cluster:
        baseline = pgbench_tps(cluster, clients=CONSUMERS)
        for k in BINDINGS:
            url = postgres.create_migrated_database(cluster, f"admit_k{k}")
            setup = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
            history = max(HISTORY_RUNS // k, 1)
            try:
                event_ids = seed(setup, k, history + EVENTS[k])
                for event_id in event_ids[:history]:
                    admit_event(setup, event_id, publish=no_publish)
                with setup.transaction() as tx:
                    tx.execute("ANALYZE")
            finally:
                setup.close()
            admitted, trips, elapsed = run_consumers(url, event_ids[history:])
            rate = admitted / elapsed
            per_event = trips / admitted if admitted else 0.0
            emit(
                f"admit_k{k}",
                rate,
                "events/s",
                baseline,
                bindings=k,
                consumers=CONSUMERS,
                runs_per_s=round(rate * k, 1),
                round_trips_per_event=round(per_event, 2),
                events=admitted,
                seconds=round(elapsed, 2),
            )
            emit(f"admit_round_trips_k{k}", per_event, "round_trips", baseline, bindings=k)


if __name__ == "__main__":
    main()
