"""Settling a claimed step: its outcome, the run's status and the next step rows, in ONE
transaction fenced on the lease (invariant 8).

The hot path (no wait to open, no foreach) is one statement run on its own (`steps_settle`
with `fold`): one round trip, no BEGIN/COMMIT. When its snapshot can't decide the run's end
exactly (another step of the run is open: parallel branches) or the step parks in a cancelled
run, that statement writes nothing and the settle runs as a transaction of several statements,
each after the run row's lock (see the statement's comment in shared/sql/steps.sql)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core import queries, tracing
from shared.core.crashpoints import crash_point
from shared.core.db import Database, Tx
from shared.steps import awaits, finale
from shared.steps import saga as undo
from shared.steps.claim import ClaimedStep, StepOfRun
from shared.steps.finale import Finale
from shared.steps.journal import insert_steps, step_key
from shared.steps.loops import Loop, after_item, start_items
from shared.steps.outcomes import Settlement
from shared.steps.parks import open_park, parked
from shared.steps.saga import Saga
from shared.steps.states import StepStatus
from shared.workflows.definition import Step

SQL = queries.load("steps")
SETTLE = SQL["steps_settle"]
FINISH_IF_DONE = SQL["runs_finish_if_done"]
FAIL_RUN = SQL["runs_fail"]
SKIP_PARKED_OF_ENDED_RUN = SQL["steps_skip_parked_of_ended_run"]
# Run ends that stop a run while its steps may still be in flight (a cancel, a goal met).
STOPPED = frozenset({"cancelled", "goal_met"})


@dataclass(frozen=True)
class Settled:
    """What the settle transaction committed. `fenced_out` means the lease was gone: nothing
    was written (a successor or the sweep owns the step)."""

    fenced_out: bool
    to_dispatch: tuple[str, ...] = ()
    run_status: str | None = None
    # This settle moved the run to failed (not: the run had already ended).
    run_failed: bool = False
    # The run succeeded and its circuit breaker's streak was reset in the settle itself.
    breaker_counted: bool = False


def settle_step(
    db: Database,
    step: ClaimedStep,
    settlement: Settlement,
    next_nodes: list[Step],
    *,
    loop: Loop | None = None,
    body: Step | None = None,
    gates: Callable[[Tx], None] | None = None,
    saga: Saga | None = None,
    final: Finale | None = None,
) -> Settled:
    """Write `settlement` for `step` if this attempt still holds its lease.

    `final`: the `finally:` steps the run's version declares (shared/steps/finale.py). With
    them too the settle runs as a transaction under the run row's lock: a run that would end
    enters its finally phase instead, and a settle in that phase creates finally steps only.

    `saga`: the compensations the run's version declares (shared/steps/saga.py). With them the
    settle always runs as a transaction under the run row's lock: the run's phase decides what
    a failure or a compensation's end does, which the one statement does not read.

    `gates`: what settling the attempt's gates writes (shared/steps/gated.py,
    `gate_settlement`), run first in the same transaction, so it shares the settle's commit
    (issue 27). Its writes are idempotent and do not depend on the lease: a settle fenced out
    still commits them, as a separate transaction did before.

    In the same transaction: rows for `next_nodes` when the step succeeded and its run is
    still running (dispatched_at stamped: the caller publishes right after commit), otherwise
    the run's end — failed when the step failed, succeeded when nothing is left to do. A run
    cancelled while the attempt ran gets no next steps, and a wait the step parked in is
    skipped."""
    if (
        settlement.park is None
        and settlement.fan_out is None
        and loop is None
        and saga is None
        and final is None
    ):
        folded = _settle_in_one_statement(db, step, settlement, next_nodes, gates=gates)
        if folded is not None:
            return folded
        gates = None  # committed with the statement that could not decide
    return _settle_in_transaction(
        db,
        step,
        settlement,
        next_nodes,
        loop=loop,
        body=body,
        gates=gates,
        saga=saga,
        final=final,
    )


def _no_gates(tx: Tx) -> None:
    """No gate to settle."""


def _settle_in_transaction(
    db: Database,
    step: ClaimedStep,
    settlement: Settlement,
    next_nodes: list[Step],
    *,
    loop: Loop | None,
    body: Step | None,
    gates: Callable[[Tx], None] | None = None,
    saga: Saga | None = None,
    final: Finale | None = None,
) -> Settled:
    """The settle statement by statement, in one transaction under the run row's lock: for a
    wait (its park row first), a foreach, and whatever the one statement could not decide."""
    park = settlement.park
    opened = None
    wake_at = settlement.wake_at
    if park is not None:
        # The conditions and the deadline are committed before the step parks: from here on,
        # every admitted event is offered to this wait (and the lookback below covers what
        # came before). A crash between the two leaves the step running: the sweep reclaims
        # it, and the next attempt gets this same row back.
        opened = open_park(
            db, step_id=step.id, run_id=step.run_id, tenant_id=step.tenant_id, park=park
        )
        wake_at = opened.deadline
    with db.transaction() as tx:
        tracing.stamp(tx)  # the next steps' rows continue this step's trace
        (gates or _no_gates)(tx)
        row = tx.one(
            SETTLE,
            **_settle_params(step, settlement, [], fold=False, wake_at=wake_at),
            park_id=None if opened is None else opened.id,
            park_kind=None if opened is None else opened.kind,
        )
        if row is None or row["run_status"] is None:
            return Settled(fenced_out=True)
        run_status = str(row["run_status"])
        dispatch: list[str] = []
        run_failed = False
        failed = settlement.status is StepStatus.FAILED
        error = run_error(step.step_key, settlement.outcome_code, settlement.error)
        ending, undone = (
            (None, None)
            if failed
            else _phases(tx, step, settlement.status, next_nodes, error, saga=saga, final=final)
        )
        if failed:
            failed_ids, run_failed = fail_in_phase(tx, step, error, saga=saga, final=final)
            dispatch += failed_ids
            run_status = "failed" if run_failed else run_status
        elif ending is not None:
            # The last finally step's settle ends the run (failed when an earlier one failed).
            dispatch += ending.to_dispatch
            run_status = ending.run_status or run_status
            run_failed = ending.run_status == "failed"
        elif undone is not None:
            # The last compensation's settle ends the run failed.
            dispatch += undone.to_dispatch
            if undone.run_failed:
                run_status, run_failed = "failed", True
        elif settlement.status is StepStatus.SUCCEEDED and run_status == "running":
            dispatch, finished = _go_on(
                tx, step, settlement, next_nodes, loop=loop, body=body, final=final
            )
            if finished:
                run_status = "succeeded"
        elif settlement.status.parked and run_status in STOPPED:
            # Cancelled while this attempt ran: the attempt is recorded (lease history), but
            # nothing would ever wake the wait it asked for.
            tx.execute(SKIP_PARKED_OF_ENDED_RUN, step_id=step.id)
        elif park is not None and opened is not None:
            # Parked: an event noted on the park before now, or found by the lookback,
            # resumes the wait at once (shared/steps/parks.py).
            # A wait of several events or correlated beyond its record: shared/steps/awaits.py.
            settle_park = parked if park.mode is None else awaits.parked
            resumed = settle_park(tx, opened, park, tenant_id=step.tenant_id)
            if resumed is not None:
                dispatch.append(resumed)
        crash_point("before_settle_commit")
    return Settled(
        fenced_out=False, to_dispatch=tuple(dispatch), run_status=run_status, run_failed=run_failed
    )


def _phases(
    tx: Tx,
    step: StepOfRun,
    status: StepStatus,
    next_nodes: Sequence[Step],
    error: str,
    *,
    saga: Saga | None,
    final: Finale | None,
) -> tuple[finale.Ending | None, undo.Undoing | None]:
    """What the run's phase does with `step` ending `status`, under the run row's lock the
    caller holds; (None, None) when the phase leaves it to the settle as in any run.

    The phase is read once, and only when the run's version declares compensations or
    finally steps. In the finally phase its finally steps decide (shared/steps/finale.py):
    None only for a finally step that parked, which parks as in any run. Otherwise its
    compensations decide first when it declares any (shared/steps/saga.py)."""
    phase = undo.MAIN if saga is None and final is None else undo.run_phase(tx, step.run_id)
    if final is not None and phase == finale.FINALLY:
        return finale.settled(tx, step, status, next_nodes, error), None
    if saga is None:
        return None, None
    return None, undo.settled(tx, step, status, saga, error, phase=phase, final=final)


def fail_in_phase(
    tx: Tx, step: StepOfRun, error: str, *, saga: Saga | None, final: Finale | None
) -> tuple[tuple[str, ...], bool]:
    """`step` failed — at its settle, or by the sweep's reclaim of its expired lease
    (shared/steps/repairs.py) — under the run row's lock the caller holds: what its run's
    phase makes of it. The compensations begin, or the next one is created; or the finally
    phase begins or ends; or the run fails (`error`, shared by all: `run_error`). The rows to
    dispatch after commit, and whether this failed the run."""
    ending, undone = _phases(tx, step, StepStatus.FAILED, (), error, saga=saga, final=final)
    if ending is not None:
        return ending.to_dispatch, ending.run_status == "failed"
    if undone is not None:
        return undone.to_dispatch, undone.run_failed
    dispatch, failed = _fail(tx, step, error, final)
    return tuple(dispatch), failed


def _fail(tx: Tx, step: StepOfRun, error: str, final: Finale | None) -> tuple[list[str], bool]:
    """A step of the run failed with nothing to undo: the run fails — or, with `final`,
    enters its finally phase (the first finally step to dispatch; it ends failed after them).
    Whether this settle failed the run (not: another end was decided first)."""
    if final is not None:
        begun = finale.begin(
            tx, step, final, final_status="failed", from_phase=undo.MAIN, error=error
        )
        if begun is not None:
            return list(begun), False
    return [], bool(tx.execute(FAIL_RUN, run_id=step.run_id, error=error))


def _go_on(
    tx: Tx,
    step: ClaimedStep,
    settlement: Settlement,
    next_nodes: list[Step],
    *,
    loop: Loop | None,
    body: Step | None,
    final: Finale | None = None,
) -> tuple[list[str], bool]:
    """A step of a running run succeeded: its next rows (to dispatch), and whether the run
    succeeded because nothing is left to do — or, with `final`, entered its finally phase
    instead (the first finally step to dispatch; the run is still running)."""
    dispatch: list[str] = []
    if next_nodes:
        dispatch = insert_steps(
            tx,
            run_id=step.run_id,
            lineage_root=step.lineage_root,
            nodes=next_nodes,
            stamp_dispatched=True,
        )
    # A foreach starts its first iterations; an iteration starts the next ones, or
    # after the last, what follows the loop (shared/steps/loops.py).
    if settlement.fan_out is not None and body is not None:
        dispatch += start_items(
            tx,
            run_id=step.run_id,
            lineage_root=step.lineage_root,
            fan_out=settlement.fan_out,
            body=body,
        )
    elif loop is not None:
        dispatch += after_item(tx, run_id=step.run_id, lineage_root=step.lineage_root, loop=loop)
    if dispatch:
        return dispatch, False
    if final is not None:
        begun = finale.begin(
            tx, step, final, final_status="succeeded", from_phase=undo.MAIN, when_done=True
        )
        return list(begun or ()), False
    return dispatch, bool(tx.execute(FINISH_IF_DONE, run_id=step.run_id))


def _settle_in_one_statement(
    db: Database,
    step: ClaimedStep,
    settlement: Settlement,
    next_nodes: list[Step],
    *,
    gates: Callable[[Tx], None] | None = None,
) -> Settled | None:
    """The settle, next rows and run end as one statement committed in its own round trip;
    None when the statement could not decide exactly and wrote nothing (the caller settles
    in a transaction)."""
    crash_point("before_settle_commit")  # nothing is written before the statement commits
    with db.transaction() as tx:
        tracing.stamp(tx)  # the next steps' rows continue this step's trace
        if gates is not None:
            gates(tx)  # the gates' settle, committed with the step's (most writes queued)
        rows = tx.commit_with(
            SETTLE,
            **_settle_params(step, settlement, next_nodes, fold=True, wake_at=settlement.wake_at),
            park_id=None,
            park_kind=None,
        )
    if not rows:
        return Settled(fenced_out=True)
    row = rows[0]
    if not row["folded"]:
        return None
    if row["run_status"] is None:
        return Settled(fenced_out=True)
    run_status = str(row["run_status"])
    if row["run_failed"]:
        run_status = "failed"
    elif row["run_finished"]:
        run_status = "succeeded"
    return Settled(
        fenced_out=False,
        to_dispatch=tuple(row["dispatch"] or ()),
        run_status=run_status,
        run_failed=bool(row["run_failed"]),
        breaker_counted=bool(row["run_finished"]),
    )


# A step's input is for people reading the run; past this size the page shows that it was
# large instead of the bytes (the output and the journal are what replays read, not this).
MAX_STORED_INPUT_BYTES = 16 * 1024


def _stored_input(rendered: Mapping[str, Any] | None) -> str | None:
    if rendered is None:
        return None
    text = json.dumps(rendered, default=str)
    if len(text.encode("utf-8")) > MAX_STORED_INPUT_BYTES:
        return json.dumps({"_truncated": True, "bytes": len(text.encode("utf-8"))})
    return text


def _settle_params(
    step: ClaimedStep,
    settlement: Settlement,
    next_nodes: list[Step],
    *,
    fold: bool,
    wake_at: datetime | None,
) -> dict[str, object]:
    return {
        "step_id": step.id,
        "run_id": step.run_id,
        "lease_id": step.lease_id,
        "status": str(settlement.status),
        "attempt": settlement.attempt,
        "output": None if settlement.output is None else json.dumps(settlement.output),
        "input": _stored_input(settlement.input),
        "error": settlement.error,
        "error_class": settlement.error_class,
        "outcome_code": settlement.outcome_code,
        "branch_choice": settlement.branch_choice,
        "wake_at": wake_at,
        "fold": fold,
        "step_keys": [step_key(n.id) for n in next_nodes],
        "node_ids": [n.id for n in next_nodes],
        "block_types": [n.type for n in next_nodes],
        "lineage_root": step.lineage_root,
        "run_error": (
            run_error(step.step_key, settlement.outcome_code, settlement.error) if fold else None
        ),
    }


def run_error(step_key: str, outcome_code: str | None, error: str | None) -> str:
    """A run's error when its step `step_key` failed, whoever failed it."""
    return f"step {step_key} failed ({outcome_code}): {error or ''}"[:4000]
