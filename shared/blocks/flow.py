"""Flow-control blocks: `branch`, `delay`, `end`. No side effects, free, never retried.

branch: evaluates the step's `branches[].when` conditions in order over the run's scope; the
  first that holds chooses its `next`. When none holds the step takes `otherwise`; when there
  is no `otherwise` the path ends there (the run finishes once its other paths do). The choice
  is journaled in `branch_choice` — `NO_BRANCH_TAKEN` for an ended path — so a replay follows
  the edge the original took instead of re-evaluating. A condition that fails to evaluate (a
  missing key, a non-bool) fails the step permanently: guessing an edge would be worse.
delay: waits a fixed duration (`seconds`/`minutes`/`hours`/`days`, summed) or until a moment
  (`until`: an RFC 3339 timestamp, usually rendered from `${{ … }}`); the step parks in
  `waiting_for_delay` until `wake_at`. A moment in the past wakes at once.
end: ends its path; a step after it is unreachable (validation says so).
foreach: runs its body step (`do`) once per element of `items` (a list, usually rendered from
  `${{ … }}`: search results, associations, a list in the payload), at most `concurrency` at
  once, each iteration journaled as `<body>[i]` and reading its element as `iteration.item`. More
  than `max_items` elements fail the step before any iteration starts. The items are the
  foreach's output, and when every iteration succeeded their outputs join it as `outputs`
  and the foreach's `next` follows (shared/steps/loops.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.blocks.base import (
    BlockContext,
    BlockFailure,
    BlockResult,
    FanOut,
    flow_block,
)
from shared.workflows.expressions import ExpressionError, evaluate_condition

NO_BRANCH_TAKEN = "(none)"
MAX_DELAY = timedelta(days=366)
OUTCOME_EXPRESSION_ERROR = "EXPRESSION_ERROR"
OUTCOME_BAD_CONFIG = "BAD_CONFIG"


class BranchConfig(BaseModel):
    """A branch has no config: its edges are the step's `branches` and `otherwise`."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EndConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DelayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    seconds: float = Field(default=0, ge=0)
    minutes: float = Field(default=0, ge=0)
    hours: float = Field(default=0, ge=0)
    days: float = Field(default=0, ge=0)
    until: datetime | None = Field(
        default=None, description="RFC 3339 timestamp with a UTC offset; alternative to a duration."
    )

    @property
    def duration(self) -> timedelta:
        return timedelta(
            seconds=self.seconds, minutes=self.minutes, hours=self.hours, days=self.days
        )

    @model_validator(mode="after")
    def _one_form(self) -> DelayConfig:
        has_duration = self.duration > timedelta(0)
        if self.until is not None and has_duration:
            raise ValueError("give either `until` or a duration (seconds/minutes/hours/days)")
        if self.until is None and not has_duration:
            raise ValueError("a delay needs a positive duration or `until`")
        if self.until is not None and self.until.tzinfo is None:
            raise ValueError("`until` needs a UTC offset (e.g. 2025-01-01T09:00:00Z)")
        if self.duration > MAX_DELAY:
            raise ValueError(f"a delay can be at most {MAX_DELAY.days} days")
        return self


MAX_FOREACH_ITEMS = 1000
MAX_FOREACH_CONCURRENCY = 50


class ForeachConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    items: list[Any] = Field(description="The list to iterate over, usually a `${{ … }}`.")
    do: str = Field(min_length=1, description="The body: the step run once per item.")
    max_items: int = Field(
        ge=1,
        le=MAX_FOREACH_ITEMS,
        description=f"More items than this fail the step (required; at most {MAX_FOREACH_ITEMS}).",
    )
    concurrency: int = Field(
        default=1, ge=1, le=MAX_FOREACH_CONCURRENCY, description="Iterations in flight at once."
    )


def execute_foreach(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, ForeachConfig)
    count = len(config.items)
    if count > config.max_items:
        raise BlockFailure(
            f"{count} items, more than max_items ({config.max_items}); nothing was started",
            error_class="permanent",
            outcome_code="TOO_MANY_ITEMS",
        )
    output = {"items": config.items, "count": count, "concurrency": config.concurrency}
    node = ctx.node
    after = (node.next,) if node is not None and node.next else ()
    if count == 0:
        return BlockResult(output={**output, "outputs": []}, next_nodes=after)
    return BlockResult(
        output=output,
        next_nodes=(),
        fan_out=FanOut(body=config.do, count=count, concurrency=config.concurrency),
    )


def execute_branch(ctx: BlockContext, config: BaseModel) -> BlockResult:
    node = ctx.node
    if node is None:
        raise BlockFailure(
            "branch executed without its definition node",
            error_class="permanent",
            outcome_code=OUTCOME_BAD_CONFIG,
        )
    for index, branch in enumerate(node.branches):
        try:
            holds = evaluate_condition(branch.when, ctx.scope)
        except ExpressionError as exc:
            raise BlockFailure(
                f"branches[{index}].when: {exc}",
                error_class="permanent",
                outcome_code=OUTCOME_EXPRESSION_ERROR,
            ) from None
        if holds:
            return BlockResult(
                output={"branch": index, "next": branch.next},
                branch_choice=branch.next,
                next_nodes=(branch.next,),
            )
    if node.otherwise:
        return BlockResult(
            output={"branch": "otherwise", "next": node.otherwise},
            branch_choice=node.otherwise,
            next_nodes=(node.otherwise,),
        )
    return BlockResult(
        output={"branch": None, "next": None}, branch_choice=NO_BRANCH_TAKEN, next_nodes=()
    )


def wake_time(config: DelayConfig, now: datetime) -> datetime:
    if config.until is not None:
        if config.until - now > MAX_DELAY:
            raise ValueError(f"`until` is more than {MAX_DELAY.days} days away")
        return max(config.until, now)
    return now + config.duration


def execute_delay(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, DelayConfig)
    try:
        wake_at = wake_time(config, datetime.now(UTC))
    except ValueError as exc:
        raise BlockFailure(
            str(exc), error_class="permanent", outcome_code=OUTCOME_BAD_CONFIG
        ) from None
    return BlockResult(output={"wake_at": wake_at.isoformat()}, wake_at=wake_at)


def execute_end(ctx: BlockContext, config: BaseModel) -> BlockResult:
    return BlockResult(next_nodes=())


BRANCH = flow_block(
    "branch",
    BranchConfig,
    execute_branch,
    "Take the first branch whose condition holds, else `otherwise`, else end.",
)
DELAY = flow_block(
    "delay",
    DelayConfig,
    execute_delay,
    "Wait a duration or until a moment.",
)
END = flow_block(
    "end",
    EndConfig,
    execute_end,
    "End this path of the run.",
)
FOREACH = flow_block(
    "foreach",
    ForeachConfig,
    execute_foreach,
    "Run a body step once per item of a list, a few at a time.",
)
SPECS = (BRANCH, DELAY, END, FOREACH)
