"""Step and run statuses, who moves a row into and out of each, and the one table of allowed
moves for each.

Every status change is one guarded `UPDATE … WHERE status = …` in a named SQL block, whichever
file it lives in (the engine's in `shared/sql/steps.sql`, admission's in `admission.sql`, the
ops moves in `ops.sql`). `STEP_STATEMENTS` and `RUN_STATEMENTS` declare, for EVERY statement
that writes `workflow_steps` or `workflow_runs`, the statuses it moves rows from and to;
`tests/test_sql_statements.py` finds those statements in every SQL file, checks each
declaration against the statement's text and the transition table, and checks the enums
against the schema's CHECK constraints as the migrated database has them. `LeaseEnd` names how
a claimed attempt's lease ended, for the step's lease history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


class StepStatus(StrEnum):
    PENDING = "pending"
    """Ready to be claimed. In: `insert_steps` (admission for first steps, settle for the
    next ones), the sweep (a due wait served or a retry due; an expired lease reclaimed), ops
    retry and replay. Out: the claim in `advance_step` (→ running), ops cancel (→ skipped)."""

    RUNNING = "running"
    """Claimed under a lease (`lease_id`, `lease_expires_at`); heartbeats extend it. In: the
    claim, which also opens the lease's history row (`LeaseEnd`). Out: settle, fenced on the
    lease id (→ succeeded, failed, waiting_*); the sweep when the lease expired, fenced on the
    old lease id (→ pending; or failed with OUTCOME_UNKNOWN when an at-most-once side effect
    may have started and its block doesn't decide the retry itself; or, when the run has
    ended meanwhile, skipped — failed OUTCOME_UNKNOWN if marked). Both close the history row
    in the same statement."""

    WAITING_FOR_DELAY = "waiting_for_delay"
    """A delay is being served; `wake_at` is when it is over (the wait is then *served*: the
    step succeeds when claimed again, without running its block a second time). In: settle of a
    block that returned a future wake time. Out: the sweep when due (→ pending), a rehearsal
    (which serves its delays at once: → pending), ops retry of the run (→ pending), ops
    cancel."""

    WAITING_FOR_RETRY = "waiting_for_retry"
    """An attempt failed transiently (or was throttled) and waits; `wake_at` is when to try
    *again*. In: settle. Out: the sweep when due (→ pending), ops retry of the run (→
    pending), ops cancel (→ skipped)."""

    WAITING_FOR_EVENT = "waiting_for_event"
    """A `wait_for` step waits for a matching trigger event; its park row (`park_id`, kind
    `event`: event type, record, condition, deadline) was committed before it parked, and
    `wake_at` is the deadline. In: settle of a block that asked to park
    (shared/steps/parks.py). Out, each in one guarded UPDATE that also closes the park row:
    a matching event (not an echo of onceflow's own write) offered at admission before the
    deadline, or noted on the park before the step parked, or found by the park's lookback
    (`steps_resume_parked`, → pending), the sweep at the deadline (`steps_wake_due`, →
    pending), ops cancel (`runs_cancel`, → skipped). The resumed step settles without
    running its block again, from what the resume wrote in its output. Failed, it is started
    again by an ops retry on a new park row (one open park per step)."""

    WAITING_FOR_APPROVAL = "waiting_for_approval"
    """An `approval` step waits for a person's decision; its park row (`park_id`, kind
    `approval`: who may decide, the summary, `expires_at` as the deadline) was committed
    before it parked, and `wake_at` is the deadline. In: settle, as above. Out: the first
    decision through the ops API before the deadline (`steps_resume_parked`, → pending;
    after it the API answers 410), the sweep at the
    deadline (`steps_wake_due`, → pending: rejected, or approved when `on_timeout: proceed`),
    ops cancel (→ skipped)."""

    SUCCEEDED = "succeeded"
    """Terminal, with `finished_at`. In: settle; a replay's copy of a settled step. Out:
    never (a replay is a new run)."""

    SKIPPED = "skipped"
    """Terminal, with `finished_at`, outcome `CANCELLED`: the step was not run (its run was
    cancelled; `GOAL_MET` when its run met its goal: `runs_end_goal_met`). In: ops cancel
    (`runs_cancel`, pending and parked steps); a settle that parked a step of a run cancelled
    (or ended by its goal) meanwhile (`steps_skip_parked_of_ended_run`); the sweep's
    reclaim of an expired lease whose run ended meanwhile (`steps_reclaim_expired`: outcome
    `CANCELLED`, or `RUN_ENDED` when another branch failed the run; the error says so). Out:
    ops retry of a failed run (→ pending: a `RUN_ENDED` step restarts with its run); otherwise
    never, and a replay of the cancelled run starts it again in the new run."""

    FAILED = "failed"
    """Terminal, with `finished_at`, `error`, `error_class`, `outcome_code`; the run fails and
    keeps its journal (the dead-letter list). In: settle, the engine's at-most-once refusal,
    the sweep's reclaim. Out: ops retry (→ pending) only."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def parked(self) -> bool:
        return self in PARKED


