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
  arrive within `HEAD_DEADLINE_SECONDS` of the thread taking the connection, or the read side is
  shut down and the connection closed. The body has its own deadline in the functions
  (`shared.core.request_body`), which holds in the cloud too.
- `limit_request_line`: gunicorn's default (4094) instead of functions-framework's unlimited.

Threads and workers are read by functions-framework from the environment (`THREADS`,
`WORKERS`); the stack and `function_process.serve` set THREADS as deployed.
"""

from __future__ import annotations

import argparse
from typing import Any

import functions_framework
from functions_framework._http import create_server
from gunicorn.workers.gthread import ThreadWorker

from shared.core.request_body import SocketDeadline

HEAD_DEADLINE_SECONDS = 10.0
LIMIT_REQUEST_LINE = 4094


class HeadDeadlineWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's threaded worker; a request head that doesn't arrive in time is cut off."""

    def handle(self, conn: Any) -> Any:
        deadline = SocketDeadline(conn.sock, HEAD_DEADLINE_SECONDS).start()
        conn.head_deadline = deadline
        try:
            return super().handle(conn)
        finally:
            deadline.cancel()

    def handle_request(self, req: Any, conn: Any) -> Any:
        # The head is in: from here the function's own body deadline applies.
        conn.head_deadline.cancel()
        return super().handle_request(req, conn)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--signature-type", default="http")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    app = functions_framework.create_app(args.target, args.source, args.signature_type)
    create_server(
        app,
        False,
        worker_class=HeadDeadlineWorker,
        limit_request_line=LIMIT_REQUEST_LINE,
    ).run(args.host, args.port)


if __name__ == "__main__":
    main()
