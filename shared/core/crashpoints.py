"""Named points in the step path (and a poll pass) where a test can kill the process on the spot.

Armed only when BOTH `ONCEFLOW_ENABLE_CRASH_POINTS=1` and `ONCEFLOW_CRASH_POINTS` are set in
the environment (never by `infra/`): `ONCEFLOW_CRASH_POINTS=after_claim,before_settle_commit`
kills at the first hit of either; `name:N` kills at the N-th hit in this process. The kill is
`os._exit(137)`: no `finally`, no rollback, no flush — what a SIGKILL or an instance reclaimed
mid-request leaves behind, which is what the recovery paths must survive.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping

from shared.core.settings import settings_from

CRASH_POINTS = (
    "after_claim",  # the step is running under a lease; nothing executed yet
    "after_side_effect_mark",  # side_effect_started_at committed; the call hasn't left
    "after_side_effect",  # the block returned; its outcome is only in memory
    "before_settle_commit",  # the settle transaction is written but not committed
    "after_commit_before_publish",  # settled and next rows committed; step-ready not sent
)
# Outside the step path (the step-path tests kill at every one of CRASH_POINTS).
POLL_CRASH_POINTS = (
    "poll_mid_page",  # a poll page's events are being emitted; its transaction isn't committed
)
# Between a drain's commit of trigger events and its publish of them (the nudge, the tick).
DRAIN_CRASH_POINTS = ("drain_after_commit_before_publish",)
# A journal reader's entry is in the inbox; the offset after it isn't moved yet (one transaction,
# not committed: shared/ingest/journal.py).
JOURNAL_CRASH_POINTS = ("journal_after_store_before_offset",)
# Between admission's commit of an event joining a debounce burst and the burst's fire.
# ... and between its commit of an event queued behind a full run-start throttle and the start.
# ... and, inside the admission transaction, between an event filling a batch and the batch's
# run starting (nothing committed: the event's redelivery fills it again).
DEBOUNCE_CRASH_POINTS = (
    "admission_after_debounce_join",
    "admission_after_run_queued",
    "admission_batch_filled",
)
KNOWN_POINTS = (
    CRASH_POINTS
    + POLL_CRASH_POINTS
    + DRAIN_CRASH_POINTS
    + JOURNAL_CRASH_POINTS
    + DEBOUNCE_CRASH_POINTS
)
EXIT_CODE = 137

_hits: dict[str, int] = {}
_lock = threading.Lock()


def armed_points(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """{point: the hit number that kills}; empty unless explicitly enabled."""
    s = settings_from(env)
    if not s.enable_crash_points:
        return {}
    armed: dict[str, int] = {}
    for raw in s.crash_points.split(","):
        item = raw.strip()
        if not item:
            continue
        name, _, nth = item.partition(":")
        if name not in KNOWN_POINTS:
            raise ValueError(f"unknown crash point {name!r}; known: {', '.join(KNOWN_POINTS)}")
        armed[name] = int(nth) if nth else 1
    return armed


def crash_point(name: str) -> None:
    """Kill the process here if this point is armed (and this is the armed hit)."""
    if name not in KNOWN_POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    armed = armed_points()
    if name not in armed:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        fire = _hits[name] == armed[name]
    if fire:
        sys.stderr.write(f"onceflow crash point {name}: exiting with {EXIT_CODE}\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
