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
  Quorum: `required: N` approving votes of different approvers approve it; a reject by any
  one rejects it unless `reject_quorum: M` asks for M. Each approver counts once (a second
  click changes nothing); a vote after it closed is recorded as late, never a second resume.
  Delivery (`channels`): `slack: {channel: C…}` posts it with Approve/Reject buttons (the
  click comes back verified, shared/ops/slack_interactions.py); `email: true` mails each named
  user a signed link. `remind_after` nudges those who have not voted, once; `escalate_after`
  lets `escalate_to` (a role, users) decide too, and asks them, once.

A rehearsal never waits: the step answers what it would have waited for and goes on.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from shared.blocks.base import (
    AwaitedEvent,
    BlockContext,
    BlockFailure,
    BlockResult,
    ParkRequest,
    flow_block,
)
from shared.providers import kinds, registry
from shared.workflows.expressions import ExpressionError, compile_expression, evaluate
from shared.workflows.scope import kept_for_wait

MAX_WAIT = timedelta(days=366)
MAX_LOOKBACK = timedelta(days=7)
OUTCOME_BAD_CONFIG = "BAD_CONFIG"
OUTCOME_NO_RECORD = "NO_RECORD"
OUTCOME_NO_CORRELATION = "NO_CORRELATION"
# The most events one wait awaits (each is a key in the park's index entry).
MAX_AWAITED = 10


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


class Correlate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    event: str = Field(
        min_length=1,
        description="CEL over the incoming event (`event`, `trigger`, `record`): the value that "
        "must equal `run`'s, e.g. `trigger.dealId`.",
    )
    run: str = Field(
        min_length=1,
        description="CEL over the waiting run (`record`, `steps`, `run`, `event`, `trigger`), "
        "evaluated once when the wait parks, e.g. `steps.create_deal.output.id`.",
    )


class AwaitedEventConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    event: str = Field(min_length=1, description="The trigger event type to wait for.")
    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$",
        description="Its name in the step's output (default: the event type).",
    )
    when: str = Field(
        default="true", description="CEL condition over the incoming event, as for one event."
    )
    watch: list[str] = Field(
        default_factory=list, description="For a *.property_changed event: the fields to hear."
    )
    correlate: Correlate | None = Field(
        default=None, description="This event's own correlation (default: the wait's)."
    )

    @property
    def label(self) -> str:
        return self.name or self.event


class WaitForConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    event: str | None = Field(
        default=None,
        min_length=1,
        description="The trigger event type to wait for (or `events`, for several).",
    )
    events: list[AwaitedEventConfig] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_AWAITED,
        description="Several events, each with its own `when`: `mode: any` resumes on the first "
        "that matches (the output's `matched` says which), `mode: all` once each has matched "
        "(the output's `events` holds them by name). One deadline for all.",
    )
    mode: Literal["any", "all"] = Field(
        default="any", description="With `events`: `any` (default) or `all`."
    )
    correlate: Correlate | None = Field(
        default=None,
        description="Correlate beyond the run's record: the incoming event's `event` expression "
        "must equal the run's `run` expression (evaluated when the wait parks). Default: the "
        "event is about the run's own record.",
    )
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
        if (self.event is None) == (self.events is None):
            raise ValueError("name the event to wait for: `event`, or `events` for several")
        if self.events is not None:
            if self.when != "true" or self.watch:
                raise ValueError("with `events`, each event has its own `when` and `watch`")
            labels = [e.label for e in self.events]
            twice = sorted({x for x in labels if labels.count(x) > 1})
            if twice:
                raise ValueError(f"{twice[0]!r} is awaited twice: give each a distinct `name`")
        elif self.mode != "any":
            raise ValueError("`mode` applies to `events` (several events)")
        return self

    def awaited(self) -> list[AwaitedEventConfig]:
        """The awaited events: `events`, or the one `event` with the wait's `when`."""
        if self.events is not None:
            return list(self.events)
        assert self.event is not None
        return [AwaitedEventConfig(event=self.event, when=self.when, watch=self.watch)]

    @property
    def single_form(self) -> bool:
        """One event on the run's own record: the first release's park (event_type,
        record_key, condition), unchanged."""
        return self.events is None and self.correlate is None


