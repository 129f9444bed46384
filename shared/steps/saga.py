"""Undo: a step's `compensate:` block, run when its run fails after the step succeeded.

A compensation is a step of the run (journal key `compensate:<step key>`, its own idempotency
key, shared/steps/journal.py), claimed, executed, retried and settled by the same engine, one
per invocation. The run's phase says which part of it is running:

- `main`: the workflow's own steps. A step that fails (settled by the engine) while a step
  declaring `compensate:` has succeeded moves the run to `compensating` instead of `failed`
  (`runs_begin_compensating`, under the run row's lock: one failure wins), skips its other
  open steps, and creates the first compensation row in the same transaction.
- `compensating`: the compensations, one at a time, in reverse order of the steps' success
  (`steps_next_compensation`); each one's settle, whatever its outcome (succeeded, or failed
  after its block's own retry policy), creates the next, and the last ends the run `failed`
  (`runs_end_compensated`) with the original error. A failed compensation is recorded on its
  row and does not stop the others: each undo is independent, and leaving the rest undone
  because one could not would be the worse outcome.

A cancel does not compensate: it is a person's (or a `cancel_on` event's) decision to stop
the run where it stands, and its journal shows what succeeded; a cancel during the
compensating phase stops the compensations too (skipped CANCELLED, visible on the run). A step
that fails outside a settle (the sweep's reclaim of an expired lease: OUTCOME_UNKNOWN, or no
attempts left) goes through the same functions, in the reclaim's transaction
(shared/steps/repairs.py, settle.fail_in_phase).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.core import queries
from shared.core.db import Tx
from shared.steps import finale
from shared.steps.claim import StepOfRun
from shared.steps.finale import Finale
from shared.steps.journal import insert_steps
from shared.steps.states import StepStatus
from shared.workflows.definition import Step, WorkflowDefinition
from shared.workflows.step_keys import compensated_key, compensation_key

SQL = queries.load("steps")
RUN_PHASE = SQL["runs_phase"]
BEGIN = SQL["runs_begin_compensating"]
SKIP_OPEN = SQL["steps_skip_open_of_compensating_run"]
NEXT = SQL["steps_next_compensation"]
END = SQL["runs_end_compensated"]

MAIN = "main"
COMPENSATING = "compensating"


@dataclass(frozen=True)
class Saga:
    """The compensations a workflow version declares, by the node they undo."""

    undo: Mapping[str, Step]

    @classmethod
    def of(cls, graph: WorkflowDefinition) -> Saga | None:
        undo = {s.id: c for s in graph.steps if (c := s.compensation()) is not None}
        return cls(undo) if undo else None


def run_phase(tx: Tx, run_id: str) -> str:
    return str(tx.scalar(RUN_PHASE, run_id=run_id) or MAIN)


@dataclass(frozen=True)
class Undoing:
    """What a settle in the saga's hands did: the compensation to dispatch, or the run's end."""

    to_dispatch: tuple[str, ...] = ()
    # This settle ended the run `failed` (no compensation left).
    run_failed: bool = False


def settled(
    tx: Tx,
    step: StepOfRun,
    status: StepStatus,
    saga: Saga,
    error: str,
    *,
    phase: str,
    final: Finale | None = None,
) -> Undoing | None:
    """What the saga does with `step`'s settle (status `status`), in its transaction after
    `steps_settle` locked the run row; None: nothing, the settle goes on as in any run.

    - compensating: a compensation that ended (succeeded or failed) creates the next one or
      ends the run (or, with `final`, begins its finally steps, shared/steps/finale.py); a
      main step in flight when the phase began creates nothing (as in a failed run) and a
      wait it settled into is skipped at once (nothing would serve it);
    - main: a failure with something to undo begins the compensating phase.

    `phase`: the run's, read by the caller under the same lock (`run_phase`)."""
    if phase == COMPENSATING:
        if compensated_key(step.step_key) is not None:
            return following(tx, step, saga, final) if status.terminal else Undoing()
        if status.parked:
            skip_open(tx, step.run_id)
        return Undoing()
    if status is StepStatus.FAILED:
        return begin(tx, step, saga, error)
    return None


def begin(tx: Tx, step: StepOfRun, saga: Saga, error: str) -> Undoing | None:
    """After `step` failed, in its settle's transaction (under the run row's lock): when a
    compensable step succeeded, the run enters its compensating phase and its first
    compensation is created. None when there is nothing to undo, or the run is not running in
    its main phase (a cancel, another branch's failure won): the caller fails the run as it
    always did, and that statement's guard decides."""
    row = tx.one(NEXT, run_id=step.run_id, node_ids=sorted(saga.undo))
    if row is None or tx.one(BEGIN, run_id=step.run_id, error=error) is None:
        return None
    skip_open(tx, step.run_id)
    return _create(tx, step, saga, row)


def skip_open(tx: Tx, run_id: str) -> None:
    """The run's main-phase steps still pending or parked end skipped RUN_ENDED (a main step
    that settled into a wait after the phase began included)."""
    tx.execute(SKIP_OPEN, run_id=run_id)


def following(tx: Tx, step: StepOfRun, saga: Saga, final: Finale | None = None) -> Undoing:
    """After a compensation settled (terminal): the next one's row (created pending, stamped
    dispatched: the caller publishes it after commit); none left: the run ends failed, or
    with `final` enters its finally phase (it ends failed after its finally steps)."""
    row = tx.one(NEXT, run_id=step.run_id, node_ids=sorted(saga.undo))
    if row is None:
        if final is not None:
            begun = finale.begin(tx, step, final, final_status="failed", from_phase=COMPENSATING)
            if begun is not None:
                return Undoing(to_dispatch=begun)
        return Undoing(run_failed=tx.one(END, run_id=step.run_id) is not None)
    return _create(tx, step, saga, row)


def _create(tx: Tx, step: StepOfRun, saga: Saga, row: Mapping[str, object]) -> Undoing:
    ids = insert_steps(
        tx,
        run_id=step.run_id,
        lineage_root=step.lineage_root,
        nodes=[saga.undo[str(row["node_id"])]],
        keys=[compensation_key(str(row["step_key"]))],
        stamp_dispatched=True,
    )
    return Undoing(to_dispatch=tuple(ids))
