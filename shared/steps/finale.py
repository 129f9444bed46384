"""`finally:`: steps that run once whatever the run's end — succeeded, failed (after its
compensations) or cancelled.

A finally step is a step of the run (journal key `finally:<step id>`, its own idempotency key,
shared/workflows/step_keys.py), claimed, executed, retried, parked and settled by the same
engine, one per invocation. A run whose version declares `finally:` never ends where a run
without it would; it enters its `finally` phase instead, with the end its main phase decided
kept in `final_status`:

- the last main step's settle (nothing left to do: `succeeded`), a step's failure with nothing
  to undo (`failed`), the last compensation's settle (`failed`, shared/steps/saga.py): each
  runs `runs_begin_finally`, guarded on the phase it leaves, under the run row's lock that the
  settle took;
- a cancel (shared/steps/cancel.py, `runs_cancel`): the same statement that would have ended
  the run `cancelled` keeps it running in the `finally` phase (`cancelled` kept).

Entering the phase skips the run's other open steps (as a failed run's) and creates the first
finally step in the same transaction; each finally step's settle creates the next ones (its
`next`, or a branch's or a wait's choice, all among the finally steps); when none is open any
more the run ends `final_status` — or `failed` when a finally step failed, its error appended
to the run's (`runs_end_finally`). A failed finally step starts nothing after it, like a
failed main step. A run in its finally phase cannot be cancelled (409, with the reason): its
end is decided, and the finally steps are what is left of it.

Runs of versions without `finally:` never reach this module (settle_step keeps its one-statement
path for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.core import queries
from shared.core.db import Tx
from shared.steps.claim import StepOfRun
from shared.steps.journal import insert_steps
from shared.steps.states import StepStatus
from shared.workflows.definition import Step, WorkflowDefinition
from shared.workflows.step_keys import final_key, is_final

SQL = queries.load("steps")
BEGIN = SQL["runs_begin_finally"]
SKIP_OPEN = SQL["steps_skip_open_of_final_run"]
END = SQL["runs_end_finally"]

FINALLY = "finally"


@dataclass(frozen=True)
class Finale:
    """The `finally:` steps a workflow version declares, the first one first."""

    steps: tuple[Step, ...]

    @classmethod
    def of(cls, graph: WorkflowDefinition) -> Finale | None:
        return cls(tuple(graph.finally_)) if graph.finally_ else None

    @property
    def first(self) -> Step:
        return self.steps[0]


@dataclass(frozen=True)
class Ending:
    """What a settle in the finally phase's hands did."""

    to_dispatch: tuple[str, ...] = ()
    # The run's end status when this settle ended it (None: it did not).
    run_status: str | None = None


def begin(
    tx: Tx,
    step: StepOfRun,
    final: Finale,
    *,
    final_status: str,
    from_phase: str,
    error: str | None = None,
    when_done: bool = False,
) -> tuple[str, ...] | None:
    """The run's end is decided (`final_status`): enter the finally phase and create the first
    finally step, in the settle's transaction (under the run row's lock). None when the guard
    refused (another settle or a cancel decided first; or, `when_done`, a step is still open):
    the caller does what it does when its own end statement moves nothing."""
    moved = tx.one(
        BEGIN,
        run_id=step.run_id,
        final_status=final_status,
        from_phase=from_phase,
        error=error,
        when_done=when_done,
    )
    if moved is None:
        return None
    return start(tx, step.run_id, step.lineage_root, final.first)


def start(tx: Tx, run_id: str, lineage_root: str, first: Step) -> tuple[str, ...]:
    """The run just entered its finally phase (a settle's `begin`, or a cancel in the same
    statement that kept it running): its other open steps skipped, its first finally step
    created (stamped dispatched: the caller publishes it after commit). A first finally step
    that exists already (a failed run retried after its finally steps ran) is not run again:
    the run ends at once, as the rows it has say."""
    tx.execute(SKIP_OPEN, run_id=run_id)
    ids = insert_steps(
        tx,
        run_id=run_id,
        lineage_root=lineage_root,
        nodes=[first],
        keys=[final_key(first.id)],
        stamp_dispatched=True,
    )
    if not ids:
        tx.one(END, run_id=run_id, error=None)
    return tuple(ids)


def settled(
    tx: Tx,
    step: StepOfRun,
    status: StepStatus,
    next_nodes: Sequence[Step],
    error: str,
) -> Ending | None:
    """What the finally phase does with `step`'s settle (status `status`), in its transaction
    after `steps_settle` locked the run row; None: a finally step that parked, which the settle
    parks as in any run.

    - a finally step that succeeded creates its next ones; one that ended with nothing after
      it ends the run when no other finally step is open;
    - any other step (a main step in flight when the phase began) creates nothing, and a wait
      it settled into is skipped at once (nothing would serve it)."""
    if not is_final(step.step_key):
        if status.parked:
            tx.execute(SKIP_OPEN, run_id=step.run_id)
        return Ending()
    if not status.terminal:
        return None
    if status is StepStatus.SUCCEEDED and next_nodes:
        ids = insert_steps(
            tx,
            run_id=step.run_id,
            lineage_root=step.lineage_root,
            nodes=next_nodes,
            keys=[final_key(n.id) for n in next_nodes],
            stamp_dispatched=True,
        )
        if ids:
            return Ending(to_dispatch=tuple(ids))
    ended = tx.one(END, run_id=step.run_id, error=error if status is StepStatus.FAILED else None)
    return Ending(run_status=None if ended is None else str(ended["status"]))
