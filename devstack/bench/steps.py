"""`make bench-steps`: step execution throughput against a pgbench baseline from the same run.

A 5-step workflow of no-op action blocks (`bench.noop`, registered in this process only),
driven by 8 concurrent executors (threads, each with its own connections) calling
`shared.steps.advance.advance_step` — claim, execute, settle + next row, dispatch — exactly as
the function does. Pub/Sub is replaced by an in-process queue (this measures the engine's
database work, not the emulator): a settle's dispatch enqueues the next step with its dispatch
time, and a run that ends admits the next seeded run, keeping IN_FLIGHT runs in flight (twice
the executors, so nobody idles and queueing stays small).

Prints JSON lines (see `devstack.bench.baseline.emit`):
- `steps_settled`: steps settled per second, with `round_trips_per_step`: every exchange with
  Postgres (statements, BEGIN/COMMIT, and the per-connection SET and Parse, counted by
  `Database.round_trips`) plus one per publish (a dispatch with ids is one Pub/Sub publish
  request in the function; here an in-process queue), split into `db_round_trips_per_step`,
  `setup_round_trips_per_step` and `publishes_per_step`; and p50/p99 from dispatch to settle
  in milliseconds;
- `steps_round_trips`, `steps_dispatch_to_settle_p50_ms`, `steps_dispatch_to_settle_p99_ms`.
`pgbench -N -c 8` runs on the same durable (fsync on) cluster first; `ratio` compares. A step
is two commits (the claim, the settle), a pgbench -N transaction one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from devstack import postgres
from devstack.bench.baseline import bench_cluster, emit, pgbench_tps
from shared.blocks.base import BlockContext, BlockResult, BlockSpec, RetryPolicy
from shared.core.db import Database, connector_from_env
from shared.steps.advance import advance_step
from shared.steps.claim import LeaseConfig

SECONDS = float(os.environ.get("BENCH_STEPS_SECONDS", "10"))
EXECUTORS = int(os.environ.get("BENCH_STEPS_EXECUTORS", "8"))
IN_FLIGHT = int(os.environ.get("BENCH_STEPS_IN_FLIGHT", str(EXECUTORS * 2)))
RUNS = int(os.environ.get("BENCH_STEPS_RUNS", "6000"))
STEPS_PER_RUN = 5
TENANT = "bench"


class NoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _noop(ctx: BlockContext, config: BaseModel) -> BlockResult:
    return BlockResult(output={"ok": True})


NOOP = BlockSpec(
    type_name="bench.noop",
    config_model=NoConfig,
    kind="action",
    side_effect="none",
    price=0,
    retry=RetryPolicy(),
    execute=_noop,
)


def lookup(type_name: str) -> BlockSpec:
    if type_name != NOOP.type_name:
        raise KeyError(type_name)
    return NOOP


def seed(db: Database, runs: int) -> list[str]:
    """A 5-step workflow version and `runs` running runs with their first step; step ids."""
    steps = [
        {"id": f"s{i}", "type": NOOP.type_name, **({"next": f"s{i + 1}"} if i < 4 else {})}
        for i in range(STEPS_PER_RUN)
    ]
    definition = {
        "name": "bench",
        "tenant": TENANT,
        "trigger": {"events": ["bench.x.y"]},
        "steps": steps,
    }
    with db.transaction() as tx:
        tx.execute("INSERT INTO tenants (id, name) VALUES (:t, :t)", t=TENANT)
    return seed_running_runs(db, definition, runs, NOOP.type_name)


def seed_running_runs(
    db: Database, definition: dict[str, Any], runs: int, block_type: str
) -> list[str]:
    """Version 1 of a new workflow from `definition` (its tenant must exist) and `runs` running
    runs of it, each with its first step `s0` of `block_type`; the step ids, ready to claim.
    Seeding only (not runtime code): one statement each for the runs and their first steps."""
    with db.transaction() as tx:
        wf = tx.scalar(
            "INSERT INTO workflows (tenant_id, name) VALUES (:t, :n) RETURNING id",
            t=definition["tenant"],
            n=definition["name"],
        )
        version = tx.scalar(
            "INSERT INTO workflow_versions (workflow_id, number, content_hash, definition,"
            " source_text) VALUES (:w, 1, repeat('0', 64), CAST(:d AS jsonb), :d) RETURNING id",
            w=wf,
            d=json.dumps(definition),
        )
        tx.execute(
            "INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,"
            " dedup_mode, trigger_payload, lineage_root)"
            " SELECT g.id, :t, :w, :v, 'bench:' || g.id, 'every_time', '{}', g.id"
            " FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, CAST(:n AS integer)))"
            " AS g",
            t=definition["tenant"],
            w=wf,
            v=version,
            n=runs,
        )
        rows = tx.all(
            "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key)"
            " SELECT id, 's0', 's0', :b, 'onceflow:' || id || ':s0'"
            " FROM workflow_runs WHERE version_id = :v"
            " RETURNING CAST(id AS text) AS id",
            b=block_type,
            v=version,
        )
    with db.transaction() as tx:
        tx.execute("ANALYZE")
    return [str(r["id"]) for r in rows]


def run_executors(
    url: str, first_steps: list[str]
) -> tuple[int, tuple[int, int, int], float, list[float]]:
    """(steps settled, (database round trips, setup round trips, publishes), seconds,
    dispatch→settle latencies in ms)."""
    work: queue.SimpleQueue[tuple[str, float]] = queue.SimpleQueue()
    fresh = iter(first_steps)
    fresh_lock = threading.Lock()

    def admit_next_run() -> None:
        with fresh_lock:
            step_id = next(fresh, None)
        if step_id is not None:
            work.put((step_id, time.monotonic()))

    publishes = [0] * EXECUTORS
    executor_of = threading.local()

    def dispatch(ids: Sequence[str]) -> None:
        now = time.monotonic()
        if ids:  # one publish request in the function, whatever the number of ids
            publishes[executor_of.i] += 1
        for step_id in ids:
            work.put((step_id, now))

    barrier = threading.Barrier(EXECUTORS + 1)
    stop = threading.Event()
    settled = [0] * EXECUTORS
    trips = [0] * EXECUTORS
    setup = [0] * EXECUTORS
    latencies: list[list[float]] = [[] for _ in range(EXECUTORS)]
    errors: list[BaseException] = []
    lease = LeaseConfig()

    def executor(i: int) -> None:
        executor_of.i = i
        db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
        try:
            # Warm the connection (an executor holds one at a time: the pool refuses a
            # second checkout by the same thread, see NestedCheckout).
            with db.transaction() as tx:
                tx.scalar("SELECT 1")
            barrier.wait()
            db.round_trips.reset()
            while not stop.is_set():
                try:
                    step_id, dispatched = work.get(timeout=0.5)
                except queue.Empty:
                    continue
                result = advance_step(db, step_id, lookup=lookup, dispatch=dispatch, config=lease)
                if not result.claimed or result.status != "succeeded":
                    raise RuntimeError(f"step {step_id} did not settle: {result}")
                latencies[i].append((time.monotonic() - dispatched) * 1000)
                settled[i] += 1
                if result.run_status == "succeeded":
                    admit_next_run()
        except BaseException as exc:
            errors.append(exc)
            stop.set()
            barrier.abort()  # a failure before the start must not leave the others waiting
        finally:
            trips[i] = db.round_trips.count
            setup[i] = db.round_trips.setup
            db.close()

    # Warm the graph cache on the first step (not counted), then fill the pipeline.
    warm = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
    try:
        first = next(fresh)
        advance_step(warm, first, lookup=lookup, dispatch=lambda ids: None, config=lease)
    finally:
        warm.close()
    for _ in range(IN_FLIGHT):
        admit_next_run()
    threads = [threading.Thread(target=executor, args=(i,)) for i in range(EXECUTORS)]
    for t in threads:
        t.start()
    # An executor that failed before the start breaks the barrier; its error is raised below.
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    started = time.monotonic()
    stop.wait(SECONDS)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    if errors:
        raise errors[0]
    return (
        sum(settled),
        (sum(trips), sum(setup), sum(publishes)),
        elapsed,
        [x for lat in latencies for x in lat],
    )


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    logging.getLogger().setLevel(logging.WARNING)  # one INFO line per step would be measured
    with bench_cluster() as cluster:
        baseline = pgbench_tps(cluster, clients=EXECUTORS)
        url = postgres.create_migrated_database(cluster, "steps")
        setup = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
        try:
            first_steps = seed(setup, RUNS)
        finally:
            setup.close()
        steps, (trips, setup_trips, publishes), elapsed, latencies = run_executors(url, first_steps)
        rate = steps / elapsed
        per_step = (trips + setup_trips + publishes) / steps if steps else 0.0
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        emit(
            "steps_settled",
            rate,
            "steps/s",
            baseline,
            executors=EXECUTORS,
            in_flight_runs=IN_FLIGHT,
            steps_per_run=STEPS_PER_RUN,
            round_trips_per_step=round(per_step, 2),
            db_round_trips_per_step=round(trips / steps, 2) if steps else 0.0,
            setup_round_trips_per_step=round(setup_trips / steps, 3) if steps else 0.0,
            publishes_per_step=round(publishes / steps, 2) if steps else 0.0,
            dispatch_to_settle_p50_ms=round(p50, 2),
            dispatch_to_settle_p99_ms=round(p99, 2),
            steps=steps,
            seconds=round(elapsed, 2),
        )
        emit("steps_round_trips", per_step, "round_trips", baseline)
        emit("steps_dispatch_to_settle_p50_ms", p50, "ms", baseline)
        emit("steps_dispatch_to_settle_p99_ms", p99, "ms", baseline)


if __name__ == "__main__":
    main()