TERMINAL = frozenset({StepStatus.SUCCEEDED, StepStatus.SKIPPED, StepStatus.FAILED})
PARKED = frozenset(
    {
        StepStatus.WAITING_FOR_DELAY,
        StepStatus.WAITING_FOR_RETRY,
        StepStatus.WAITING_FOR_EVENT,
        StepStatus.WAITING_FOR_APPROVAL,
    }
)
# Parked on a park row (shared/steps/parks.py): resumed by an event or a decision, not by time
# alone.
WAITING_ON_PARK = frozenset({StepStatus.WAITING_FOR_EVENT, StepStatus.WAITING_FOR_APPROVAL})

S = StepStatus
TRANSITIONS: frozenset[tuple[StepStatus, StepStatus]] = frozenset(
    {
        (S.PENDING, S.RUNNING),  # claim
        (S.PENDING, S.SKIPPED),  # ops cancel
        (S.RUNNING, S.SUCCEEDED),  # settle
        (S.RUNNING, S.FAILED),  # settle; at-most-once refusal; sweep reclaim (outcome unknown)
        (S.RUNNING, S.WAITING_FOR_DELAY),  # settle of a delay
        (S.RUNNING, S.WAITING_FOR_RETRY),  # settle of a transient failure or throttling
        (S.RUNNING, S.PENDING),  # sweep: expired lease, safe to run again
        (S.RUNNING, S.SKIPPED),  # sweep: expired lease of a run that ended meanwhile
        (S.WAITING_FOR_DELAY, S.PENDING),  # sweep: the delay is served
        (S.WAITING_FOR_RETRY, S.PENDING),  # sweep: time to try again
        (S.WAITING_FOR_DELAY, S.SKIPPED),  # ops cancel; settle of a cancelled run's step
        (S.WAITING_FOR_RETRY, S.SKIPPED),  # ops cancel; settle of a cancelled run's step
        (S.RUNNING, S.WAITING_FOR_EVENT),  # settle of a wait_for (its park row committed first)
        (S.RUNNING, S.WAITING_FOR_APPROVAL),  # settle of an approval (likewise)
        (S.WAITING_FOR_EVENT, S.PENDING),  # a matching event; the sweep at the deadline
        (S.WAITING_FOR_APPROVAL, S.PENDING),  # a decision; the sweep at the deadline
        (S.WAITING_FOR_EVENT, S.SKIPPED),  # ops cancel; settle of a cancelled run's step
        (S.WAITING_FOR_APPROVAL, S.SKIPPED),  # ops cancel; settle of a cancelled run's step
        (S.FAILED, S.PENDING),  # ops retry of a dead-lettered step
        (S.SKIPPED, S.PENDING),  # ops retry of a failed run: a step the reclaim ended RUN_ENDED
    }
)

# A step row is created pending (admission's first step, settle's next steps, a replay's
# restarted roots); a replay also copies the original run's settled steps as they were.
STEP_INITIAL = frozenset({S.PENDING, S.SUCCEEDED, S.SKIPPED, S.FAILED})


