"""Local servers (the fake vendors, the demo's receivers, a scenario's ops app) served from a
daemon thread: one home for how, so every one of them stops at once.

`serve_forever` looks for a shutdown request once per `poll_interval`; its default, 0.5 s, is
what `shutdown()` then waits, and the suite stops hundreds of these (one or more per test that
talks to a fake vendor): 50 ms makes a stop cost almost nothing, at the price of an idle thread
waking 20 times a second while it serves.
"""

from __future__ import annotations

import socketserver
import threading

POLL_SECONDS = 0.05


def serve_in_thread(server: socketserver.BaseServer, name: str | None = None) -> threading.Thread:
    """Serve `server` from a daemon thread until its `shutdown()`; the thread, started."""
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": POLL_SECONDS},
        name=name,
        daemon=True,
    )
    thread.start()
    return thread
