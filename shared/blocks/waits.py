"""Blocks that park their step until something happens: `wait_for` (an event) and `approval`
(a person's decision). Each returns a `ParkRequest`; the engine writes the park row, commits
it, parks the step and resumes it through one guarded transition (shared/steps/parks.py).
No side effects, free, never retried.

wait_for: waits for a trigger event of type `event` on the run's record (the default and only
  correlation: the same record) for which `when` holds — a CEL condition over the incoming
  event as a trigger rule reads it (`event`, `trigger`, `record`) and the waiting run's
  `steps` and `run`. The matched event is the step's output (`event`, `trigger`, `record`).
  At the `timeout`: `fail` (the default), `continue` (on to `next`, output without an event),
  or `{goto: <step>}` (journaled as the step's branch choice with its settle). `lookback`
  lets an event recorded that long before the wait parked count (a reply that raced the
  email that asked for it).
approval: parks the step until one of the people who may decide (`approvers`: a tenant
  `role`, named `users`, or both) approves or rejects it through the ops API, with a comment; the
  first decision wins. `summary` (usually a `${{ … }}` template) is what they are shown. At
  `expires_in`: `reject` (the default) or `proceed` (opt-in; validation warns). Approved goes
  on to `next`; rejected ends this path, or `on_reject: fail` fails the run, or
  `on_reject: {goto: <step>}` jumps there. The decision (who, when, comment) is the step's
  output and is audited.

A rehearsal never waits: the step answers what it would have waited for and goes on.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.blocks.base import (
    BlockContext,
    BlockFailure,
    BlockResult,
    ParkRequest,
    flow_block,
)
from shared.providers import kinds, registry
from shared.workflows.expressions import ExpressionError, compile_expression
from shared.workflows.scope import kept_for_wait

MAX_WAIT = timedelta(days=366)
MAX_LOOKBACK = timedelta(days=7)
OUTCOME_BAD_CONFIG = "BAD_CONFIG"
OUTCOME_NO_RECORD = "NO_RECORD"


class Duration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    seconds: float = Field(default=0, ge=0)
    minutes: float = Field(default=0, ge=0)
    hours: float = Field(default=0, ge=0)
    days: float = Field(default=0, ge=0)

    @property
    def value(self) -> timedelta:
        return timedelta(
            seconds=self.seconds, minutes=self.minutes, hours=self.hours, days=self.days
        )


class Goto(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    goto: str = Field(min_length=1, description="The step to jump to.")


class WaitForConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    event: str = Field(min_length=1, description="The trigger event type to wait for.")
    when: str = Field(
        default="true",
        description="CEL condition over the incoming event (`event`, `trigger`, `record`) and "
        "the waiting run's `steps` and `run`.",
    )
    watch: list[str] = Field(
        default_factory=list,
        description="For a *.property_changed event: the fields to listen to (subscribed at the "
        "provider and watched for changes). Default: the fields `when` reads off the event "
        "(`record.<f>`, `event.changed_fields.<f>`).",
    )
    timeout: Duration = Field(description="How long to wait (at most 366 days).")
    on_timeout: Literal["fail", "continue"] | Goto = Field(
        default="fail", description="`fail`, `continue`, or `{goto: <step>}` at the timeout."
    )
    lookback: Duration | None = Field(
        default=None,
        description="Also count an event recorded up to this long before the wait parked "
        "(at most 7 days).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> WaitForConfig:
        if not timedelta(0) < self.timeout.value <= MAX_WAIT:
            raise ValueError(f"timeout must be positive and at most {MAX_WAIT.days} days")
        if self.lookback is not None and self.lookback.value > MAX_LOOKBACK:
            raise ValueError(f"lookback can be at most {MAX_LOOKBACK.days} days")
        return self


def _run_record_key(ctx: BlockContext) -> str:
    record = ctx.scope.get("record")
    key = record.get("key") if isinstance(record, dict) else None
    if not isinstance(key, str) or not key:
        raise BlockFailure(
            "wait_for correlates on the run's record, and this run has none",
            error_class="permanent",
            outcome_code=OUTCOME_NO_RECORD,
        )
    return key


def execute_wait_for(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, WaitForConfig)
    try:
        compile_expression(config.when)  # validation said so already; a hand-made row may not
    except ExpressionError as exc:
        raise BlockFailure(
            f"when: {exc}", error_class="permanent", outcome_code=OUTCOME_BAD_CONFIG
        ) from None
    key = _run_record_key(ctx)
    deadline = datetime.now(UTC) + config.timeout.value
    waiting: dict[str, Any] = {"waiting_for": config.event, "record_key": key}
    if ctx.dry_run:
        return BlockResult(output={**waiting, "rehearsal": "a live run would wait here"})
    goto = config.on_timeout.goto if isinstance(config.on_timeout, Goto) else None
    return BlockResult(
        output={**waiting, "until": deadline.isoformat()},
        park=ParkRequest(
            kind="event",
            deadline=deadline,
            on_timeout="goto" if goto else str(config.on_timeout),
            timeout_goto=goto,
            # A wait on any CRM's event waits for the one the run's connection sends.
            event_type=registry.event_type_on(kinds.provider_of(ctx.connection_id), config.event),
            record_key=key,
            condition=config.when,
            scope=kept_for_wait(ctx.scope),
            lookback_seconds=(
                0.0 if config.lookback is None else config.lookback.value.total_seconds()
            ),
        ),
    )


class Approvers(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    role: str | None = Field(default=None, min_length=1, description="A tenant role.")
    users: list[str] = Field(default_factory=list, description="Named users (token labels).")

    @model_validator(mode="after")
    def _someone(self) -> Approvers:
        if self.role is None and not self.users:
            raise ValueError("name a `role`, `users`, or both: who may decide")
        return self


class ApprovalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    summary: str = Field(min_length=1, max_length=2000, description="What the approvers are shown.")
    approvers: Approvers
    expires_in: Duration = Field(description="How long the approval may wait (≤ 366 days).")
    on_timeout: Literal["reject", "proceed"] = Field(
        default="reject", description="`reject` (default) or `proceed` when nobody decided."
    )
    on_reject: Literal["end", "fail"] | Goto = Field(
        default="end",
        description="On rejection: end this path (default), `fail` the run, or `{goto: <step>}`.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ApprovalConfig:
        if not timedelta(0) < self.expires_in.value <= MAX_WAIT:
            raise ValueError(f"expires_in must be positive and at most {MAX_WAIT.days} days")
        return self


def execute_approval(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, ApprovalConfig)
    deadline = datetime.now(UTC) + config.expires_in.value
    on_reject = (
        config.on_reject.goto
        if isinstance(config.on_reject, Goto)
        else ("fail" if config.on_reject == "fail" else None)
    )
    output: dict[str, Any] = {"summary": config.summary, "on_reject": on_reject}
    if ctx.dry_run:
        return BlockResult(output={**output, "rehearsal": "a live run would ask for approval"})
    return BlockResult(
        output={**output, "expires_at": deadline.isoformat()},
        park=ParkRequest(
            kind="approval",
            deadline=deadline,
            on_timeout=config.on_timeout,
            approver_role=config.approvers.role,
            approver_users=tuple(config.approvers.users),
            summary=config.summary,
        ),
    )


WAIT_FOR = flow_block(
    "wait_for",
    WaitForConfig,
    execute_wait_for,
    "Wait for a matching event on the run's record, until a timeout.",
)
APPROVAL = flow_block(
    "approval",
    ApprovalConfig,
    execute_approval,
    "Wait for a person's approval or rejection, until it expires.",
)
SPECS = (WAIT_FOR, APPROVAL)
