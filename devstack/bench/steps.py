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

Then the realistic mix (issue 27), same executors, same pgbench figure: runs of crm.update →
crm.create → http.request → crm.update against the fake CRM (`python -m devstack.fakecrm`, a
process of its own, answering at once) through a connection whose rate limit never throttles,
each step priced (the specs' prices) and reserved against a workflow budget that never refuses,
the http.request sent to the fake's local receiver (`/_sink/*`). It prints
- `steps_settled_realistic`: steps/s and its ratio, with `db_round_trips_per_step_by_kind` (the
  round trips each kind's steps paid while running concurrently);
- `steps_cost_per_kind`: one more run stepped through alone, warm: each kind's database round
  trips and its commits (transaction ids the server handed out while the step ran: one per
  transaction that wrote).
`BENCH_STEPS_REAL_RUNS` (default 3000) runs are seeded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from devstack import postgres
from devstack import seed as seed_module
from devstack.bench.baseline import bench_cluster, emit, pgbench_tps
from shared.blocks.base import BlockContext, BlockResult, BlockSpec, RetryPolicy
from shared.core.db import Database, connector_from_env
from shared.core.settings import settings
from shared.port import observed
from shared.providers import connect
from shared.steps.advance import advance_step, registry_lookup
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


@dataclass
class Executed:
    """What `run_executors` measured."""

    steps: int
    trips: int  # database round trips, every step (statements, BEGIN/COMMIT)
    setup: int  # once per pooled connection: the session SET, each statement's Parse
    publishes: int
    seconds: float
    latencies: list[float]
    # Per block kind: (steps, database round trips).
    by_kind: dict[str, list[int]] = field(default_factory=dict)


def run_executors(
    url: str, first_steps: list[str], block_lookup: Callable[[str], BlockSpec] | None = None
) -> Executed:
    """Drive `first_steps`' runs to their end with EXECUTORS executors until SECONDS pass;
    `block_lookup`: the blocks (default: the no-op)."""
    resolve = block_lookup or lookup
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
    by_kind: list[dict[str, list[int]]] = [{} for _ in range(EXECUTORS)]

    def noting_lookup(type_name: str) -> BlockSpec:
        executor_of.kind = type_name  # the step this thread runs now is of this kind
        return resolve(type_name)

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
                executor_of.kind = "?"
                before = db.round_trips.count
                result = advance_step(
                    db, step_id, lookup=noting_lookup, dispatch=dispatch, config=lease
                )
                if not result.claimed or result.status != "succeeded":
                    raise RuntimeError(f"step {step_id} did not settle: {result}")
                kind = by_kind[i].setdefault(executor_of.kind, [0, 0])
                kind[0] += 1
                kind[1] += db.round_trips.count - before
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
        warmed = advance_step(warm, first, lookup=resolve, dispatch=lambda ids: None, config=lease)
        if not warmed.claimed or warmed.status != "succeeded":
            raise RuntimeError(f"step {first} did not settle: {warmed}")
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
    kinds: dict[str, list[int]] = {}
    for counted in by_kind:
        for name, (n, t) in counted.items():
            total = kinds.setdefault(name, [0, 0])
            total[0] += n
            total[1] += t
    return Executed(
        steps=sum(settled),
        trips=sum(trips),
        setup=sum(setup),
        publishes=sum(publishes),
        seconds=elapsed,
        latencies=[x for lat in latencies for x in lat],
        by_kind=kinds,
    )


def percentile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def emit_executed(bench: str, ran: Executed, baseline: float, **extra: Any) -> None:
    """The throughput line of one run of the executors (see the module docstring)."""
    steps = ran.steps
    per_step = (ran.trips + ran.setup + ran.publishes) / steps if steps else 0.0
    emit(
        bench,
        steps / ran.seconds,
        "steps/s",
        baseline,
        executors=EXECUTORS,
        in_flight_runs=IN_FLIGHT,
        round_trips_per_step=round(per_step, 2),
        db_round_trips_per_step=round(ran.trips / steps, 2) if steps else 0.0,
        setup_round_trips_per_step=round(ran.setup / steps, 3) if steps else 0.0,
        publishes_per_step=round(ran.publishes / steps, 2) if steps else 0.0,
        dispatch_to_settle_p50_ms=round(percentile(ran.latencies, 50), 2),
        dispatch_to_settle_p99_ms=round(percentile(ran.latencies, 99), 2),
        steps=steps,
        seconds=round(ran.seconds, 2),
        **extra,
    )


# --- the realistic mix ---------------------------------------------------------------------
# What a real workflow's steps do: crm.update → crm.create → http.request → crm.update against
# the fake CRM (a process of its own, answering at once: its own rate limit is lifted), through
# a connection whose rate limit is high enough never to throttle, every step priced and counted
# against a workflow budget large enough never to refuse.
REAL_RUNS = int(os.environ.get("BENCH_STEPS_REAL_RUNS", "3000"))
REAL_TOKEN_ENV = "BENCH_FAKECRM_TOKEN"  # noqa: S105 - the name of a variable, not a secret


@contextlib.contextmanager
def fake_crm_process() -> Iterator[str]:
    """The fake CRM as a process of its own (its HTTP work must not share this process's
    interpreter with the executors); its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack.fakecrm", "--rate-limit-max", "1000000000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield str(json.loads(proc.stdout.readline())["fakecrm"])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def seed_realistic(db: Database, crm_url: str, runs: int) -> tuple[list[str], list[str]]:
    """The mix's workflow and `runs` running runs of it; (their first steps, one more run's
    steps in order — for the per-kind calibration)."""
    with db.transaction() as tx:
        tx.execute("UPDATE tenants SET credit_balance = 1000000000 WHERE id = :t", t=TENANT)
        connection_id = seed_module.connection(
            tx, TENANT, api_credentials_env=REAL_TOKEN_ENV, api_base_url=crm_url
        )
        tx.execute(
            "UPDATE connections SET rate_limit_per_window = 1000000000,"
            " rate_limit_window_seconds = 10 WHERE id = CAST(:c AS uuid)",
            c=connection_id,
        )
    contact = connect.port_for(db, connection_id).create("contacts", {"email": "ada@example.com"})
    crm = {"object_type": "contacts", "connection_id": connection_id}
    steps: list[dict[str, Any]] = [
        {
            "id": "s0",
            "type": "crm.update",
            "next": "s1",
            "config": {**crm, "object_id": contact.id, "properties": {"lifecyclestage": "lead"}},
        },
        {
            "id": "s1",
            "type": "crm.create",
            "next": "s2",
            "config": {
                "object_type": "tasks",
                "connection_id": connection_id,
                "properties": {
                    "hs_task_subject": "Call Ada",
                    "hs_timestamp": "2026-12-03T10:00:00Z",
                },
            },
        },
        {
            "id": "s2",
            "type": "http.request",
            "next": "s3",
            "config": {"url": f"{crm_url}/_sink/bench"},
        },
        {
            "id": "s3",
            "type": "crm.update",
            "config": {
                **crm,
                "object_id": contact.id,
                "properties": {"lifecyclestage": "customer"},
            },
        },
    ]
    definition = {
        "name": "bench-real",
        "tenant": TENANT,
        "trigger": {"events": ["bench.x.y"]},
        "budget": {"credits": 1000000000, "per": "1d"},
        "steps": steps,
    }
    first = seed_running_runs(db, definition, runs + 1, "crm.update")
    return first[1:], [first[0]]


def _xids(db: Database) -> int:
    with db.transaction() as tx:
        return int(tx.scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))


def calibrate(url: str, first_step: str) -> dict[str, dict[str, float]]:
    """One run of the mix stepped through alone, warm (after the throughput run): each step's
    database round trips (`Database.round_trips`) and commits (transaction ids the server
    handed out while it ran: one per transaction that wrote), by block kind."""
    db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
    kinds: dict[str, dict[str, float]] = {}
    try:
        observed.flush(db)  # what the throughput run's ports observed is not this run's
        pending = [first_step]
        noted: list[str] = []

        def noting(type_name: str) -> BlockSpec:
            noted.append(type_name)
            return registry_lookup(type_name)

        while pending:
            step_id = pending.pop(0)
            noted.clear()
            before, trips = _xids(db), db.round_trips.count
            result = advance_step(
                db, step_id, lookup=noting, dispatch=pending.extend, config=LeaseConfig()
            )
            trips, commits = db.round_trips.count - trips, _xids(db) - before
            if result.status != "succeeded":
                raise RuntimeError(f"calibration step {step_id} did not settle: {result}")
            seen = kinds.setdefault(noted[0], {"steps": 0, "round_trips": 0, "commits": 0})
            seen["steps"] += 1
            seen["round_trips"] += trips
            seen["commits"] += commits
    finally:
        db.close()
    return {
        k: {"round_trips": v["round_trips"] / v["steps"], "commits": v["commits"] / v["steps"]}
        for k, v in kinds.items()
    }


def realistic_mix(url: str, baseline: float) -> None:
    """`steps_settled_realistic`: the mix's steps/s against the same pgbench, with round trips
    per step for each block kind as they ran, and (`steps_cost_per_kind`) round trips and
    commits of each kind stepped through alone."""
    os.environ[REAL_TOKEN_ENV] = "bench"  # the connection's token variable (the fake takes any)
    os.environ["ONCEFLOW_HTTP_ALLOW_LOOPBACK"] = "1"  # http.request to the local receiver
    settings.cache_clear()  # read again, with the variable above
    with fake_crm_process() as crm_url:
        setup = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
        try:
            first_steps, (calibration,) = seed_realistic(setup, crm_url, REAL_RUNS)
            with setup.transaction() as tx:
                tx.execute("ANALYZE")
        finally:
            setup.close()
        ran = run_executors(url, first_steps, registry_lookup)
        per_kind = {
            name: round(trips / n, 2) for name, (n, trips) in sorted(ran.by_kind.items()) if n
        }
        emit_executed(
            "steps_settled_realistic",
            ran,
            baseline,
            db_round_trips_per_step_by_kind=per_kind,
        )
        costs = calibrate(url, calibration)
        for name, cost in sorted(costs.items()):
            emit(
                "steps_cost_per_kind",
                cost["round_trips"],
                "round_trips",
                baseline,
                block=name,
                commits=round(cost["commits"], 2),
            )


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
        ran = run_executors(url, first_steps)
        per_step = (ran.trips + ran.setup + ran.publishes) / ran.steps if ran.steps else 0.0
        emit_executed("steps_settled", ran, baseline, steps_per_run=STEPS_PER_RUN)
        emit("steps_round_trips", per_step, "round_trips", baseline)
        emit("steps_dispatch_to_settle_p50_ms", percentile(ran.latencies, 50), "ms", baseline)
        emit("steps_dispatch_to_settle_p99_ms", percentile(ran.latencies, 99), "ms", baseline)
        realistic_mix(url, baseline)


if __name__ == "__main__":
    main()
