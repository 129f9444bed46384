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
A rehearsal never waits: the step answers what it would have waited for and goes on.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.blocks.base import (
    NO_RETRY,
    BlockContext,
    BlockFailure,
    BlockResult,
    BlockSpec,
    ParkRequest,
)
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
        try:
            compile_expression(self.when)
        except ExpressionError as exc:
            raise ValueError(f"when: {exc}") from None
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
            event_type=config.event,
            record_key=key,
            condition=config.when,
            scope=kept_for_wait(ctx.scope),
            lookback_seconds=(
                0.0 if config.lookback is None else config.lookback.value.total_seconds()
            ),
        ),
    )


WAIT_FOR = BlockSpec(
    type_name="wait_for",
    config_model=WaitForConfig,
    kind="flow",
    side_effect="none",
    price=0,
    retry=NO_RETRY,
    execute=execute_wait_for,
    description="Wait for a matching event on the run's record, until a timeout.",
)
SPECS = (WAIT_FOR,)
