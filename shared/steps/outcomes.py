"""What a step's outcome means for the step: the one classify function, and backoff.

Pure logic (no database, no HTTP client): given what a block returned or raised, its kind and
retry policy and the attempt that ran, `classify_outcome` decides the step's next state, its
wake time and what the journal records. Failure classes follow one rule everywhere: 5xx, 408,
425, 429, connection resets, timeouts and Postgres serialization/deadlock/lock errors are
transient; anything unknown is permanent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.blocks.base import (
    BlockFailure,
    BlockKind,
    BlockResult,
    FanOut,
    ParkRequest,
    RetryPolicy,
)
from shared.core.errors import ConflictError, ErrorClass, PermanentError, TransientError
from shared.steps.states import StepStatus

OUTCOME_OK = "OK"
OUTCOME_DELAYED = "DELAYED"
# An at-most-once side effect may have left the process and its result was never recorded:
# a person has to check the provider and replay; the engine never calls again (invariant 10).
OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
OUTCOME_LEASE_EXPIRED = "LEASE_EXPIRED"
OUTCOME_BLOCK_ERROR = "BLOCK_ERROR"
OUTCOME_TRANSIENT_ERROR = "TRANSIENT_ERROR"
OUTCOME_CONFIG_INVALID = "CONFIG_INVALID"
OUTCOME_UNKNOWN_BLOCK = "UNKNOWN_BLOCK_TYPE"
OUTCOME_UNKNOWN_NODE = "UNKNOWN_NODE"
# The run's pinned version could not be read or parsed after the step was claimed.
OUTCOME_GRAPH_UNREADABLE = "GRAPH_UNREADABLE"

# The most a provider's Retry-After may park a step: beyond this, it is a misbehaving header.
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0
MAX_ERROR_CHARS = 4000
DELAY_UNTIL_KEY = "delay_until"
# Set by the statement that wakes a delayed step (steps_wake_due, ops_rehearsal_serve_delays).
DELAY_SERVED_KEY = "delay_served"
# Set by whatever resumed a parked wait (steps_resume_parked, steps_wake_due): {"by": "event" |
# "decision" | "deadline", …}; the step then settles from it without running its block.
RESUMED_KEY = "resumed"
OUTCOME_WAITING = "WAITING"
# What `branch` journals for an ended path (shared.blocks.flow; replay_plan reads the same).
NO_BRANCH_TAKEN = "(none)"
OUTCOME_EVENT_RECEIVED = "EVENT_RECEIVED"
OUTCOME_WAIT_TIMED_OUT = "WAIT_TIMED_OUT"
OUTCOME_APPROVED = "APPROVED"
OUTCOME_REJECTED = "REJECTED"


def classify_exception(exc: BaseException) -> tuple[ErrorClass, str, float | None]:
    """(class, outcome code, retry-after) for anything a block raised.

    Blocks are meant to raise `BlockFailure` (classified at the port); anything else is
    classified here, conservatively: network resets and timeouts and onceflow's own transient
    database errors retry, everything unknown is permanent."""
    if isinstance(exc, BlockFailure):
        return exc.error_class, exc.outcome_code, exc.retry_after
    if isinstance(exc, TransientError):
        return "transient", OUTCOME_TRANSIENT_ERROR, exc.retry_after
    if isinstance(exc, ConflictError | PermanentError):
        return "permanent", OUTCOME_BLOCK_ERROR, None
    # ConnectionError covers resets/refused/aborted; TimeoutError covers socket timeouts.
    if isinstance(exc, ConnectionError | TimeoutError):
        return "transient", OUTCOME_TRANSIENT_ERROR, None
    return "permanent", OUTCOME_BLOCK_ERROR, None


def backoff_seconds(retry_number: int, policy: RetryPolicy) -> float:
    """The wait before retry `retry_number` (1 = the first retry). Deterministic, no jitter.

    Geometric from `first_backoff_seconds` to `max_backoff_seconds` over the policy's retries,
    so with the default 3 attempts the two waits are 1 and 15 minutes; with 5 attempts
    1, ≈2.5, ≈6 and 15 minutes. A retry beyond the policy waits the maximum."""
    retries = max(policy.max_attempts - 1, 1)
    first, cap = policy.first_backoff_seconds, max(policy.max_backoff_seconds, 0.0)
    if retries == 1 or retry_number <= 1 or first <= 0:
        return min(first, cap) if retry_number <= 1 else cap
    if retry_number >= retries:
        return cap
    ratio = cap / first
    return float(first * math.pow(ratio, (retry_number - 1) / (retries - 1)))


@dataclass(frozen=True)
class Settlement:
    """What settle writes on the step row, and whether the run goes on."""

    status: StepStatus
    attempt: int
    outcome_code: str
    output: Mapping[str, Any] | None = None
    error: str | None = None
    error_class: ErrorClass | None = None
    branch_choice: str | None = None
    wake_at: datetime | None = None
    # Successor nodes to create rows for (only when the step succeeded).
    next_nodes: tuple[str, ...] = ()
    # A wait to park on (status waiting_for_event / waiting_for_approval).
    park: ParkRequest | None = None
    # A foreach's first iterations to start (shared/steps/loops.py).
    fan_out: FanOut | None = None
    # The config the block ran with, templates rendered: kept on the step so people see what
    # it was asked to do (None: the block did not run, and the row keeps what it had).
    input: Mapping[str, Any] | None = None

    @property
    def fails_run(self) -> bool:
        return self.status is StepStatus.FAILED


def failed(attempt: int, outcome_code: str, error: str, error_class: ErrorClass) -> Settlement:
    return Settlement(
        status=StepStatus.FAILED,
        attempt=attempt,
        outcome_code=outcome_code,
        error=error[:MAX_ERROR_CHARS],
        error_class=error_class,
    )


def classify_outcome(
    outcome: BlockResult | BaseException,
    *,
    kind: BlockKind,
    retry: RetryPolicy,
    attempt: int,
    successors: Sequence[str],
    now: datetime,
) -> Settlement:
    """The next state of a step whose attempt `attempt` produced `outcome`.

    - A result that asks to park (`park`) waits for an event or a decision until its deadline
      (the engine writes the park row first).
    - A result with a future `wake_at` parks the step in `waiting_for_delay` (the wake time
      is journaled in the output so the served wait is recognised later); otherwise the step
      succeeds and its successors are the result's `next_nodes`, else the branch it chose,
      else the node's declared edges.
    - A failure that doesn't use up an attempt (throttling) parks in `waiting_for_retry` for its
      retry-after and gives the attempt back.
    - A transient failure of an action with attempts left parks in `waiting_for_retry` for the
      deterministic backoff, or the failure's retry-after when that is longer.
    - Anything else fails the step (and the run). Flow control never retries.
    """
    if isinstance(outcome, BlockResult):
        return _result(outcome, attempt=attempt, successors=successors, now=now)

    error_class, code, retry_after = classify_exception(outcome)
    message = str(outcome) or type(outcome).__name__
    if retry_after is not None:
        retry_after = min(max(retry_after, 0.0), MAX_RETRY_AFTER_SECONDS)
    if kind == "flow":
        return failed(attempt, code, message, error_class)
    if (
        isinstance(outcome, BlockFailure)
        and not outcome.consumes_attempt
        and error_class == "transient"
    ):
        wait = retry_after if retry_after is not None else retry.first_backoff_seconds
        return Settlement(
            status=StepStatus.WAITING_FOR_RETRY,
            attempt=max(attempt - 1, 0),
            outcome_code=code,
            error=message[:MAX_ERROR_CHARS],
            error_class=error_class,
            wake_at=now + timedelta(seconds=wait),
        )
    if error_class == "transient" and attempt < retry.max_attempts:
        wait = backoff_seconds(attempt, retry)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return Settlement(
            status=StepStatus.WAITING_FOR_RETRY,
            attempt=attempt,
            outcome_code=code,
            error=message[:MAX_ERROR_CHARS],
            error_class=error_class,
            wake_at=now + timedelta(seconds=wait),
        )
    if error_class == "transient":
        message = f"{message} (gave up after {attempt} attempts)"
    return failed(attempt, code, message, error_class)


def _result(
    outcome: BlockResult, *, attempt: int, successors: Sequence[str], now: datetime
) -> Settlement:
    """What a block's returned result means (classify_outcome's first case)."""
    if outcome.park is not None:
        return _parked(outcome, outcome.park, attempt)
    if outcome.wake_at is not None and outcome.wake_at > now:
        output = dict(outcome.output or {})
        output[DELAY_UNTIL_KEY] = outcome.wake_at.isoformat()
        return Settlement(
            status=StepStatus.WAITING_FOR_DELAY,
            attempt=attempt,
            outcome_code=OUTCOME_DELAYED,
            output=output,
            branch_choice=outcome.branch_choice,
            wake_at=outcome.wake_at,
        )
    if outcome.next_nodes is not None:
        nxt = tuple(outcome.next_nodes)
    elif outcome.branch_choice is not None:
        nxt = (outcome.branch_choice,)
    else:
        nxt = tuple(successors)
    return Settlement(
        status=StepStatus.SUCCEEDED,
        attempt=attempt,
        outcome_code=outcome.outcome_code,
        output=outcome.output,
        branch_choice=outcome.branch_choice,
        next_nodes=nxt,
        fan_out=outcome.fan_out,
    )


def _parked(outcome: BlockResult, park: ParkRequest, attempt: int) -> Settlement:
    event = park.kind == "event"
    return Settlement(
        status=StepStatus.WAITING_FOR_EVENT if event else StepStatus.WAITING_FOR_APPROVAL,
        attempt=attempt,
        outcome_code=OUTCOME_WAITING,
        output=outcome.output,
        wake_at=park.deadline,
        park=park,
    )


def served_delay(output: Mapping[str, Any] | None) -> bool:
    """True when a step parked by a delay was woken because its wake time came: the wake
    statement (the sweep's, or a rehearsal's) says so in the row, judged by the database's
    clock. Never the executor's wall clock: one running behind would park the step again for
    a whole new duration."""
    return bool(output) and output.get(DELAY_SERVED_KEY) is True  # type: ignore[union-attr]


def resumed_settlement(
    output: Mapping[str, Any] | None, *, attempt: int, successors: Sequence[str]
) -> Settlement | None:
    """How a resumed wait settles, from what resumed it (the step's output says; None when it
    was not a resumed wait). Pure and decided from the journal alone, so an attempt that
    crashes before settling settles the same way when claimed again.

    - an event: succeeded, the matched event as its output, on to the declared successors;
    - a decision: approved goes on; rejected takes `on_reject`'s goto when the step has one,
      fails the step when it says `fail`, else ends this path;
    - the deadline: an event wait fails (`fail`), goes on (`continue`) or jumps to its
      `goto` target (journaled as the branch choice, so a replay follows the same edge); an
      approval is rejected (`reject`, as above) or approved (`proceed`)."""
    resumed = (output or {}).get(RESUMED_KEY)
    if not isinstance(resumed, Mapping):
        return None
    by = resumed.get("by")
    decision = resumed.get("decision")
    if by == "deadline" and resumed.get("kind") == "approval":
        decision = "approved" if resumed.get("on_timeout") == "proceed" else "rejected"
    if by == "event" or decision == "approved":
        code = OUTCOME_EVENT_RECEIVED if by == "event" else OUTCOME_APPROVED
        return _went_on(output, attempt, code, successors)
    if decision == "rejected":
        return _rejected(output, resumed, attempt)
    if by == "deadline":
        return _timed_out(output, resumed, attempt, successors)
    return None


def _went_on(
    output: Mapping[str, Any] | None,
    attempt: int,
    code: str,
    nxt: Sequence[str],
    choice: str | None = None,
) -> Settlement:
    return Settlement(
        status=StepStatus.SUCCEEDED,
        attempt=attempt,
        outcome_code=code,
        output=output,
        branch_choice=choice,
        next_nodes=tuple(nxt),
    )


def _rejected(
    output: Mapping[str, Any] | None, resumed: Mapping[str, Any], attempt: int
) -> Settlement:
    # The approval block journaled its `on_reject` in the output it parked with.
    on_reject = (output or {}).get("on_reject")
    if on_reject == "fail":
        who = resumed.get("decided_by") or "its deadline"
        return failed(attempt, OUTCOME_REJECTED, f"rejected by {who}", "permanent")
    if isinstance(on_reject, str) and on_reject:
        return _went_on(output, attempt, OUTCOME_REJECTED, (on_reject,), on_reject)
    return _went_on(output, attempt, OUTCOME_REJECTED, (), NO_BRANCH_TAKEN)


def _timed_out(
    output: Mapping[str, Any] | None,
    resumed: Mapping[str, Any],
    attempt: int,
    successors: Sequence[str],
) -> Settlement:
    on_timeout, goto = resumed.get("on_timeout"), resumed.get("goto")
    if on_timeout == "fail":
        msg = f"no matching event before the deadline ({resumed.get('at')})"
        return failed(attempt, OUTCOME_WAIT_TIMED_OUT, msg, "permanent")
    if on_timeout == "goto" and isinstance(goto, str):
        return _went_on(output, attempt, OUTCOME_WAIT_TIMED_OUT, (goto,), goto)
    return _went_on(output, attempt, OUTCOME_WAIT_TIMED_OUT, successors)
