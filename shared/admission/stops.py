"""`cancel_on` and `goal`: an admitted event stops the running runs about its record whose
workflow says so (issue 31, item 3).

Admission's first statement reads, on the event's first decision, the running live runs about
its record whose version declares `cancel_on` or a `goal` (`stoppable_runs`, through the index
on running runs per record). For each, in the admission's transaction:

- `cancel_on`: the first entry whose `event` is this event's type and whose `when` holds on it
  (as a trigger rule reads it) cancels the run through the ops cancel's own statements
  (shared/steps/cancel.py `cancel_in`: the run row's lock, then `runs_cancel`), with
  `cancelled_by: event <id>` and the entry as the reason. onceflow's own echo cancels nothing:
  it is no trigger and no answer to a wait either.
- `goal`: when it holds on the event (its `record` as the event describes it), the run ends
  `goal_met` (`end_goal_met`: the same lock, then `runs_end_goal_met`). The goal is about the
  record's state, whoever changed it, so an echo of onceflow's own write counts.

Both are guarded statements on the run row: the first to commit wins (a cancel, a goal, the
run's last settle), the others change nothing. A step in flight keeps its lease and finishes;
its settle sees the run ended and creates nothing after it. A condition that can't be
evaluated on the event does not hold (logged), as for a wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.core.db import Tx
from shared.core.logs import get_logger
from shared.steps.cancel import cancel_in, end_goal_met
from shared.workflows.expressions import ExpressionError, PreparedScope, evaluate_condition
from shared.workflows.scope import Occurrence

log = get_logger(__name__)


@dataclass(frozen=True)
class Stopped:
    run_id: str
    status: str  # cancelled | goal_met (running: stopped into its finally phase)
    moved: bool
    # The first finally step the stop created (shared/steps/finale.py): published after commit.
    to_dispatch: tuple[str, ...] = ()


def _holds(condition: str, scope: PreparedScope, run_id: str, what: str) -> bool:
    try:
        return evaluate_condition(condition, scope)
    except ExpressionError as exc:
        log.warning("run %s: %s can't be evaluated on this event: %s", run_id, what, exc)
        return False


def cancelling_entry(
    cancel_on: Any, incoming: Occurrence, scope: PreparedScope, run_id: str
) -> Mapping[str, Any] | None:
    """The first `cancel_on` entry this event matches, or None."""
    for entry in cancel_on if isinstance(cancel_on, list) else []:
        if not isinstance(entry, Mapping) or entry.get("event") != incoming.type:
            continue
        when = str(entry.get("when") or "true")
        if _holds(when, scope, run_id, f"cancel_on {entry.get('event')}"):
            return entry
    return None


def stop_runs(
    tx: Tx,
    incoming: Occurrence,
    scope: PreparedScope,
    runs: Sequence[Mapping[str, Any]],
    *,
    echo: bool,
) -> list[Stopped]:
    """Cancel or end as `goal_met` each run the event stops, in the caller's transaction."""
    stopped: list[Stopped] = []
    for run in runs:
        run_id = str(run["run_id"])
        entry = None if echo else cancelling_entry(run.get("cancel_on"), incoming, scope, run_id)
        if entry is not None:
            when = str(entry.get("when") or "true")
            reason = f"cancel_on {entry['event']}" + ("" if when == "true" else f" when {when}")
            done = cancel_in(tx, run_id, by=f"event {incoming.id}", reason=reason)
        elif isinstance(run.get("goal"), str) and _holds(run["goal"], scope, run_id, "goal"):
            done = end_goal_met(tx, run_id)
        else:
            continue
        if done is not None:
            stopped.append(Stopped(run_id, done.status, done.moved, done.to_dispatch))
    return stopped
