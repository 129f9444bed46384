"""`make bench-poll`: one poll pass over a table of 10k and of 1M rows, 1,000 of them pending.

The processed-at pattern promises that a pass costs what is pending, not what the table holds:
the poll query reads the partial index of pending rows (shared/triggers/poll.py). Prints JSON
lines (see `devstack.bench.baseline.emit`):
- `poll_pass_<N>`: the median time of one pass (stamp policy on_attempt, so each pass emits,
  claims and stamps every pending row) over a table of N rows of which PENDING are pending;
- `poll_pass_flatness`: the largest size's median over the smallest's (the target is ≤ 1.2).

Before each timed pass PENDING stamped rows, spread over the table, have their stamp cleared
(the application asking for them to be handled again), untimed, after the last pass's
events are admitted and their runs marked succeeded. Runs on a durable (fsync on)
throwaway cluster. `BENCH_POLL_SIZES` (default `10000,1000000`) and `BENCH_POLL_PASSES`
(default 5) shorten it.
"""

from __future__ import annotations

import logging
import os
import statistics
import time

from devstack import postgres
from devstack.bench.baseline import bench_cluster, emit
from shared.admission.admit import admit_event
from shared.core.db import Database, connector_from_env
from shared.publishing import versions
from shared.triggers import poll

SIZES = tuple(int(s) for s in os.environ.get("BENCH_POLL_SIZES", "10000,1000000").split(","))
PASSES = int(os.environ.get("BENCH_POLL_PASSES", "5"))
PENDING = 1_000
DEFINITION = """
name: enroll
tenant: bench
trigger:
  poll:
    every_seconds: 60
    table: {table: bench.signups, key: id, stamp: enrolled_at,
            where: "enrolled_at is null and plan = 'pro'"}
    stamp_policy: on_attempt
steps:
  - {id: done, type: end}
"""


def seed(db: Database, size: int) -> poll.PollSource:
    with db.transaction() as tx:
        tx.execute("INSERT INTO tenants (id, name, credit_balance) VALUES ('bench', 'bench', 0)")
        tx.execute("CREATE SCHEMA bench")
        tx.execute(
            "CREATE TABLE bench.signups (id bigint PRIMARY KEY, email text NOT NULL,"
            " plan text NOT NULL, enrolled_at timestamptz)"
        )
        tx.execute(
            "INSERT INTO bench.signups SELECT i, 'u' || i || '@bench.test', 'pro', now()"
            " FROM generate_series(1, CAST(:n AS bigint)) AS i",
            n=size,
        )
        tx.execute(
            "CREATE INDEX signups_pending ON bench.signups (id)"
            " WHERE enrolled_at IS NULL AND plan = 'pro'"
        )
        tx.execute("ANALYZE bench.signups")
        published = versions.publish(tx, DEFINITION)
        versions.activate(
            tx,
            tenant_id="bench",
            workflow_id=published.workflow_id,
            version_id=published.version_id,
        )
        (row,) = poll.active_sources(tx)
    return poll.load_source(*row)


def reopen(db: Database, size: int, round_: int) -> None:
    """Clear the stamp of PENDING rows spread over the whole table, after the runs the last
    pass started are admitted and over (a row handled again starts its next generation only
    then: shared/triggers/poll.py `decide`; on a small table the rounds reopen rows again)."""
    with db.transaction() as tx:
        undecided = tx.all("SELECT id FROM workflow_trigger_events WHERE decided_at IS NULL")
    for row in undecided:
        admit_event(db, int(row["id"]), publish=lambda ids: None)
    stride = max(size // PENDING, 1)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET status = 'succeeded', finished_at = now()"
            " WHERE status = 'running'"
        )
        tx.execute(
            "UPDATE bench.signups SET enrolled_at = NULL WHERE id IN (SELECT"
            " 1 + (i * CAST(:stride AS bigint) + CAST(:shift AS bigint)) % CAST(:n AS bigint)"
            " FROM generate_series(0, CAST(:k AS bigint) - 1) AS i)",
            stride=stride,
            shift=round_,
            n=size,
            k=PENDING,
        )


def main() -> None:
    logging.getLogger().setLevel(logging.WARNING)
    medians: dict[int, float] = {}
    with bench_cluster() as cluster:
        for size in SIZES:
            url = postgres.create_migrated_database(cluster, f"poll_{size}")
            db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
            try:
                src = seed(db, size)
                times = []
                for round_ in range(PASSES):
                    reopen(db, size, round_)
                    started = time.perf_counter()
                    report = poll.poll_pass(db, src)
                    times.append(time.perf_counter() - started)
                    if report.emitted != PENDING:
                        raise RuntimeError(
                            f"pass emitted {report.emitted}, not {PENDING}: {report}"
                        )
                medians[size] = statistics.median(times) * 1000
                emit(f"poll_pass_{size}", medians[size], "ms", None, pending=PENDING, passes=PASSES)
            finally:
                db.close()
    smallest, largest = min(medians), max(medians)
    emit(
        "poll_pass_flatness",
        medians[largest] / medians[smallest],
        "x",
        None,
        sizes=[smallest, largest],
        target="<= 1.2",
    )


if __name__ == "__main__":
    main()
