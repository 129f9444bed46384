"""`make bench-concurrency`: what one advance_step instance gains from serving several requests
at once, the measurement behind REQUEST_CONCURRENCY (shared/core/deployables.py).

For each concurrency C in CONCURRENCIES: one real functions-framework advance_step process (the
local stack's command, `devstack.function_process.serve_process`) with THREADS=C and
DB_POOL_SIZE=pool_size_for(C), as infra/ deploys it, is fed raw Pub/Sub pushes by C client
threads, each sending its next push when the previous one is answered: what Cloud Run does to
an instance with max_instance_request_concurrency=C once there is a backlog. Each push is the
step of a one-step run, an `http.request` to a local receiver that answers after DELAY_MS (a
CRM or webhook call; 0: one that answers at once, so only CPU and the database are left).

Prints one JSON line per (delay, C) (`devstack.bench.baseline.emit`, no pgbench baseline: the
figures compare concurrencies with each other):
- `value`: steps settled per second by the one process;
- `p50_ms`, `p99_ms`: push → answer;
- `cpu_ms_per_step`: CPU time of the process group (gunicorn arbiter and worker) per step, and
  `cpu_share`: CPU seconds per wall second, the part of one vCPU the instance kept busy (a
  deployed instance has one: infra/functions.tf, cpu = "1");
- `connections`: connections the process opened (pg_stat_activity, by application_name). The
  pool opens one only when none is idle, so this is the most it ever held at once;
- `receiver_in_flight`: the most calls the receiver saw at once (C when the process really
  ran C steps side by side);
- `failed`: pushes not answered 2xx (nacks: there should be none).

Everything runs on this machine: Postgres answers in ~0.1 ms here against ~1 ms from Cloud
Run through the VPC connector, and the machine's cores are shared, so the absolute rates are a
floor; the shape (how throughput and CPU share grow with C at a given call latency) is the
finding.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from devstack import postgres, seed
from devstack.bench.baseline import bench_cluster, emit, percentile
from devstack.bench.steps import seed_running_runs
from devstack.function_process import serve_process
from devstack.stack import PidFile
from shared.core.db import Database, connector_from_env, pool_size_for

CONCURRENCIES = tuple(
    int(c) for c in os.environ.get("BENCH_CONCURRENCIES", "1,2,4,8,16").split(",")
)
DELAYS_MS = tuple(int(d) for d in os.environ.get("BENCH_CONCURRENCY_DELAYS_MS", "0,100").split(","))
SECONDS = float(os.environ.get("BENCH_CONCURRENCY_SECONDS", "4"))
TENANT = "bench"


class Receiver:
    """A local HTTP endpoint that answers 200 after `delay` seconds and counts how many
    requests it held at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.calls += 1
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                try:
                    time.sleep(receiver.delay)
                finally:
                    with receiver._lock:
                        receiver.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def seed_tenant(db: Database) -> None:
    with db.transaction() as tx:
        seed.tenant(tx, TENANT, credits=100_000_000, existing="keep")


def seed_runs(db: Database, runs: int, url: str) -> list[str]:
    """A one-step workflow (an `http.request` to `url`) and `runs` running runs of it; the ids
    of their steps, ready to be pushed."""
    definition = {
        "name": f"concurrency-{uuid.uuid4().hex[:8]}",
        "tenant": TENANT,
        "trigger": {"events": ["bench.x.y"]},
        "steps": [{"id": "s0", "type": "http.request", "config": {"url": url, "body": {}}}],
    }
    return seed_running_runs(db, definition, runs, "http.request")


def push_body(step_id: str, n: int) -> bytes:
    """What a Pub/Sub push subscription POSTs for a step-ready message."""
    data = base64.b64encode(json.dumps({"step_id": step_id}).encode()).decode()
    return json.dumps(
        {
            "message": {
                "data": data,
                "messageId": str(n),
                "publishTime": "2026-01-01T00:00:00Z",
            },
            "subscription": "projects/bench/subscriptions/step-ready-push",
        }
    ).encode()


@dataclass
class Fed:
    answered: int
    failed: int
    seconds: float
    latencies_ms: list[float]


