"""`make bench-e2e`: the figure a user feels — signed HubSpot batches in, 3-step runs finished —
through the local stack as `make dev` runs it, against `pgbench -N -c 8` on the same cluster in
the same run.

It starts its own stack (free ports, a fresh durable cluster), measures pgbench on that cluster
first (nothing else is running yet), binds one every_time workflow of three steps (branch →
branch → end: engine work only, no vendor calls), then sends signed HubSpot batches of
`BENCH_E2E_BATCH` events to the connection's webhook URL at `BENCH_E2E_RATE` events per second
for `BENCH_E2E_SECONDS`, from a few client threads, and waits until every run has finished.
A few unmeasured requests go first, so the figures are the steady state, not the first
requests of fresh processes.
The path is the real one: webhook → inbox → (nudge) drain → outbox → publish → Pub/Sub emulator
push → admit_event → step-ready push → advance_step, three times.

Every figure is clocked by the database (no process clock skews it):
- throughput: runs finished / (last `workflow_runs.finished_at` - first
  `webhook_inbox.received_at`). At an offered rate the stack keeps up with, it equals that
  rate; raise `BENCH_E2E_RATE` until it stops following to find the capacity;
- webhook → first step started: `min(workflow_steps.started_at) - webhook_inbox.received_at`;
- webhook → run finished: `workflow_runs.finished_at - webhook_inbox.received_at`;
plus the breakdown of where the first-step latency goes (stored → drained → published →
decided → first step started), p50/p99 each.

Prints one human table and JSON lines (`devstack.bench.baseline.emit`). Options (environment):
BENCH_E2E_RATE (events/s, default 100), BENCH_E2E_SECONDS (default 10), BENCH_E2E_BATCH
(events per request, 1..100, default 10), BENCH_E2E_PGBENCH_SECONDS (default 10, 0 skips it),
BENCH_E2E_WAIT (seconds to wait for the last run, default 120), BENCH_E2E_KEEP=1 to leave the
stack running (its logs show where time went).

Then the bill (issue 27 item 6): every function process logs the requests it served
(`devstack.function_server`), and devstack/bench/bill.py turns them into what Cloud Run would
bill: per function, invocations per run, request duration p50/p99 and billed instance time per
run under the deployed concurrency and the 100 ms rounding; then one idle tick of each
scheduled function, timed on the quiet stack; then dollars per million runs at 5k, 500k and
50M runs a day, with the fixed month (ticks, warm webhook instances, database, connector)
spread over them. BENCH_E2E_BILL=0 skips the idle ticks.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from devstack import scheduler
from devstack import stack as devstack
from devstack.bench import bill
from devstack.bench.baseline import emit, percentile, pgbench_tps
from devstack.bench.local import cluster, throwaway_stack
from devstack.fakecrm.webhooks import property_change_body, signed_headers
from devstack.function_server import REQUEST_LOG_ENV
from devstack.seed import hubspot_tenant
from shared.core.db import Database, connector_from_env
from shared.core.deployables import DEPLOYABLES, by_name

SECRET_ENV = "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET"  # noqa: S105 - a variable name
TENANT = "bench-e2e"
PORTAL = 7474
CLIENT_THREADS = 4
# Single-event requests sent and finished before the measured ones, from batch numbers no
# measured request reaches.
WARMUP_BATCHES = 8
WARMUP_FIRST = 1_000_000
# Three steps that exercise the engine only (claim, execute, settle, dispatch the next).
STEPS = (
    {"id": "first", "type": "branch", "branches": [{"when": "true", "next": "second"}]},
    {"id": "second", "type": "branch", "branches": [{"when": "true", "next": "done"}]},
    {"id": "done", "type": "end"},
)

# One row per event, every interval stamped by the database's clock.
MEASURE = """
SELECT EXTRACT(EPOCH FROM i.received_at) AS received,
       EXTRACT(EPOCH FROM r.finished_at) AS finished,
       EXTRACT(EPOCH FROM e.created_at - i.received_at) AS drained,
       EXTRACT(EPOCH FROM e.published_at - e.created_at) AS published,
       EXTRACT(EPOCH FROM c.claimed_at - e.published_at) AS decided,
       EXTRACT(EPOCH FROM s.first_started - c.claimed_at) AS dispatched,
       EXTRACT(EPOCH FROM s.first_started - i.received_at) AS first_step,
       EXTRACT(EPOCH FROM r.finished_at - i.received_at) AS run
  FROM webhook_inbox i
  JOIN workflow_trigger_events e ON e.inbox_id = i.id
  LEFT JOIN delivery_claims c ON c.event_id = e.id
  LEFT JOIN workflow_runs r ON r.id = c.run_id
  LEFT JOIN LATERAL (SELECT min(started_at) AS first_started
                       FROM workflow_steps WHERE run_id = r.id) s ON true
 WHERE e.tenant_id = :t AND i.received_at >= :since
