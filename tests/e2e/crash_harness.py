"""Kill real `advance_step` processes at the engine's crash points, behind the real Pub/Sub
emulator, and drive every run to its end with restarts and the sweep.

    harness = CrashHarness(database_url, emulator_host, db=db)     # a fresh emulator project
    with harness:                                                  # topic + push subscription
        harness.publish_steps(first_step_ids)
        stats = harness.drive(all_runs_ended, crash_point="after_side_effect", kills=3)

What it does, and why it is shaped like this:

- one functions-framework process (`--source main.py --target advance_step`, gunicorn, like
  Cloud Run) on a fixed port, fed by an emulator *push* subscription on `step-ready`;
- the process is armed with `ONCEFLOW_ENABLE_CRASH_POINTS=1 ONCEFLOW_CRASH_POINTS=<point>`;
  the engine's `os._exit(137)` kills the worker with no cleanup. gunicorn would respawn an
  armed worker on its own, so the harness watches the log for the crash line, kills the whole
  process group at once and starts a fresh process — armed again until `kills` deaths were
  seen, then unarmed (an instance restarted after a crash);
- the sweep runs here, in the test process, every `sweep_every` seconds with short thresholds:
  it reclaims the dead worker's leases and re-dispatches committed-but-unpublished steps;
- `Receiver` is an HTTP server that records every request with its `Idempotency-Key`, so a
  test can count side effects per key (what an idempotent receiver would apply).

Reusable for other blocks: pass `source`/`extra_env` (e.g. a fake CRM's URL and token) and
count at your own server. Short leases (`lease_seconds`) keep recovery to seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from devstack.function_process import command
from devstack.tools import free_port
from shared.core import pubsub as pubsub_mod
from shared.core.crashpoints import EXIT_CODE
from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.sweep.loop import run_sweep

ROOT = Path(__file__).resolve().parents[2]
CRASH_LINE = "onceflow crash point"


@dataclass(frozen=True)
class Received:
    path: str
    idempotency_key: str | None
    body: bytes


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that answers 200 and records every request."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests.append(
                        Received(self.path, self.headers.get("Idempotency-Key"), body)
                    )
                payload = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def keys(self) -> list[str | None]:
        with self._lock:
            return [r.idempotency_key for r in self.requests]

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class DriveStats:
    kills: int = 0
    restarts: int = 0
    sweeps: int = 0
    reclaimed: int = 0
    redispatched: int = 0
    seconds: float = 0.0
    exit_codes: list[int | None] = field(default_factory=list)


class CrashHarness:
    def __init__(
        self,
        database_url: str,
        emulator_host: str,
        *,
        db: Database,
        source: Path = ROOT / "main.py",
        target: str = "advance_step",
        extra_env: Mapping[str, str] | None = None,
        lease_seconds: float = 4.0,
        heartbeat_seconds: float = 1.0,
        redispatch_after_seconds: float = 2.0,
        log_dir: Path | None = None,
    ) -> None:
        self.db = db
        self.project = f"crash-{uuid.uuid4().hex[:10]}"
        self.emulator_host = emulator_host
        self.port = free_port()
        self.source = source
        self.target = target
        self.log_path = (log_dir or Path("/tmp")) / f"onceflow-{self.project}.log"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "NO_GCE_CHECK": "true",
            "DATABASE_URL": database_url,
            "PUBSUB_EMULATOR_HOST": emulator_host,
            "GOOGLE_CLOUD_PROJECT": self.project,
            "ONCEFLOW_STEP_LEASE_SECONDS": str(lease_seconds),
            "ONCEFLOW_STEP_HEARTBEAT_SECONDS": str(heartbeat_seconds),
            "THREADS": "4",
            "DB_POOL_SIZE": "6",
            **(extra_env or {}),
        }
        for key in ("ONCEFLOW_ENABLE_CRASH_POINTS", "ONCEFLOW_CRASH_POINTS"):
            self.env.pop(key, None)
        self.sweep_config = SweepConfig(
            batch=100,
            redispatch_after_seconds=redispatch_after_seconds,
            poll_seconds=0.0,
        )
        self.publisher = pubsub_mod.Publisher(self.project)
        self._process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- Pub/Sub ------------------------------------------------------------------------------
    def _clients(self) -> tuple[Any, Any]:
        from google.cloud import pubsub_v1

        return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()

    def _create_topology(self) -> None:
        from google.protobuf import duration_pb2

        publisher, subscriber = self._clients()
        topic = f"projects/{self.project}/topics/{pubsub_mod.STEP_READY}"
        publisher.create_topic(name=topic)
        subscriber.create_subscription(
            request={
                "name": f"projects/{self.project}/subscriptions/step-ready-push",
                "topic": topic,
                "push_config": {"push_endpoint": f"http://127.0.0.1:{self.port}/"},
                "ack_deadline_seconds": 30,
                "retry_policy": {
                    "minimum_backoff": duration_pb2.Duration(seconds=1),
                    "maximum_backoff": duration_pb2.Duration(seconds=2),
                },
            }
        )

    def publish_steps(self, step_ids: Iterable[str]) -> None:
        ids = list(step_ids)
        if ids:
            self.publisher.publish_many(pubsub_mod.STEP_READY, [{"step_id": s} for s in ids])

    # -- the function process -----------------------------------------------------------------
    def start(self, crash_points: str | None = None) -> None:
        env = dict(self.env)
        if crash_points:
            env["ONCEFLOW_ENABLE_CRASH_POINTS"] = "1"
            env["ONCEFLOW_CRASH_POINTS"] = crash_points
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._process = subprocess.Popen(
                command(self.target, self.port, source=self.source, signature="cloudevent"),
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_listening()

    def _wait_listening(self, timeout: float = 30.0) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"advance_step exited at start:\n{self.log_tail()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"advance_step did not listen in {timeout}s:\n{self.log_tail()}")

    def stop(self) -> int | None:
        """Kill the whole process group at once (SIGKILL: nothing graceful about a crash)."""
        proc, self._process = self._process, None
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=30)

    def crashed(self) -> bool:
        """True once the current process logged a crash-point exit (or died on its own)."""
        if self._process is None:
            return False
        if self._process.poll() is not None:
            return True
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            return CRASH_LINE.encode() in log.read()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    # -- driving ------------------------------------------------------------------------------
    def sweep(self, stats: DriveStats) -> None:
        report = run_sweep(
            self.db,
            0,
            config=self.sweep_config,
            dispatch=self.publish_steps,
            duties=[],
        )
        stats.sweeps += 1
        stats.reclaimed += report.reclaimed
        stats.redispatched += report.redispatched

    def drive(
        self,
        done: Callable[[], bool],
        *,
        crash_point: str | None,
        kills: int = 1,
        timeout: float = 90.0,
        sweep_every: float = 0.5,
    ) -> DriveStats:
        """Run until `done()`: restart after each crash (re-armed until `kills` crashes were
        seen), sweeping on the way. Raises TimeoutError with the process log when stuck."""
        stats = DriveStats()
        started = time.monotonic()
        # A fresh process armed for this point (a previous drive may have left one unarmed).
        self.stop()
        self.start(crash_point if kills > 0 else None)
        last_sweep = 0.0
        while not done():
            now = time.monotonic()
            if now - started > timeout:
                raise TimeoutError(
                    f"runs not done after {timeout}s ({json.dumps(stats.__dict__)}):\n"
                    f"{self.log_tail()}"
                )
            if self.crashed():
                stats.exit_codes.append(self.stop())
                stats.kills += 1
                stats.restarts += 1
                self.start(crash_point if stats.kills < kills else None)
            if now - last_sweep >= sweep_every:
                self.sweep(stats)
                last_sweep = now
            time.sleep(0.05)
        stats.seconds = time.monotonic() - started
        return stats

    def __enter__(self) -> CrashHarness:
        self._create_topology()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EXIT_CODE", "CrashHarness", "DriveStats", "Receiver"]
