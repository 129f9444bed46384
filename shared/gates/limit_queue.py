"""Priorities and fair shares behind the step limits (issue 29, item 4).

Before this, a step over a limit parked `THROTTLED` until its window ended, and then every
parked step woke at once and raced for the new window: with 1,000 steps of one tenant's import
parked behind a connection of N per second, another tenant's single step won a slot with
chance N/1,001 per window, and each loser's claim counted anyway. Here a step refused by a
limit takes a place in that limit's line instead, and the line is served by a grantor:

    gate (limit_queue_claim, one statement):
        holds a grant for this limit and this window → passes (the slot was counted by the grant)
        nobody waits in the line                     → claims a slot as before (throttle.py)
        the window is full, or others wait            → joins the line (limit_queue_join) and
                                                         parks waiting_for_retry, THROTTLED
    grantor (the sweep's repair `grant_due_limits`, when a line's next window opens):
        under the line's lock and the window row's lock, moves the first `room` = max - used
        steps of the line to pending with a grant for this window, counts them in it, and
        publishes them.

Order of the line: `priority` (the run's, from the workflow's `priority` expression,
evaluated at admission, copied on its steps) first, then the turn, then arrival. A turn is
numbered per share (tenant|workflow) from the turn the line has served up to, so the line is
round-robin between shares: a tenant whose single step joins behind another tenant's 1,000
gets the turn after the one being served, not the 1,001st (start-time fair queueing with
unit costs). All of it is read from one partial index (`workflow_steps_limit_line`,
`(limit_wait, priority DESC, limit_turn, id)`), so a grant reads `room` rows, never the line.

Why at the grant and not in message order: Pub/Sub delivers step-ready messages in any order
and redelivers them, so ordering the messages (or the claims they cause) promises nothing —
the step that reaches the gate first wins the slot. A priority can only act where a scarce
slot is handed out, and only if every contender is in one place when it is: the line is
that place, and the grantor, holding the line's lock, is the only one who hands out a slot
while anyone waits (a new step that finds the line non-empty joins it rather than racing).

A connection's line also answers to the portal's rate budget (shared/port/budget.py), in the
gate's same statement: the window is the connection's as it is now (shrunk after a 429), a
spent daily budget or short window parks the step with the budget's reason outside the line
(until the budget's own end), and every step that goes — a claim that fits or a grant — takes
one call from the budget: a grant counts a window slot, never the portal's day. The grantor
serves a connection's line by the current, shrunk window, and grants nothing while the budget
is spent (the line is due again when it comes back).

Races: two grantors serialize on the line's row lock and on the window row (the no-op upsert
locks it), so the second reads the first's grants counted and never over-grants; each grant
is a guarded `waiting_for_retry → pending` move, so a step cancelled meanwhile is neither
granted nor counted. A grant is good in the window it was counted in only: a step that claims
later (its message was slow) claims afresh, and at worst is refused and joins the line again.
A parked step keeps a safety deadline (`SAFETY_SECONDS` after the window's end): should its
line never be granted (a lost update, a sweep down), the ordinary wake-up brings it back to
its gate, where it keeps its turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.blocks.base import BlockFailure
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Dispatch, SweepConfig, SweepReport
from shared.core.logs import get_logger
from shared.gates import throttle
from shared.gates.kind import Attempt
from shared.port import budget

SQL = queries.load("limit_queue")
CLAIM = SQL["limit_queue_claim"]
JOIN = SQL["limit_queue_join"]
DUE = SQL["limit_queue_due"]
LOCK = SQL["limit_queue_lock"]
WINDOW = SQL["limit_queue_window"]
GRANT = SQL["limit_queue_grant"]
SERVED = SQL["limit_queue_served"]

# How long after its window's end a step in a line wakes by itself, should no grant come.
SAFETY_SECONDS = 900.0
# The range a run's priority is clamped to (the columns' CHECK, migration 0570).
PRIORITY_MIN, PRIORITY_MAX = -10, 10

log = get_logger(__name__)


def clamp_priority(value: int) -> int:
    return max(PRIORITY_MIN, min(PRIORITY_MAX, value))


def limit_key(limit: throttle.Limit) -> str:
    return f"{limit.scope}|{limit.subject}"


def share_of(attempt: Attempt) -> str:
    """Who a line is round-robin between: each workflow of each tenant."""
    return f"{attempt.ctx.tenant_id}|{attempt.workflow.workflow_id}"


def open_in_turn(
    tx: Tx,
    attempt: Attempt,
    *,
    scope: throttle.Scope,
    subject: str,
    declared: tuple[int, int] | None = None,
) -> BlockFailure | None:
    """The limit gate's `open`: None when the attempt may go, else the refusal that parks it in
    the line. `declared` = (max, window seconds); None for a connection's window, read from the
    connection row in the same statement."""
    key = f"{scope}|{subject}"
    row = tx.one(
        CLAIM,
        limit_key=key,
        scope=scope,
        subject=subject,
        step_id=attempt.ctx.step_id,
        connection_id=subject if declared is None else None,
        limit_max=None if declared is None else declared[0],
        window_seconds=None if declared is None else declared[1],
    )
    if row is None:
        return None  # a connection that doesn't exist: nothing to count against
    limit = throttle.Limit(scope, subject, int(row["max"]), int(row["window_seconds"]))
    if row["spent"] is not None:
        # The portal's budget, by the vendor's headers, is spent: nothing was counted, and the
        # step parks until then outside the line (a grant it held is spent with it).
        until: datetime = row["spent_until"]
        spent = throttle.ThrottleClaim(
            False, 0, limit.max, max(float(row["spent_seconds_left"]), 0.05), until
        )
        return throttle.throttled(limit, spent, reason=budget.reason(str(row["spent"]), until))
    if row["granted"]:
        return None
    used = row["used"]
    if used is not None and int(used) <= limit.max:
        return None
    window_end: datetime = row["window_end"]
    tx.one(
        JOIN,
        limit_key=key,
        scope=scope,
        subject=subject,
        limit_max=limit.max,
        window_seconds=limit.window_seconds,
        due_at=window_end,
        share=share_of(attempt),
        step_id=attempt.ctx.step_id,
    )
    # Parked until the safety deadline: the grantor wakes it when its turn comes.
    parked_for = max(float(row["seconds_left"]), 0.0) + SAFETY_SECONDS
    return throttle.throttled(
        limit, throttle.ThrottleClaim(False, int(used or 0), limit.max, parked_for, window_end)
    )


@dataclass(frozen=True)
class Granted:
    step_ids: list[str]
    room: int


def grant(tx: Tx, key: str) -> Granted:
    """Serve the line of limit `key` in this window: its first `room` steps to pending, each
    with a grant counted in the window. In the caller's transaction (commit, then publish)."""
    line = tx.one(LOCK, limit_key=key)
    if line is None:
        return Granted([], 0)
    params = {
        "scope": line["scope"],
        "subject": line["subject"],
        "window_seconds": int(line["window_seconds"]),
        "limit_max": int(line["limit_max"]),
    }
    window = tx.one(WINDOW, **params)
    assert window is not None  # an upsert returns its row
    # While the portal's budget is spent, the line waits for it (the grantor's next turn).
    spent_until = line["spent_until"]
    room = 0 if spent_until is not None else max(int(line["limit_max"]) - int(window["used"]), 0)
    rows = (
        tx.all(
            GRANT,
            limit_key=key,
            room=room,
            window_index=int(window["window_index"]),
            window_start=window["window_start"],
            **params,
        )
        if room
        else []
    )
    turns = [int(r["limit_turn"]) for r in rows if r["limit_turn"] is not None]
    tx.execute(
        SERVED,
        limit_key=key,
        turn=max(turns) if turns else None,
        next_due=spent_until if spent_until is not None else window["window_end"],
    )
    return Granted([r["id"] for r in rows], room)


def grant_due_limits(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """The sweep repair: every line whose next window has opened is served (by its due index);
    the number of steps granted, published after their commit (a lost publish is re-sent by
    the re-dispatch of pending steps)."""
    with db.transaction() as tx:
        keys = [str(r["limit_key"]) for r in tx.all(DUE, batch=config.batch)]
    granted: list[str] = []
    for key in keys:
        with db.transaction() as tx:
            granted += grant(tx, key).step_ids
    report.limit_grants += len(granted)
    if granted:
        try:
            dispatch(granted)
        except Exception as exc:
            report.publish_failures += 1
            log.warning("publish of %d granted steps failed: %s", len(granted), exc)
    return len(granted)