"""


def _options() -> dict[str, float]:
    def number(name: str, default: str) -> float:
        raw = os.environ.get(name, default)
        try:
            return float(raw)
        except ValueError:
            raise SystemExit(f"{name}={raw!r} is not a number") from None

    opts = {
        "rate": number("BENCH_E2E_RATE", "100"),
        "seconds": number("BENCH_E2E_SECONDS", "10"),
        "batch": number("BENCH_E2E_BATCH", "10"),
        "pgbench_seconds": number("BENCH_E2E_PGBENCH_SECONDS", "10"),
        "wait": number("BENCH_E2E_WAIT", "120"),
    }
    if opts["rate"] <= 0 or opts["seconds"] <= 0 or not 1 <= opts["batch"] <= 100:
        raise SystemExit("BENCH_E2E_RATE and _SECONDS must be > 0, BENCH_E2E_BATCH 1..100")
    return opts


def batch_body(first: int, size: int) -> bytes:
    """One HubSpot delivery of `size` propertyChange events (distinct event and object ids)."""
    events: list[Any] = []
    for n in range(first, first + size):
        events += json.loads(
            property_change_body(
                event_id=8_000_000 + n, portal_id=PORTAL, object_id=200_000 + n, value="lead"
            )
        )
    return json.dumps(events, separators=(",", ":")).encode()


def send(
    uri: str, secret: str, *, rate: float, seconds: float, batch: int, first: int = 0
) -> tuple[int, int]:
    """(events sent, requests not answered 2xx), batches paced to `rate` events/s; batch
    numbers from `first` (so no two sends share an event)."""
    requests = max(1, round(rate * seconds / batch))
    started = time.monotonic()
    failures = 0
    lock = threading.Lock()

    def worker(k: int) -> None:
        nonlocal failures
        with httpx.Client(timeout=30) as client:
            for n in range(k, requests, CLIENT_THREADS):
                time.sleep(max(0.0, started + n * batch / rate - time.monotonic()))
                body = batch_body((first + n) * batch, batch)
                got = client.post(uri, content=body, headers=signed_headers(secret, uri, body))
                if got.status_code >= 300:
                    with lock:
                        failures += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(CLIENT_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return requests * batch, failures


def wait_finished(
    db: Database, events: int, timeout: float, since: datetime
) -> list[dict[str, Any]]:
    """The MEASURE rows of the events received since `since`, once `events` runs finished
    (or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with db.transaction() as tx:
            rows = tx.all(MEASURE, t=TENANT, since=since)
        if len(rows) >= events and all(r["finished"] is not None for r in rows):
            break
        time.sleep(0.5)
    return rows


def cpu_seconds(root: Path) -> dict[str, float]:
    """CPU seconds used so far by each component of the stack (process groups)."""
    return {p.name: p.cpu_seconds() for p in devstack.read_pids(root)}


def report(
    rows: list[dict[str, Any]],
    *,
    events: int,
    failures: int,
    opts: dict[str, float],
    pgbench: float | None,
    cpu: dict[str, float],
    wall: float,
) -> bool:
    finished = [r for r in rows if r["finished"] is not None]

    def ms(column: str) -> list[float]:
        return [float(r[column]) * 1000 for r in rows if r[column] is not None]

    rate = 0.0
    if finished:
        span = max(float(r["finished"]) for r in finished) - min(float(r["received"]) for r in rows)
        rate = len(finished) / span if span > 0 else 0.0
    print(
        f"sent {events} events in batches of {opts['batch']:g} at {opts['rate']:g}/s "
        f"for {opts['seconds']:g} s ({failures} requests not 2xx); runs finished: "
        f"{len(finished)}; pgbench -N -c 8 on the same cluster: "
        f"{f'{pgbench:.0f} TPS' if pgbench else 'skipped'}"
    )
    print(
        f"{'webhook → run finished':30s} {rate:8.1f} events/s"
        + (f"   ratio {rate / pgbench:.4f}" if pgbench else "")
    )
    for name, column in (
        ("webhook → first step started", "first_step"),
        ("webhook → run finished", "run"),
        ("  stored → drained", "drained"),
        ("  drained → published", "published"),
        ("  published → decided", "decided"),
        ("  decided → first step", "dispatched"),
    ):
        values = ms(column)
        if values:
            print(
                f"{name:30s} p50 {percentile(values, 0.5):7.0f} ms   "
                f"p99 {percentile(values, 0.99):7.0f} ms   max {max(values):7.0f} ms"
            )
    busy = sorted(cpu.items(), key=lambda kv: -kv[1])
    print(
        f"CPU seconds while sending and waiting ({wall:.1f} s wall, {os.cpu_count()} cores): "
        + ", ".join(f"{name} {seconds:.1f}" for name, seconds in busy if seconds >= 0.05)
    )
    first, run = ms("first_step"), ms("run")
    emit(
        "e2e_throughput",
        rate,
        "events/s",
        pgbench,
        offered_rate=opts["rate"],
        batch=int(opts["batch"]),
        events=events,
        finished=len(finished),
    )
    for bench, values in (("e2e_first_step_latency", first), ("e2e_run_latency", run)):
        if values:
            emit(
                bench,
                percentile(values, 0.5),
                "ms p50",
                pgbench,
                p99_ms=round(percentile(values, 0.99), 1),
                offered_rate=opts["rate"],
            )
    return len(finished) >= events and failures == 0


def served(log_dir: Path, since: float, until: float) -> dict[str, list[bill.Request]]:
    """Per function, the requests that started in [since, until] (wall clock)."""
    found: dict[str, list[bill.Request]] = {}
    for d in DEPLOYABLES:
        path = log_dir / f"{d.name}.log"
        lines = path.read_text("utf-8").split() if path.exists() else []
        pairs = zip(lines[0::2], lines[1::2], strict=True)
        found[d.name] = [
            bill.Request(float(a), float(b)) for a, b in pairs if since <= float(a) <= until
        ]
    return found


def idle_ticks(running: devstack.RunningStack) -> dict[str, float]:
    """Seconds one call of each scheduled function takes on a stack with nothing to do."""

    def call(job: scheduler.Job) -> tuple[str, float]:
        started = time.monotonic()
        httpx.request(
            job.method,
            running.url(job.function),
            headers={**dict(job.headers), "User-Agent": "Google-Cloud-Scheduler"},
            content=job.body,
            timeout=job.deadline_seconds + 10,
        )
        return job.function, time.monotonic() - started

    jobs = scheduler.declared_jobs()
    with ThreadPoolExecutor(len(jobs)) as pool:
        return dict(pool.map(call, jobs))


def report_bill(
    requests: dict[str, list[bill.Request]], runs: int, ticks: dict[str, float] | None
) -> None:
    shapes = bill.shapes_from_infra()
    per_run = 0.0
    print(
        f"{'function':16s} {'calls/run':>9s} {'p50 ms':>7s} {'p99 ms':>7s} "
        f"{'billed s/run':>12s} {'$ per 1M runs':>13s}   (concurrency as deployed)"
    )
    for name, reqs in requests.items():
        if not reqs or by_name(name).trigger == "schedule" or runs == 0:
            continue  # scheduled functions are billed per tick, below, not per run
        durations = [(r.end - r.start) * 1000 for r in reqs]
        billed = bill.billed_seconds(reqs, by_name(name).concurrency) / runs
        dollars = shapes[name].dollars(billed, len(reqs) / runs)
        per_run += dollars
        print(
            f"{name:16s} {len(reqs) / runs:9.2f} {percentile(durations, 0.5):7.0f} "
            f"{percentile(durations, 0.99):7.0f} {billed:12.4f} {dollars * 1e6:13.2f}"
        )
        emit(f"bill_{name}_billed_seconds_per_run", billed, "s/run", None, calls=len(reqs))
    print(f"{'runs, variable part':16s} {'':>9s} {'':>7s} {'':>7s} {'':>12s} {per_run * 1e6:13.2f}")
    if ticks is None:
        return
    fixed = bill.fixed_from_infra(shapes, ticks)
    print(
        "an idle month (infra defaults): "
        + ", ".join(f"{line} ${amount:.2f}" for line, amount in fixed.lines)
        + f" = ${fixed.total:.2f}"
    )
    for per_day in (5_000, 500_000, 50_000_000):
        cost = bill.per_million_runs(per_run, fixed, per_day)
        print(f"  at {per_day:>10,} runs/day: ${cost:9.2f} per million runs")
        emit("bill_per_million_runs", cost, "$", None, runs_per_day=per_day)
    emit(
        "bill_idle_month", fixed.total, "$", None, ticks={k: round(v, 3) for k, v in ticks.items()}
    )


def main() -> int:
    opts = _options()
    keep = os.environ.get("BENCH_E2E_KEEP") == "1"
    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-bench-requests-"))
    os.environ[REQUEST_LOG_ENV] = str(log_dir)
    with throwaway_stack("onceflow-bench-e2e-", keep=keep) as running:
        pgbench = None
        if opts["pgbench_seconds"] > 0:
            pgbench = pgbench_tps(cluster(running), seconds=int(opts["pgbench_seconds"]))
        db = Database(connector_from_env({"DATABASE_URL": running.database_url}), pool_size=1)
        connection_id, _ = hubspot_tenant(
            db,
            tenant_id=TENANT,
            portal=PORTAL,
            secret_env=SECRET_ENV,
            credits=10_000_000,
            triggers={"e2e": {"dedup": "every_time"}},
            steps=STEPS,
        )
        uri = f"{running.url('webhook')}/hubspot/{connection_id}"
        secret = running.env[SECRET_ENV]
        # Warm-up, not measured: every process's first requests import modules, open pooled
        # connections and prepare statements. The figures are the steady state after it.
        warm, _ = send(uri, secret, rate=WARMUP_BATCHES, seconds=1, batch=1, first=WARMUP_FIRST)
        wait_finished(db, warm, opts["wait"], since=datetime.min.replace(tzinfo=UTC))
        with db.transaction() as tx:
            since = tx.one("SELECT clock_timestamp() AS now")["now"]
        cpu_before, clock = cpu_seconds(running.root), time.monotonic()
        window_start = time.time()
        events, failures = send(
            uri,
            secret,
            rate=opts["rate"],
            seconds=opts["seconds"],
            batch=int(opts["batch"]),
        )
        rows = wait_finished(db, events, opts["wait"], since)
        wall = time.monotonic() - clock
        cpu = {
            name: seconds - cpu_before.get(name, 0.0)
            for name, seconds in cpu_seconds(running.root).items()
        }
        ok = report(
            rows, events=events, failures=failures, opts=opts, pgbench=pgbench, cpu=cpu, wall=wall
        )
        finished = sum(1 for r in rows if r["finished"] is not None)
        requests = served(log_dir, window_start, time.time())
        ticks = idle_ticks(running) if os.environ.get("BENCH_E2E_BILL", "1") != "0" else None
        report_bill(requests, finished, ticks)
        db.close()
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
