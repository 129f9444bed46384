"""Cancelling a live run (ops): the run row's lock (`runs_cancel_lock`), then one guarded
statement, `runs_cancel`, in one transaction.

The run ends `cancelled` with who and why; its pending and parked steps become `skipped` in the
same statement. The lock comes first, in a statement of its own, so that the cancel reads the
run's steps after every settle that held the run row (issue 23, item 12: locked and read in one
statement, a step a settle created meanwhile stayed `pending`). A step that is running keeps its
lease and finishes its attempt; its settle sees the run ended and creates no next steps
(shared/steps/settle.py). The journal is kept, so the run can be replayed
(shared/ops/replay.py). A cancel that loses — the run ended first, or another cancel won —
changes nothing and says who won and when.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.logs import get_logger

SQL = queries.load("steps")
CANCEL_LOCK = SQL["runs_cancel_lock"]
CANCEL = SQL["runs_cancel"]
GOAL_MET = SQL["runs_end_goal_met"]

log = get_logger(__name__)


@dataclass(frozen=True)
class Cancellation:
    """The run as the cancel left it, whether or not the cancel moved it."""

    run_id: str
    moved: bool
    status: str
    finished_at: datetime | None
    cancelled_by: str | None
    cancel_reason: str | None
    skipped_steps: tuple[str, ...] = ()
    # Finishing their attempt; their settle creates nothing after them.
    running_steps: tuple[str, ...] = ()
    # `compensating`: a step failed first and the run is undoing its steps (shared/steps/saga.py).
    phase: str = "main"

    @property
    def why_not(self) -> str | None:
        """Why this cancel changed nothing, in words for the person who asked (None: it won)."""
        if self.moved:
            return None
        if self.status == "running" and self.phase == "compensating":
            return (
                "a step failed and the run is running its compensations; it ends failed when "
                "they are done (a cancel would leave the undo half done)"
            )
        at = self.finished_at.isoformat() if self.finished_at else "an unknown time"
        if self.status == "cancelled":
            why = f": {self.cancel_reason}" if self.cancel_reason else ""
            return f"already cancelled by {self.cancelled_by or 'onceflow'} at {at}{why}"
        return f"the run already ended {self.status} at {at}"


def cancel_run(
    db: Database, run_id: str, *, by: str, reason: str, tenant_scope: str | None = None
) -> Cancellation | None:
    """Cancel the live run `run_id` (in `tenant_scope`, None for every tenant). None: no such
    run. Repeating it is harmless: the second call changes nothing and says who cancelled."""
    with db.transaction() as tx:
        outcome = cancel_in(tx, run_id, by=by, reason=reason, tenant_scope=tenant_scope)
    return outcome


def cancel_in(
    tx: Tx, run_id: str, *, by: str, reason: str, tenant_scope: str | None = None
) -> Cancellation | None:
    """The cancel's two statements in the caller's transaction: ops (`cancel_run`) and an
    admitted event that matches the workflow's `cancel_on` (shared/admission/stops.py, `by`
    then reads `event <id>`) stop a run through the very same statements."""
    if tx.one(CANCEL_LOCK, run_id=run_id, tenant_id=tenant_scope) is None:
        return None
    row = tx.one(CANCEL, run_id=run_id, tenant_id=tenant_scope, by=by, reason=reason)
    if row is None:
        return None
    outcome = _cancellation(row)
    if outcome.moved:
        log.info(
            "run %s cancelled by %s (%d step(s) skipped, %d finishing their attempt)",
            run_id,
            by,
            len(outcome.skipped_steps),
            len(outcome.running_steps),
        )
    return outcome


def end_goal_met(tx: Tx, run_id: str) -> Cancellation | None:
    """End the live run `run_id` as `goal_met` (its workflow's goal held on an admitted event
    about its record), in the caller's transaction: the run row's lock first, as the cancel
    takes it (so the statement sees every settle of the run), then `runs_end_goal_met`. None:
    no such live run; `moved` false: it had already ended (the row says how)."""
    if tx.one(CANCEL_LOCK, run_id=run_id, tenant_id=None) is None:
        return None
    row = tx.one(GOAL_MET, run_id=run_id)
    if row is None:
        return None
    outcome = _cancellation(row)
    if outcome.moved:
        log.info(
            "run %s met its goal (%d step(s) skipped, %d finishing their attempt)",
            run_id,
            len(outcome.skipped_steps),
            len(outcome.running_steps),
        )
    return outcome


def _cancellation(row: Mapping[str, Any]) -> Cancellation:
    return Cancellation(
        run_id=str(row["run_id"]),
        moved=bool(row["moved"]),
        status=str(row["status"]),
        finished_at=row["finished_at"],
        cancelled_by=row["cancelled_by"],
        cancel_reason=row["cancel_reason"],
        skipped_steps=tuple(row["skipped_steps"] or ()),
        running_steps=tuple(row["running_steps"] or ()),
        phase=str(row.get("phase") or "main"),
    )
