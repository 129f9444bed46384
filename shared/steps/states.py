"""Step statuses, who moves a row into and out of each, and the one table of allowed moves.

Every status change in the engine is one guarded `UPDATE … WHERE status = …` in
`shared/sql/steps.sql`; `QUERY_TRANSITIONS` names the moves each of those statements makes, and
a test checks them against `TRANSITIONS` (and the schema's CHECK on the column). `LeaseEnd`
names how a claimed attempt's lease ended, for the step's lease history.
"""

from __future__ import annotations

from enum import StrEnum


class StepStatus(StrEnum):
    PENDING = "pending"
    """Ready to be claimed. In: `insert_steps` (admission for first steps, settle for the
    next ones), the sweep (a due wait served or a retry due; an expired lease reclaimed), ops
    retry. Out: the claim in `advance_step` (→ running), ops cancel (→ skipped)."""

    RUNNING = "running"
    """Claimed under a lease (`lease_id`, `lease_expires_at`); heartbeats extend it. In: the
    claim, which also opens the lease's history row (`LeaseEnd`). Out: settle, fenced on the
    lease id (→ succeeded, failed, waiting_*); the sweep when the lease expired, fenced on the
    old lease id (→ pending, or failed with OUTCOME_UNKNOWN when an at-most-once side effect
    may have started). Both close the history row in the same statement."""

    WAITING_FOR_DELAY = "waiting_for_delay"
    """A delay is being served; `wake_at` is when it is over (the wait is then *served*: the
    step succeeds when claimed again, without running its block a second time). In: settle of a
    block that returned a future wake time. Out: the sweep when due (→ pending), ops cancel."""

    WAITING_FOR_RETRY = "waiting_for_retry"
    """An attempt failed transiently (or was throttled) and waits; `wake_at` is when to try
    *again*. In: settle. Out: the sweep when due (→ pending), ops cancel (→ skipped)."""

    SUCCEEDED = "succeeded"
    """Terminal, with `finished_at`. In: settle. Out: never (a replay is a new run)."""

    SKIPPED = "skipped"
    """Terminal, with `finished_at`: the step was not run (its run was cancelled). In: ops
    cancel. Out: never."""

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
PARKED = frozenset({StepStatus.WAITING_FOR_DELAY, StepStatus.WAITING_FOR_RETRY})

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
        (S.WAITING_FOR_DELAY, S.PENDING),  # sweep: the delay is served
        (S.WAITING_FOR_RETRY, S.PENDING),  # sweep: time to try again
        (S.WAITING_FOR_DELAY, S.SKIPPED),  # ops cancel
        (S.WAITING_FOR_RETRY, S.SKIPPED),  # ops cancel
        (S.FAILED, S.PENDING),  # ops retry of a dead-lettered step
    }
)

# The moves each engine statement in shared/sql/steps.sql makes: (from states, to states).
QUERY_TRANSITIONS: dict[str, tuple[frozenset[StepStatus], frozenset[StepStatus]]] = {
    "steps_claim": (frozenset({S.PENDING}), frozenset({S.RUNNING})),
    "steps_settle": (
        frozenset({S.RUNNING}),
        frozenset({S.SUCCEEDED, S.FAILED, S.WAITING_FOR_DELAY, S.WAITING_FOR_RETRY}),
    ),
    "steps_reclaim_expired": (frozenset({S.RUNNING}), frozenset({S.PENDING, S.FAILED})),
    "steps_wake_due": (PARKED, frozenset({S.PENDING})),
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