class Moves(NamedTuple):
    """What one statement does to a table's status column: it moves rows whose status is in
    `sources` (what its WHERE guard names; empty for an INSERT, whose rows are new) to one of
    `targets` (empty when it writes other columns only: a heartbeat, a dispatch stamp).
    `inserts`: the statuses of the rows a statement that also moves rows inserts (the settle
    creates the next steps in the statement that settles the step)."""

    sources: frozenset[Any]
    targets: frozenset[Any]
    inserts: frozenset[Any] = frozenset()


def _moves(
    sources: set[Any] | frozenset[Any],
    targets: set[Any] | frozenset[Any],
    inserts: set[Any] | frozenset[Any] = frozenset(),
) -> Moves:
    return Moves(frozenset(sources), frozenset(targets), frozenset(inserts))


NEW: frozenset[Any] = frozenset()  # the sources of an INSERT

# Every statement that writes workflow_steps, in any SQL file, and the moves it makes.
STEP_STATEMENTS: dict[str, Moves] = {
    # shared/sql/steps.sql: the engine and the sweep
    "steps_insert_many": _moves(NEW, {S.PENDING}),
    "steps_mark_dispatched": _moves({S.PENDING}, set()),
    "steps_claim": _moves({S.PENDING}, {S.RUNNING}),
    "steps_heartbeat": _moves({S.RUNNING}, set()),
    "steps_mark_side_effect_started": _moves({S.RUNNING}, set()),
    "steps_withdraw_side_effect_mark": _moves({S.RUNNING}, set()),
    # and, on the hot path (`fold`), the next steps' rows in the same statement
    "steps_settle": _moves({S.RUNNING}, {S.SUCCEEDED, S.FAILED, *PARKED}, {S.PENDING}),
    "steps_reclaim_expired": _moves({S.RUNNING}, {S.PENDING, S.FAILED, S.SKIPPED}),
    "steps_wake_due": _moves(PARKED, {S.PENDING}),
    "steps_redispatch_lost": _moves({S.PENDING}, set()),
    # shared/sql/steps.sql: a wait resumed by a matching event or a decision
    "steps_resume_parked": _moves(WAITING_ON_PARK, {S.PENDING}),
    # shared/sql/steps.sql: a foreach's collected outputs, once its last iteration succeeded
    "steps_add_loop_outputs": _moves({S.SUCCEEDED}, set()),
    # shared/sql/admission.sql: the first step of an admitted run
    "admission_admit": _moves(NEW, {S.PENDING}),
    # ... and of a run a re-decision started (shared/admission/redecide.py)
    "admission_redecide": _moves(NEW, {S.PENDING}),
    # shared/sql/ops.sql: replay, retry, rehearsal
    "ops_replay_steps_copy": _moves(NEW, TERMINAL),
    "ops_replay_step_restart": _moves(NEW, {S.PENDING}),
    # A pending root is rewritten in place (fresh attempt budget), which is not a move.
    "ops_retry_step_reset": _moves(
        {S.FAILED, S.SKIPPED, S.PENDING, S.WAITING_FOR_DELAY, S.WAITING_FOR_RETRY}, {S.PENDING}
    ),
    "ops_rehearsal_serve_delays": _moves({S.WAITING_FOR_DELAY}, {S.PENDING}),
    # shared/sql/steps.sql: ops cancel, and a settle that parked a step of a cancelled run
    "runs_cancel": _moves({S.PENDING, *PARKED}, {S.SKIPPED}),
    # shared/sql/steps.sql: the workflow's goal met (admission), like the cancel
    "runs_end_goal_met": _moves({S.PENDING, *PARKED}, {S.SKIPPED}),
    "steps_skip_parked_of_ended_run": _moves(PARKED, {S.SKIPPED}),
    # shared/sql/limit_queue.sql: a limit's gate takes its grant / place; the grantor serves
    # the line (shared/gates/limit_queue.py)
    "limit_queue_claim": _moves({S.RUNNING}, set()),
    "limit_queue_join": _moves({S.RUNNING}, set()),
    "limit_queue_grant": _moves({S.WAITING_FOR_RETRY}, {S.PENDING}),
    # shared/sql/steps.sql: a run entering its compensating phase (shared/steps/saga.py) skips
    # its main-phase steps still open, as a failed run's are
    "steps_skip_open_of_compensating_run": _moves({S.PENDING, *PARKED}, {S.SKIPPED}),
    # shared/sql/steps.sql: a run entering its finally phase (shared/steps/finale.py) skips its
    # other steps still open, as a failed run's are
    "steps_skip_open_of_final_run": _moves({S.PENDING, *PARKED}, {S.SKIPPED}),
}
# Their new status is a parameter (the settlement's) or copied from another row, so only the
# declaration says which; for every other statement the test reads it from the text.
STEP_DYNAMIC = frozenset({"steps_settle", "ops_replay_steps_copy"})

