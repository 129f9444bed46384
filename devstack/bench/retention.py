"""`make bench-retention`: the retention duty's deletion rate, and what it costs the engine.

Seeds BENCH_RETENTION_RUNS (default 110,000) runs of the bench-steps workflow that finished 100
days ago, each with 4 succeeded steps and their 4 lease-history rows: about 1M expired rows
(9 per run). Then, on the same durable cluster as the pgbench baseline:

1. `make bench-steps`'s executors alone for BENCH_STEPS_SECONDS → steps/s without retention;
2. the same executors again while one thread runs `shared.sweep.retention.prune` pass after pass
   with the duty's own pacing (a backlog: the duty would run one such pass every five
   minutes) → steps/s during a pass, and the expired rows deleted per second of deleting and
   per second of pass (pauses included).

Prints JSON lines (`devstack.bench.baseline.emit`): `retention_rows_deleted` (rows/s, with
runs/s), `steps_settled_without_retention`, `steps_settled_with_retention`, and
`steps_with_retention_ratio` (with / without; the aim is ≥ 0.9).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from devstack import postgres
from devstack.bench import steps as bench_steps
from devstack.bench.baseline import bench_cluster, emit, pgbench_tps
from shared.core.db import Database, connector_from_env
from shared.sweep.retention import Retention, prune

EXPIRED_RUNS = int(os.environ.get("BENCH_RETENTION_RUNS", "110000"))
EXPIRED_STEPS_PER_RUN = 4
ROWS_PER_RUN = 1 + 2 * EXPIRED_STEPS_PER_RUN  # the run, its steps, their lease history


def seed_expired(db: Database, runs: int) -> None:
    """`runs` runs of the seeded workflow finished 100 days ago, with steps and leases."""
    with db.transaction() as tx:
        # Seeding only (not runtime code): one statement per table, in chunks.
        row = tx.one("SELECT workflow_id, id FROM workflow_versions LIMIT 1")
        assert row is not None
        workflow_id, version_id = row["workflow_id"], row["id"]
    chunk = 20000
    for start in range(0, runs, chunk):
        n = min(chunk, runs - start)
        with db.transaction() as tx:
            tx.execute("CREATE TEMP TABLE expired (id uuid) ON COMMIT DROP")
            tx.execute(
                "INSERT INTO expired SELECT gen_random_uuid() FROM generate_series(1, :n)", n=n
            )
            tx.execute(
                "INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,"
                " dedup_mode, trigger_payload, lineage_root, status, created_at, finished_at)"
                " SELECT id, :t, :w, :v, 'expired:' || id, 'every_time', '{}', id, 'succeeded',"
                " now() - interval '101 days', now() - interval '100 days' FROM expired",
                t=bench_steps.TENANT,
                w=workflow_id,
                v=version_id,
            )
            tx.execute(
                "INSERT INTO workflow_steps (id, run_id, step_key, node_id, block_type, status,"
                " attempt, idempotency_key, output, created_at, started_at, finished_at)"
                " SELECT gen_random_uuid(), e.id, 's' || k, 's' || k, :b, 'succeeded', 1,"
                " 'onceflow:' || e.id || ':s' || k, '{\"ok\": true}',"
                " now() - interval '101 days', now() - interval '101 days',"
                " now() - interval '100 days'"
                " FROM expired e CROSS JOIN generate_series(0, :k - 1) AS k",
                b=bench_steps.NOOP.type_name,
                k=EXPIRED_STEPS_PER_RUN,
            )
            tx.execute(
                "INSERT INTO workflow_step_leases (lease_id, step_id, attempt, claimed_at,"
                " end_kind, end_status, outcome_code, ended_at)"
                " SELECT gen_random_uuid(), s.id, 1, now() - interval '101 days', 'settled',"
                " 'succeeded', 'OK', now() - interval '100 days'"
                " FROM workflow_steps s JOIN expired e ON e.id = s.run_id"
            )
    with db.transaction() as tx:
        tx.execute("ANALYZE")


def main() -> None:
    logging.getLogger().setLevel(logging.WARNING)
    with bench_cluster() as cluster:
        baseline = pgbench_tps(cluster, clients=bench_steps.EXECUTORS)
        url = postgres.create_migrated_database(cluster, "retention")
        db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
        try:
            first_steps = bench_steps.seed(db, bench_steps.RUNS * 2)
            seeded = time.monotonic()
            seed_expired(db, EXPIRED_RUNS)
            seed_seconds = time.monotonic() - seeded
        finally:
            db.close()
        half = len(first_steps) // 2

        ran = bench_steps.run_executors(url, first_steps[:half])
        alone, alone_s = ran.steps, ran.seconds
        without = alone / alone_s

        stop = threading.Event()
        deleted: dict[str, int] = {}
        pruning = [0.0]
        pauses = [0.0]

        def paused(seconds: float) -> None:
            started = time.monotonic()
            stop.wait(seconds)
            pauses[0] += time.monotonic() - started

        def retention() -> None:
            rdb = Database(connector_from_env({"DATABASE_URL": url}), pool_size=1)
            started = time.monotonic()
            try:
                while not stop.is_set():
                    # Short passes, so the pruner stops with the executors (same pacing).
                    done = prune(rdb, Retention(pass_seconds=2.0), sleep=paused)
                    for k, v in done.items():
                        deleted[k] = deleted.get(k, 0) + v
                    if not done.get("runs"):
                        break  # nothing expired is left
            finally:
                pruning[0] = time.monotonic() - started
                rdb.close()

        pruner = threading.Thread(target=retention)
        pruner.start()
        ran = bench_steps.run_executors(url, first_steps[half:])
        beside, beside_s = ran.steps, ran.seconds
        stop.set()
        pruner.join()
        with_retention = beside / beside_s

        runs = deleted.get("runs", 0)
        rows = runs * ROWS_PER_RUN
        deleting = pruning[0] - pauses[0]
        emit(
            "retention_rows_deleted",
            rows / deleting if deleting > 0 else 0.0,
            "rows/s",
            None,
            runs_per_s=round(runs / deleting, 1) if deleting > 0 else 0.0,
            rows_per_s_of_pass=round(rows / pruning[0], 1) if pruning[0] else 0.0,
            runs_deleted=runs,
            rows_deleted=rows,
            expired_runs_seeded=EXPIRED_RUNS,
            expired_rows_seeded=EXPIRED_RUNS * ROWS_PER_RUN,
            seed_seconds=round(seed_seconds, 1),
            pass_seconds=round(pruning[0], 2),
            deleting_seconds=round(deleting, 2),
        )
        emit("steps_settled_without_retention", without, "steps/s", baseline)
        emit("steps_settled_with_retention", with_retention, "steps/s", baseline)
        emit(
            "steps_with_retention_ratio",
            with_retention / without if without else 0.0,
            "ratio",
            None,
            aim=0.9,
        )


if __name__ == "__main__":
    main()