def correlation_text(value: Any) -> str:
    """A correlation value as the text both sides are compared as, so the run's `42` and the
    event's `"42"` correlate (vendors send ids as numbers in one place and strings in another);
    anything else structured compares as its canonical JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def await_key(tenant_id: str, event_type: str, on: str, value: str) -> str:
    """The one encoding of "an event of this type whose `on` gives `value`" in a tenant: the
    park keeps one per awaited event (indexed), and admission computes them for each event.
    The expression and a long value enter as digests, so a key stays a small index entry."""
    expression = "record" if on == "" else hashlib.sha256(on.encode()).hexdigest()[:24]
    if len(value) > 200:
        value = "sha256:" + hashlib.sha256(value.encode()).hexdigest()
    return "\x1f".join((tenant_id, event_type, expression, value))


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


def _run_side(ctx: BlockContext, correlate: Correlate) -> str:
    """The run's side of a correlation, evaluated when the wait parks (and kept with it)."""
    try:
        value = evaluate(correlate.run, ctx.scope)
    except ExpressionError as exc:
        raise BlockFailure(
            f"correlate.run: {exc}", error_class="permanent", outcome_code=OUTCOME_NO_CORRELATION
        ) from None
    if value is None or value == "":
        raise BlockFailure(
            f"correlate.run ({correlate.run}) gave nothing to correlate on",
            error_class="permanent",
            outcome_code=OUTCOME_NO_CORRELATION,
        )
    return correlation_text(value)


def _awaits(ctx: BlockContext, config: WaitForConfig) -> tuple[AwaitedEvent, ...]:
    out: list[AwaitedEvent] = []
    provider = kinds.provider_of(ctx.db, ctx.connection_id)
    for awaited in config.awaited():
        correlate = awaited.correlate or config.correlate
        on, value = (
            ("", _run_record_key(ctx))
            if correlate is None
            else (
                correlate.event,
                _run_side(ctx, correlate),
            )
        )
        # A wait on any CRM's event waits for the one the run's connection sends.
        event_type = registry.event_type_on(provider, awaited.event)
        out.append(AwaitedEvent(awaited.label, event_type, awaited.when, on, value))
    return tuple(out)


def _compile_conditions(config: WaitForConfig) -> None:
    # Validation said so already; a hand-made row may not.
    sources = [("when", a.when) for a in config.awaited()]
    for a in config.awaited():
        correlate = a.correlate or config.correlate
        if correlate is not None:
            sources += [("correlate.event", correlate.event), ("correlate.run", correlate.run)]
    for where, source in sources:
        try:
            compile_expression(source)
        except ExpressionError as exc:
            raise BlockFailure(
                f"{where}: {exc}", error_class="permanent", outcome_code=OUTCOME_BAD_CONFIG
            ) from None


def execute_wait_for(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, WaitForConfig)
    _compile_conditions(config)
    if not config.single_form:
        return _park_on_awaits(ctx, config)
    assert config.event is not None
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
            event_type=registry.event_type_on(
                kinds.provider_of(ctx.db, ctx.connection_id), config.event
            ),
            record_key=key,
            condition=config.when,
            scope=kept_for_wait(ctx.scope),
            lookback_seconds=(
                0.0 if config.lookback is None else config.lookback.value.total_seconds()
            ),
        ),
    )