# Kept for readers of the engine's own statements (the lease history test).
QUERY_TRANSITIONS = STEP_STATEMENTS


class RunStatus(StrEnum):
    RUNNING = "running"
    """Executing its steps; in its `compensating` phase (`phase`, shared/steps/saga.py) it is
    undoing its succeeded steps after one failed, and ends failed. In: admission (a new live
    run), replay (a new run of the lineage), a rehearsal's start, ops retry of a failed run
    (reopened in place, back in its main phase). In its `finally` phase (shared/steps/
    finale.py) its end is decided (`final_status`) and its `finally:` steps run. Out: the
    engine when no step is left (→ succeeded) or a step failed (→ failed; after its
    compensations when it has any), the sweep's reclaim of a step that failed (→ failed), ops
    cancel and the end of a rehearsal (→ cancelled); with `finally:` steps, each of these
    engine ends, a cancel and a goal met after them (→ final_status, or failed when one
    failed)."""

    SUCCEEDED = "succeeded"
    """Terminal, with `finished_at`: every step settled and none failed. Out: never."""

    FAILED = "failed"
    """Terminal, with `finished_at` and `error`; a step failed. Its journal is the dead-letter
    list. Out: ops retry (→ running); a replay starts a new run instead."""

    CANCELLED = "cancelled"
    """Terminal, with `finished_at`: stopped before it finished. In: ops cancel of a live run
    (`runs_cancel`, which records `cancelled_by` and `cancel_reason`), and the same statement
    when an admitted event matches the workflow's `cancel_on` (`cancelled_by: event <id>`);
    the end of a rehearsal that would have waited or ran out of its step budget. Out: never; a
    replay starts a new run of the lineage from the skipped steps."""

    GOAL_MET = "goal_met"
    """Terminal, with `finished_at`: the workflow's `goal` held on an admitted event about the
    run's record, the first time (`runs_end_goal_met`, after the run row's lock, as the cancel
    does). Its pending and parked steps are skipped (GOAL_MET); a step in flight finishes its
    attempt and nothing starts after it. Out: never."""


R = RunStatus
RUN_TRANSITIONS: frozenset[tuple[RunStatus, RunStatus]] = frozenset(
    {
        (R.RUNNING, R.SUCCEEDED),  # the last step settled
        (R.RUNNING, R.FAILED),  # a step failed (settle or the sweep's reclaim)
        (R.RUNNING, R.CANCELLED),  # ops cancel; a `cancel_on` event; a rehearsal stops
        (R.RUNNING, R.GOAL_MET),  # an admitted event met the workflow's goal
        (R.FAILED, R.RUNNING),  # ops retry reopens the run
    }
)
RUN_INITIAL = frozenset({R.RUNNING})

