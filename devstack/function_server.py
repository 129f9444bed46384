"""functions-framework's own server for one entry point, plus the guard that Cloud Run's front end
gives a deployed function and a bare local process lacks.

In the cloud no client talks to gunicorn: Cloud Run terminates the connection and proxies each
request to the container, at most `max_instance_request_concurrency` at once (the function's
concurrency in shared/core/deployables.py). Locally the client's socket *is* gunicorn's, and
gunicorn's threaded worker (THREADS = that concurrency, `function_process.concurrency_env`)
parks an idle connection in its poller but gives a thread to a connection as soon as its first
byte arrives, then waits without limit for the rest of the request head. A handful of clients
that send half a request line and stop hold every thread.

So the local stack starts functions-framework exactly as `functions-framework --target …` does
(`create_app`, then `create_server(...).run`), with two options the CLI can't pass
(functions-framework builds its gunicorn config itself; `GUNICORN_CMD_ARGS` and
`gunicorn.conf.py` are ignored):

- `worker_class`: the threaded worker with a *head deadline*: a request's line and headers must
  arrive within `REQUEST_DEADLINE_SECONDS` (a setting) of the thread taking the connection, or
  the read side is shut down and the connection closed. The body has its own deadline in the
  functions (`shared.core.request_body`), which holds in the cloud too.
- `limit_request_line`: gunicorn's default (4094) instead of functions-framework's unlimited.

Threads and workers are read by functions-framework from the environment (`THREADS`,
`WORKERS`); the stack and `function_process.serve` set THREADS as deployed.

With `ONCEFLOW_REQUEST_LOG_DIR` set, each request served is appended to `<dir>/<target>.log`
as its wall-clock start and end: what `make bench-e2e` turns into the instance time Cloud Run
would bill (devstack/bench/bill.py).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Any

import functions_framework
from functions_framework._http import create_server
from gunicorn.workers.gthread import ThreadWorker

from shared.core.request_body import SocketDeadline
from shared.core.settings import settings

LIMIT_REQUEST_LINE = 4094


REQUEST_LOG_ENV = "ONCEFLOW_REQUEST_LOG_DIR"


class RequestLog:
    """`start end` (wall-clock seconds) per request served, appended under a lock."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._file = path.open("a", buffering=1, encoding="utf-8")

    def write(self, start: float, end: float) -> None:
        with self._lock:
            self._file.write(f"{start:.6f} {end:.6f}\n")


class HeadDeadlineWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's threaded worker; a request head that doesn't arrive in time is cut off."""

    request_log: RequestLog | None = None

    def handle(self, conn: Any) -> Any:
        deadline = SocketDeadline(conn.sock, settings().request_deadline_seconds).start()
        conn.head_deadline = deadline
        try:
            return super().handle(conn)
        finally:
            deadline.cancel()

    def handle_request(self, req: Any, conn: Any) -> Any:
        # The head is in: from here the function's own body deadline applies.
        conn.head_deadline.cancel()
        if self.request_log is None:
            return super().handle_request(req, conn)
        start = time.time()
        try:
            return super().handle_request(req, conn)
        finally:
            self.request_log.write(start, time.time())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--signature-type", default="http")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    if log_dir := os.environ.get(REQUEST_LOG_ENV):
        HeadDeadlineWorker.request_log = RequestLog(Path(log_dir) / f"{args.target}.log")
    app = functions_framework.create_app(args.target, args.source, args.signature_type)
    create_server(
        app,
        False,
        worker_class=HeadDeadlineWorker,
        limit_request_line=LIMIT_REQUEST_LINE,
    ).run(args.host, args.port)


if __name__ == "__main__":
    main()