def _park_on_awaits(ctx: BlockContext, config: WaitForConfig) -> BlockResult:
    """Several events, or a correlation beyond the record: the park names each awaited event
    with its correlation value, computed here, on the run's side, once."""
    awaits = _awaits(ctx, config)
    deadline = datetime.now(UTC) + config.timeout.value
    waiting: dict[str, Any] = {
        "waiting_for": [a.event_type for a in awaits],
        "mode": config.mode,
        "correlation": {a.name: a.value for a in awaits},
    }
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
            scope=kept_for_wait(ctx.scope),
            lookback_seconds=(
                0.0 if config.lookback is None else config.lookback.value.total_seconds()
            ),
            mode=config.mode,
            awaits=awaits,
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


class SlackChannel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    channel: str = Field(
        pattern=r"^[A-Z0-9]{2,40}$",
        description="The Slack channel id (C…) the approval is posted to, with its buttons.",
    )


class Channels(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    slack: SlackChannel | None = Field(
        default=None, description="Post it to a Slack channel (the tenant's Slack app)."
    )
    email: bool = Field(
        default=False,
        description="Mail each named user (their mapped address) a signed link to decide.",
    )


MAX_QUORUM = 50


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
    # Declared after `approvers` and `expires_in`: their checks read those (each error then
    # points at the field it is about, with its line and column).
    required: int = Field(
        default=1,
        ge=1,
        le=MAX_QUORUM,
        description="How many different approvers must approve (default 1: the first decides).",
    )
    reject_quorum: int = Field(
        default=1,
        ge=1,
        le=MAX_QUORUM,
        description="How many rejections reject it (default 1: a reject by any one ends it).",
    )
    channels: Channels = Field(
        default_factory=Channels, description="Where the approvers are asked: Slack, email."
    )
    remind_after: Duration | None = Field(
        default=None, description="Remind those who have not decided yet, once, after this long."
    )
    escalate_after: Duration | None = Field(
        default=None, description="After this long undecided, `escalate_to` may decide too."
    )
    escalate_to: Approvers | None = Field(
        default=None,
        validate_default=True,
        description="Who is added (and asked) at `escalate_after`.",
    )

    @field_validator("required")
    @classmethod
    def _reachable(cls, required: int, info: ValidationInfo) -> int:
        approvers = info.data.get("approvers")
        if isinstance(approvers, Approvers) and approvers.role is None:
            named = len(set(approvers.users))
            if required > named:
                raise ValueError(
                    f"required is {required} but only {named} users are named (and no role):"
                    " the approval could never be approved"
                )
        return required

    @field_validator("remind_after", "escalate_after")
    @classmethod
    def _before_expiry(cls, after: Duration | None, info: ValidationInfo) -> Duration | None:
        expires_in = info.data.get("expires_in")
        within = (
            after is None
            or not isinstance(expires_in, Duration)
            or timedelta(0) < after.value < expires_in.value
        )
        if not within:
            raise ValueError(f"{info.field_name} must be positive and shorter than expires_in")
        return after

    @field_validator("escalate_to")
    @classmethod
    def _escalation_pair(cls, to: Approvers | None, info: ValidationInfo) -> Approvers | None:
        if info.data.get("escalate_after") is None and to is not None:
            raise ValueError("escalate_to needs escalate_after: when to escalate")
        if info.data.get("escalate_after") is not None and to is None:
            raise ValueError("escalate_after needs escalate_to: a role or users to escalate to")
        return to

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
    now = deadline - config.expires_in.value
    escalate = config.escalate_to
    return BlockResult(
        output={**output, "expires_at": deadline.isoformat()},
        park=ParkRequest(
            kind="approval",
            deadline=deadline,
            on_timeout=config.on_timeout,
            approver_role=config.approvers.role,
            approver_users=tuple(config.approvers.users),
            summary=config.summary,
            required=config.required,
            reject_quorum=config.reject_quorum,
            slack_channel=None if config.channels.slack is None else config.channels.slack.channel,
            email=config.channels.email,
            remind_at=None if config.remind_after is None else now + config.remind_after.value,
            escalate_at=(
                None if config.escalate_after is None else now + config.escalate_after.value
            ),
            escalate_role=None if escalate is None else escalate.role,
            escalate_users=() if escalate is None else tuple(escalate.users),
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