# Every statement that writes workflow_runs, in any SQL file, and the moves it makes.
RUN_STATEMENTS: dict[str, Moves] = {
    "admission_admit": _moves(NEW, {R.RUNNING}),
    "admission_redecide": _moves(NEW, {R.RUNNING}),
    "runs_finish_if_done": _moves({R.RUNNING}, {R.SUCCEEDED}),
    "runs_fail": _moves({R.RUNNING}, {R.FAILED}),
    # The settle's hot path ends the run in the statement that settles its step.
    "steps_settle": _moves({R.RUNNING}, {R.SUCCEEDED, R.FAILED}),
    "steps_reclaim_expired": _moves({R.RUNNING}, {R.FAILED}),
    "ops_replay_run_insert": _moves(NEW, {R.RUNNING}),
    "ops_retry_run_reopen": _moves({R.FAILED}, {R.RUNNING}),
    "ops_rehearsal_run_insert": _moves(NEW, {R.RUNNING}),
    "ops_rehearsal_stop": _moves({R.RUNNING}, {R.CANCELLED}),
    # A run whose version declares `finally:` stays running (its finally phase, shared/steps/
    # finale.py) and ends cancelled after its finally steps.
    "runs_cancel": _moves({R.RUNNING}, {R.CANCELLED, R.RUNNING}),
    # Like the cancel: a run with `finally:` steps stays running (its finally phase).
    "runs_end_goal_met": _moves({R.RUNNING}, {R.GOAL_MET, R.RUNNING}),
    # shared/steps/saga.py: a failure with something to undo keeps the run running, in its
    # compensating phase (not a status move); the last compensation's settle fails it.
    "runs_begin_compensating": _moves({R.RUNNING}, set()),
    "runs_end_compensated": _moves({R.RUNNING}, {R.FAILED}),
    # shared/steps/finale.py: a run whose end is decided and whose version declares `finally:`
    # stays running in its finally phase (not a status move); the last finally step's settle
    # ends it as decided (`final_status`), or failed when a finally step failed.
    "runs_begin_finally": _moves({R.RUNNING}, set()),
    "runs_end_finally": _moves({R.RUNNING}, {R.SUCCEEDED, R.FAILED, R.CANCELLED, R.GOAL_MET}),
}


# Statements that delete rows, which is no move: retention (shared/sweep/retention.py) removes the
# runs, and their steps, of lineages whose every run finished longer ago than the retention; a
# deleted row is never read again. The statement guards on `finished_at` of the whole lineage.
RETENTION_DELETES = frozenset({"retention_lineages_delete"})


@dataclass(frozen=True)
class Machine:
    """One table's statuses, allowed moves, initial statuses and the statements that write it
    (`deletes`: the ones that only delete rows, never moving one)."""

    statuses: type[StrEnum]
    transitions: frozenset[tuple[Any, Any]]
    initial: frozenset[Any]
    statements: Mapping[str, Moves]
    dynamic: frozenset[str] = frozenset()
    deletes: frozenset[str] = frozenset()


MACHINES: dict[str, Machine] = {
    "workflow_steps": Machine(
        StepStatus, TRANSITIONS, STEP_INITIAL, STEP_STATEMENTS, STEP_DYNAMIC, RETENTION_DELETES
    ),
    "workflow_runs": Machine(
        RunStatus, RUN_TRANSITIONS, RUN_INITIAL, RUN_STATEMENTS, deletes=RETENTION_DELETES
    ),
}


class LeaseEnd(StrEnum):
    """How a lease in `workflow_step_leases` (the step's attempt history) ended. The claim
    inserts the row; whichever statement moves the step out of running closes it in the same
    statement, recording the status it moved the step to. A holder that finds its lease gone
    on a heartbeat or settle is not a third kind: the lease was already reclaimed."""

    SETTLED = "settled"
    """Its holder settled the step, fenced on the lease (`steps_settle`)."""

    RECLAIMED = "reclaimed"
    """It expired and the sweep took the step back (`steps_reclaim_expired`)."""


# The statement that ends a lease of each kind. Every statement that moves a step out of
# running is here (a test checks it against QUERY_TRANSITIONS), so no lease stays open.
LEASE_ENDED_BY: dict[LeaseEnd, str] = {
    LeaseEnd.SETTLED: "steps_settle",
    LeaseEnd.RECLAIMED: "steps_reclaim_expired",
}


def allowed(old: StepStatus | str, new: StepStatus | str) -> bool:
    return (StepStatus(old), StepStatus(new)) in TRANSITIONS


def check_transition(old: StepStatus | str, new: StepStatus | str) -> None:
    if not allowed(old, new):
        raise ValueError(f"step transition {old} -> {new} is not allowed")
