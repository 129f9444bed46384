"""The fast path: after a webhook commits, drain and publish now instead of at the next tick.

Choice: an in-process background thread, not a message. It starts only after the inbox row
committed and the answer is ready, never raises, and runs one bounded pass
(`inbox.drain_and_publish`: drain until the inbox is empty, then publish until the outbox is
empty — a generic webhook trigger's event too, which skips the inbox — each within
`NUDGE_BUDGET_SECONDS`, default 5). One nudge thread runs per process at a time; webhooks
arriving meanwhile ask it for one more pass instead of starting threads of their own.

Why not a Pub/Sub nudge: it would need another topic, subscription and push endpoint for a
hint whose loss changes nothing — the scheduled drain and publisher are the guarantee. On
Cloud Run with request-based billing the CPU may be throttled once the response is sent, so
the thread can stall until the next request; with "CPU always allocated" it runs at once.
`WEBHOOK_NUDGE=off` disables it (tests, benchmarks of the bare receive path).
"""

from __future__ import annotations

import threading

from shared.core.logs import get_logger
from shared.core.settings import settings

log = get_logger(__name__)
_lock = threading.Lock()
_running = False
_again = False
_idle = threading.Event()
_idle.set()


def enabled() -> bool:
    return settings().webhook_nudge


def nudge() -> bool:
    """Ask for a drain+publish pass; True if a new thread was started."""
    global _running, _again  # noqa: PLW0603 - one nudge thread per process
    if not enabled():
        return False
    with _lock:
        if _running:
            _again = True
            return False
        _running = True
        _idle.clear()
    threading.Thread(target=_run, name="webhook-nudge", daemon=True).start()
    return True


def wait_idle(timeout: float) -> bool:
    """Wait until no nudge pass is running (tests and orderly shutdown)."""
    return _idle.wait(timeout)


def _run() -> None:
    global _running, _again  # noqa: PLW0603
    while True:
        try:
            _one_pass()
        except Exception:
            # Best effort: the schedule will do this work; the nudge only makes it sooner.
            log.warning("webhook nudge pass failed", exc_info=True)
        with _lock:
            if not _again:
                _running = False
                _idle.set()
                return
            _again = False


def _one_pass() -> None:
    from shared.core.db import get_database
    from shared.ingest import inbox

    inbox.drain_and_publish(get_database(), budget_seconds=settings().nudge_budget_seconds)
