"""`make bench-debounce`: 1,000 property changes on 100 records over 10 s, debounced.

A workflow with `debounce: {period: 5s}` (every_time): the 1,000 changes arrive at an even
100 per second, record i % 100 for the i-th, so each record gets a change every second for
10 s (within `period` of each other, inside the default max_wait of 50 s): one burst per
record. Four threads admit the events as they are emitted (the real `admit_event`), while
the real sweep loop (`run_sweep`, its repairs only) fires the bursts as they come due. The
expected result, checked: exactly 100 runs, 900 `superseded` refusals, every event decided
once. Prints JSON lines (`devstack.bench.baseline.emit`):

- `debounce_last_event_to_run_p50` / `_p99`: seconds from a burst's last event (its join)
  to its run's row (the run started) — `period` plus the sweep's lag;
- `debounce_fire_lag_p50` / `_p99`: seconds from the burst's fire time to its run's row;
- `debounce_runs`, `debounce_superseded`: the counts.

On a durable (fsync on) throwaway cluster shared with the load generator: a floor.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from devstack import postgres
from devstack.bench.baseline import bench_cluster, emit
from shared.admission.admit import admit_event
from shared.core.db import Database, connector_from_env
from shared.core.duty import SweepConfig
from shared.ingest.outbox import TriggerEvent
from shared.ingest.outbox import emit as emit_event
from shared.publishing import versions
from shared.sweep.loop import run_sweep

RECORDS = 100
CHANGES = 1_000
SECONDS = 10.0
PERIOD = os.environ.get("BENCH_DEBOUNCE_PERIOD", "5s")
TENANT = "bench"


def seed(db: Database) -> str:
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
        source = {
            "name": "bench-debounce",
            "tenant": TENANT,
            "trigger": {
                "events": ["hubspot.contact.property_changed"],
                "dedup": "every_time",
                "debounce": {"period": PERIOD},
            },
            "steps": [{"id": "start", "type": "end"}],
        }
        published = versions.publish(tx, json.dumps(source), tenant_id=TENANT)
        versions.activate(
            tx, tenant_id=TENANT, workflow_id=published.workflow_id, version_id=published.version_id
        )
    return conn


def change(db: Database, conn: str, i: int) -> None:
    """The i-th property change: recorded (as drain would) and admitted."""
    with db.transaction() as tx:
        event_id = emit_event(
            tx,
            TriggerEvent(
                tenant_id=TENANT,
                event_type="hubspot.contact.property_changed",
                payload={"n": i},
                connection_id=conn,
                record_object_type="contact",
                record_object_id=str(i % RECORDS),
                changed_fields={"phone": str(i)},
            ),
        )
    assert event_id is not None
    admit_event(db, event_id, publish=lambda ids: None)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def measure(db: Database) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one(
            "SELECT (SELECT count(*) FROM workflow_runs) AS runs, "
            "(SELECT count(*) FROM admission_refusals WHERE reason = 'superseded') AS superseded, "
            "(SELECT count(*) FROM admission_refusals) AS refusals, "
            "(SELECT count(*) FROM delivery_claims) AS claims, "
            "(SELECT count(*) FROM debounce_bursts) AS bursts"
        )
        lat = tx.all(
            "SELECT EXTRACT(EPOCH FROM r.created_at - b.last_event_at) AS to_run, "
            "EXTRACT(EPOCH FROM r.created_at - b.fire_at) AS lag "
            "FROM debounce_bursts b JOIN workflow_runs r ON r.id = b.run_id"
        )
    assert row is not None
    return {
        **row,
        "to_run": [float(r["to_run"]) for r in lat],
        "lag": [float(r["lag"]) for r in lat],
    }


def main() -> None:
    logging.getLogger("shared").setLevel(logging.WARNING)  # a line per event otherwise
    with bench_cluster() as cluster:
        url = postgres.create_migrated_database(cluster, "debounce")
        db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=8)
        conn = seed(db)
        done = threading.Event()

        def sweeper() -> None:
            # The scheduled sweep, invoked again as soon as one invocation ends (as if the
            # scheduler ticked continuously): repairs only, no duties.
            while not done.is_set():
                run_sweep(db, 30.0, config=SweepConfig(), dispatch=lambda ids: None, duties=[])
                time.sleep(0.05)

        sweep_thread = threading.Thread(target=sweeper, daemon=True)
        sweep_thread.start()
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = []
            for i in range(CHANGES):
                delay = start + i * SECONDS / CHANGES - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(change, db, conn, i))
            for f in futures:
                f.result()
        emitted_in = time.monotonic() - start
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with db.transaction() as tx:
                left = tx.scalar("SELECT count(*) FROM debounce_bursts WHERE status <> 'fired'")
            if left == 0:
                break
            time.sleep(0.2)
        done.set()
        found = measure(db)
        db.close()
    assert found["runs"] == RECORDS, found["runs"]
    assert found["superseded"] == CHANGES - RECORDS, found["superseded"]
    assert found["refusals"] == CHANGES - RECORDS and found["claims"] == CHANGES
    emit("debounce_runs", found["runs"], "runs", None, bursts=found["bursts"])
    emit("debounce_superseded", found["superseded"], "refusals", None, emitted_in_s=emitted_in)
    for name, key in (("last_event_to_run", "to_run"), ("fire_lag", "lag")):
        for p in (0.5, 0.99):
            emit(f"debounce_{name}_p{round(p * 100)}", percentile(found[key], p), "s", None)


if __name__ == "__main__":
    main()
