"""Several requests per instance (issue 27, item 4): one real functions-framework advance_step
process, run with the deployment's concurrency and pool (shared/core/deployables.py), is sent twice
as many concurrent Pub/Sub pushes as it has threads. Every push is answered, every step settles,
the process really runs `concurrency` steps side by side, and it never holds more connections
than request threads, so its pool (one more than that) is never empty when a thread asks."""

from __future__ import annotations

from devstack.bench.concurrency import (
    Receiver,
    advance_step_process,
    connections_named,
    feed,
    seed_runs,
    seed_tenant,
)
from devstack.function_process import concurrency_env
from shared.core.db import CHECKOUT_TIMEOUT_SECONDS, Database
from shared.core.deployables import by_name

ADVANCE_STEP = by_name("advance_step")
CALL_SECONDS = 0.3  # the receiver's answer time: long enough that the threads overlap


def test_the_stack_runs_each_function_with_its_deployed_threads_and_pool() -> None:
    assert concurrency_env(ADVANCE_STEP) == {
        "THREADS": str(ADVANCE_STEP.concurrency),
        "DB_POOL_SIZE": str(ADVANCE_STEP.pool_size),
    }
    assert ADVANCE_STEP.concurrency > 1
    assert ADVANCE_STEP.pool_size == ADVANCE_STEP.concurrency + 1


def test_twice_the_threads_in_concurrent_pushes_all_settle_within_the_pool(
    db: Database, database_url: str
) -> None:
    threads = ADVANCE_STEP.concurrency
    pushes = 2 * threads
    seed_tenant(db)
    with Receiver(CALL_SECONDS) as receiver:
        step_ids = seed_runs(db, pushes, receiver.url)
        with advance_step_process(database_url, threads, "concurrency-test") as (base, _):
            # 2 x threads clients at once: gunicorn queues what its threads can't take yet.
            fed = feed(base, step_ids, pushes, seconds=None)
            opened = connections_named(db, "concurrency-test")

    assert (fed.answered, fed.failed) == (pushes, 0)
    with db.transaction() as tx:
        settled = tx.all(
            "SELECT status, count(*) AS n FROM workflow_steps "
            "WHERE id = ANY(CAST(:ids AS uuid[])) GROUP BY status",
            ids=step_ids,
        )
    assert settled == [{"status": "succeeded", "n": pushes}]
    assert receiver.calls == pushes
    # The process ran as many steps at once as it has threads, and no more.
    assert receiver.max_in_flight == threads
    # The pool opens a connection only when none is idle, so `opened` is the most it ever held
    # at once: at most one per request thread, below the pool, so no checkout ever waited.
    assert 2 <= opened <= threads < ADVANCE_STEP.pool_size
    # Nothing stalled on a checkout: two rounds of calls, far from a 30 s checkout timeout.
    assert fed.seconds < CHECKOUT_TIMEOUT_SECONDS / 2