def feed(base: str, step_ids: Sequence[str], clients: int, *, seconds: float | None) -> Fed:
    """Push `step_ids` through `clients` threads, each sending its next push when the last
    is answered, all released together; until the ids run out or `seconds` passed."""
    ids = iter(enumerate(step_ids))
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    statuses: list[int] = []
    latencies: list[float] = []
    deadline = [0.0]

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            barrier.wait()
            while True:
                with lock:
                    nxt = next(ids, None)
                if nxt is None or (seconds is not None and time.monotonic() >= deadline[0]):
                    return
                start = time.monotonic()
                status = http.post(
                    base + "/",
                    content=push_body(nxt[1], nxt[0]),
                    headers={"Content-Type": "application/json"},
                ).status_code
                with lock:
                    statuses.append(status)
                    latencies.append((time.monotonic() - start) * 1000)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    start = time.monotonic()
    deadline[0] = start + (seconds or 0)
    barrier.wait()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    ok = sum(1 for s in statuses if 200 <= s < 300)
    return Fed(ok, len(statuses) - ok, elapsed, latencies)


def named_url(database_url: str, application_name: str) -> str:
    """`database_url` whose connections show as `application_name` in pg_stat_activity."""
    sep = "&" if "?" in database_url else "?"
    return f"{database_url}{sep}application_name={application_name}"


def connections_named(db: Database, application_name: str) -> int:
    with db.transaction() as tx:
        return int(
            tx.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = :a",
                a=application_name,
            )
        )


@contextlib.contextmanager
def advance_step_process(
    database_url: str, concurrency: int, application_name: str
) -> Iterator[tuple[str, PidFile]]:
    """One advance_step process serving `concurrency` requests at once with the pool the
    deployment gives it; its URL and a handle that reads its group's CPU time."""
    env = {
        "DATABASE_URL": named_url(database_url, application_name),
        "THREADS": str(concurrency),
        "DB_POOL_SIZE": str(pool_size_for(concurrency)),
        "NO_GCE_CHECK": "true",
        "ONCEFLOW_HTTP_ALLOW_LOOPBACK": "1",
        "GOOGLE_CLOUD_PROJECT": "onceflow-bench",
        "LOG_LEVEL": "WARNING",
    }
    with serve_process("advance_step", env) as (base, process):
        yield base, PidFile("advance_step", Path(os.devnull), process.pid, "", group=True)


def measure(db: Database, database_url: str, concurrency: int, delay_ms: int) -> dict[str, Any]:
    """One (concurrency, delay) point: the figures the module docstring lists."""
    expected_rate = concurrency * (1000 / max(delay_ms, 5))
    name = f"bench-c{concurrency}-d{delay_ms}"
    with Receiver(delay_ms / 1000) as receiver:
        ids = seed_runs(db, int(expected_rate * SECONDS * 1.5) + 4 * concurrency, receiver.url)
        with advance_step_process(database_url, concurrency, name) as (base, group):
            feed(base, ids[:concurrency], concurrency, seconds=None)  # warm every thread
            cpu_before = group.cpu_seconds()
            fed = feed(base, ids[concurrency:], concurrency, seconds=SECONDS)
            cpu = group.cpu_seconds() - cpu_before
            connections = connections_named(db, name)
    return {
        "concurrency": concurrency,
        "delay_ms": delay_ms,
        "steps_per_s": fed.answered / fed.seconds,
        "p50_ms": round(percentile(fed.latencies_ms, 0.5), 1),
        "p99_ms": round(percentile(fed.latencies_ms, 0.99), 1),
        "cpu_ms_per_step": round(cpu * 1000 / max(fed.answered, 1), 2),
        "cpu_share": round(cpu / fed.seconds, 3),
        "connections": connections,
        "pool_size": pool_size_for(concurrency),
        "receiver_in_flight": receiver.max_in_flight,
        "failed": fed.failed,
    }


def main() -> None:
    with bench_cluster() as cluster:
        url = postgres.create_migrated_database(cluster, "concurrency")
        db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=2)
        try:
            seed_tenant(db)
            for delay_ms in DELAYS_MS:
                for c in CONCURRENCIES:
                    point = measure(db, url, c, delay_ms)
                    rate = point.pop("steps_per_s")
                    emit(f"concurrency_c{c}_delay{delay_ms}ms", rate, "steps/s", None, **point)
        finally:
            db.close()


if __name__ == "__main__":
    main()
