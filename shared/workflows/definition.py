"""The workflow definition format (YAML or JSON), as pydantic models.

    name: enroll-new-lead
    tenant: acme
    trigger:
      events: [hubspot.contact.property_changed]
      rule: 'record.lifecyclestage == "lead"'      # CEL, optional
      dedup: once_per_record                        # | not_while_running | every_time
      record: event                                 # where the record identity comes from
      watch: [lifecyclestage]                       # for property-change triggers
    rate_limit: {max: 100, per: 1m}                 # optional: calls of this workflow's steps
    host_rate_limit: {max: 10, per: 1s}             # optional: per destination host
    breaker: {after_failures: 10, notify_url: https://ops.example.com/hook}   # optional
    budget: {credits: 500, per: 1d}                 # optional: a rolling cap on spend
    steps:
      - id: create_task
        type: crm.create
        config: {object_type: tasks, properties: {subject: "Call contact ${{ record.id }}"}}
        next: notify
      - id: notify
        type: http.request
        config: {url: https://example.com/hook, body: {task: "${{ steps.create_task.output.id }}"}}

A trigger is one of several kinds (shared/triggers/: one module per kind, registered in
shared/triggers/__init__.py). Besides `events`, a workflow can start on a schedule:

    trigger:
      cron: "0 9 * * MON-FRI"          # five fields, in `time_zone` (default UTC)
      time_zone: Europe/Paris
      catch_up: false                  # true: ticks missed during an outage fire on recovery

or on a POST to `/{provider}/{connection_id}/{workflow name}` of the webhook function, verified
with the connection's secret:

    trigger:
      webhook:
        idempotency_key: "${{ headers['x-idempotency-key'] }}"   # or ${{ body.event_id }}
        idempotency_ttl_seconds: 86400

or on rows of a table that are not handled yet (the processed-at pattern):

    trigger:
      poll:
        every_seconds: 300
        table: {table: acme.signups, key: id, stamp: onceflow_enrolled_at,
                where: "onceflow_enrolled_at is null and plan = 'pro'"}
        # or crm: {connection: <id>, object_type: contact, stamp: onceflow_enrolled_at,
        #          filters: [{property: lifecyclestage, operator: EQ, value: lead}]}
        stamp_policy: on_success        # | on_attempt | {after_attempts: 3}

The first step listed is the entry point. `next` names the following step (or is omitted at
the end); a `branch` step lists `branches` with CEL conditions and an `otherwise` edge. What
expressions read (`event`, `trigger`, `record`, `steps`, `run`) is shared/workflows/scope.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
)

DedupMode = Literal["once_per_record", "not_while_running", "every_time"]
STEP_ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
EVENT_TYPE_PATTERN = r"^[a-z0-9_]+(\.[a-z0-9_]+)+$"
# The provider part of an event type that means "whichever CRM sends it": `crm.contact.created`
# is `hubspot.contact.created` on a HubSpot connection, `pipedrive.contact.created` on a
# Pipedrive one (shared/providers/registry.py `event_types_for`, ANY_CRM there too).
ANY_CRM = "crm"
# Where the JSON Schema describes what expressions read (shared/publishing/schema.py).
SCOPE_REF = "#/$defs/ExpressionScope"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Trigger fields added after versions were first stored: left out of the canonical form while
# unset, so a definition that doesn't use them hashes exactly as it did before they existed
# (publishing it again still finds the version already stored).
OPTIONAL_TRIGGER_FIELDS = (
    "cron",
    "time_zone",
    "catch_up",
    "webhook",
    "poll",
    "debounce",
    "throttle",
    "batch",
)


DURATION_PATTERN = r"^[1-9][0-9]{0,6}(s|m|h|d)$"
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def duration_seconds(text: str) -> int:
    """`30s`, `1m`, `2h`, `1d` as seconds (the pattern above has been checked)."""
    return int(text[:-1]) * _UNIT_SECONDS[text[-1]]


# A debounce without max_wait waits at most this many periods after its burst's first event.
DEBOUNCE_MAX_WAIT_FACTOR = 10
DEBOUNCE_MAX_PERIOD_SECONDS = 3600
DEBOUNCE_MAX_WAIT_SECONDS = 86_400


class PollTable(_Strict):
    table: str = Field(
        description="schema.table in the onceflow database, the schema named after the "
        "tenant: e.g. acme.signups."
    )
    key: str = Field(description="The column naming a row (unique): the record's identity.")
    stamp: str = Field(description="The column that is null while a row is not handled yet.")
    where: str = Field(
        description="`<stamp> is null and …`: simple comparisons joined by `and`; an index "
        "must answer it (activation refuses the source otherwise and shows the index to add)."
    )


class AfterAttempts(_Strict):
    after_attempts: int = Field(
        ge=1, le=100, description="Stamp after the run succeeded, or after this many attempts."
    )


class CrmFilter(_Strict):
    property: str
    operator: str = Field(default="EQ", description="EQ, NEQ, GT, GTE, LT, LTE, HAS_PROPERTY, …")
    value: str | int | float | bool | None = None


class PollCrm(_Strict):
    connection: str = Field(description="The id of the tenant's CRM connection to search.")
    object_type: str = Field(description="contact, company or deal.")
    filters: list[CrmFilter] = Field(
        default_factory=list, description="What else a record must match (all of them)."
    )
    stamp: str = Field(
        description="The property that has no value while a record is not handled yet; "
        "onceflow writes the time it handled the record into it."
    )


class PollTrigger(_Strict):
    every_seconds: int = Field(description="How often to look for rows not handled yet (≥ 60).")
    table: PollTable | None = Field(default=None, description="A SQL table source.")
    crm: PollCrm | None = Field(default=None, description="A CRM search source.")
    stamp_policy: Literal["on_success", "on_attempt"] | AfterAttempts = Field(
        description="When a row is stamped as handled: when its run succeeded (a failure is "
        "tried again next pass, forever), when its run is started (a failure is never retried), "
        "or after success or N attempts. Declared, never implicit."
    )
    batch: int = Field(default=1000, ge=1, le=10000, description="Rows read per page.")


class WebhookTrigger(_Strict):
    idempotency_key: str | None = Field(
        default=None,
        description="`${{ … }}` over `headers` (lower-case names) and `body` (parsed JSON) "
        "naming the occurrence; a POST whose key was seen within the TTL starts nothing and is "
        "answered with the first POST's event id. Without it every accepted POST is a new "
        "occurrence (at-least-once).",
    )
    idempotency_ttl_seconds: int = Field(
        default=86400,
        ge=60,
        le=30 * 86400,
        description="How long a key keeps answering duplicates (60 s to 30 days).",
    )


class Debounce(_Strict):
    """`debounce: {period, max_wait, key}`: events for one key within `period` of each other
    form one burst, which starts one run (shared/admission/debounce.py)."""

    period: str = Field(
        pattern=DURATION_PATTERN,
        description="Quiet time that ends a burst: the run starts this long after the burst's "
        "last event (`5s`, `1m`, at most `1h`).",
    )
    max_wait: str | None = Field(
        default=None,
        pattern=DURATION_PATTERN,
        description="The longest a burst waits after its first event, however busy it stays "
        f"(at least `period`, at most `1d`); {DEBOUNCE_MAX_WAIT_FACTOR} times period if omitted.",
    )
    key: str | None = Field(
        default=None,
        description="CEL over `event`, `trigger` and `record` naming what a burst is about "
        f"({SCOPE_REF}); the trigger's record if omitted.",
    )

    @property
    def period_seconds(self) -> int:
        return duration_seconds(self.period)

    @property
    def max_wait_seconds(self) -> int:
        if self.max_wait is None:
            return self.period_seconds * DEBOUNCE_MAX_WAIT_FACTOR
        return duration_seconds(self.max_wait)


BATCH_MAX_SIZE = 10_000


class Batch(_Strict):
    """`batch: {max_size, max_wait, key}`: up to `max_size` events (per key) start one run,
    fired when full or `max_wait` after the batch's first event (shared/admission/debounce.py:
    a batch is a gathering like a debounce burst, with another close rule)."""

    max_size: int = Field(
        ge=2, le=BATCH_MAX_SIZE, description=f"Events per run: 2 to {BATCH_MAX_SIZE}."
    )
    max_wait: str = Field(
        pattern=DURATION_PATTERN,
        description="The longest a batch waits after its first event before its run starts "
        "with what it has (`30s`, `5m`, at most `1d`).",
    )
    key: str | None = Field(
        default=None,
        description="CEL over `event`, `trigger` and `record` naming what is batched together "
        f"({SCOPE_REF}); one batch for the whole workflow if omitted.",
    )

    @property
    def max_wait_seconds(self) -> int:
        return duration_seconds(self.max_wait)


CONCURRENCY_MAX_LIMIT = 10_000


class Concurrency(_Strict):
    """`concurrency: {key, limit}`: at most `limit` runs of the workflow running at once per
    key; the runs over it wait, in admission order, and start when a run of the key ends
    (shared/admission/concurrency.py)."""

    key: str = Field(
        min_length=1,
        description="CEL over `event`, `trigger` and `record` naming what shares the limit "
        f"({SCOPE_REF}), e.g. `record.company_id` or `record.hubspot_owner_id`.",
    )
    limit: int = Field(gt=0, le=CONCURRENCY_MAX_LIMIT, description="Running runs at most, per key.")


class RunThrottle(_Strict):
    """`throttle: {limit, period, key}`: at most `limit` runs started per window per key; the
    events over it wait in order (shared/admission/run_throttle.py)."""

    limit: int = Field(gt=0, le=100_000, description="Runs started per window.")
    period: str = Field(
        pattern=DURATION_PATTERN, description="The fixed window: `30s`, `1m`, `1h`, at most `1d`."
    )
    key: str | None = Field(
        default=None,
        description="CEL over `event`, `trigger` and `record` naming what shares a limit "
        f"({SCOPE_REF}); the whole workflow if omitted.",
    )

    @property
    def window_seconds(self) -> int:
        return duration_seconds(self.period)


class Trigger(_Strict):
    events: list[str] = Field(
        default_factory=list,
        description="Event types that start this workflow (for an event trigger).",
    )
    cron: str | None = Field(
        default=None,
        description="Five-field cron schedule (minute hour day month weekday), e.g. "
        "`0 9 * * MON-FRI`; each tick starts the workflow once.",
    )
    time_zone: str | None = Field(
        default=None,
        description="IANA time zone the cron schedule is read in, e.g. Europe/Paris; UTC if "
        "omitted.",
    )
    webhook: WebhookTrigger | None = Field(
        default=None,
        description="Start on a POST to the webhook function addressed to this workflow.",
    )
    poll: PollTrigger | None = Field(
        default=None, description="Start once per row of a table that is not handled yet."
    )
    catch_up: bool | None = Field(
        default=None,
        description="Cron only: fire ticks missed while nothing ran (newest 100, oldest first) "
        "instead of recording them as missed. Off if omitted.",
    )
    rule: str | None = Field(
        default=None,
        description="CEL condition over the expression scope's `event`, `trigger` and `record` "
        f"({SCOPE_REF}); empty means always.",
    )
    dedup: DedupMode = "once_per_record"
    record: str = Field(
        default="event",
        description="Where the record identity comes from: `event` (the event's own record) "
        "or a CEL expression over `event`, `trigger` and `record` yielding an object id or "
        f"{{id, object_type}} ({SCOPE_REF}).",
    )
    watch: list[str] = Field(
        default_factory=list, description="Fields whose change fires a property-change trigger."
    )
    throttle: RunThrottle | None = Field(
        default=None,
        description="Start at most `limit` runs per `period` (per `key`, or for the whole "
        "workflow); the events over it are not refused: they wait, in order, and start when a "
        "later window has room.",
    )
    debounce: Debounce | None = Field(
        default=None,
        description="Fold a burst of events for one record (or `key`) into one run: the run "
        "starts `period` after the burst's last event, or `max_wait` after its first, with the "
        "last event as `event` and the burst's events in `event.burst`; the others are refused "
        "`superseded`, naming the run.",
    )
    batch: Batch | None = Field(
        default=None,
        description="Gather up to `max_size` events (per `key`, or for the whole workflow) into "
        "one run, started when the batch is full or `max_wait` after its first event: the run's "
        "`event` is the batch's last, and `event.batch` lists every event of it, oldest first; "
        "the others are refused `batched`, naming the run. Needs `dedup: every_time`.",
    )

    @model_serializer(mode="wrap")
    def _canonical(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in OPTIONAL_TRIGGER_FIELDS:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class RateLimit(_Strict):
    max: int = Field(gt=0, le=1_000_000, description="Calls admitted per window.")
    per: str = Field(
        pattern=DURATION_PATTERN, description="Window length: `30s`, `1m`, `1h` or `1d`."
    )

    @property
    def window_seconds(self) -> int:
        return duration_seconds(self.per)


DEFAULT_BREAKER_AFTER_FAILURES = 10


class Breaker(_Strict):
    after_failures: int = Field(
        default=DEFAULT_BREAKER_AFTER_FAILURES,
        ge=0,
        le=100_000,
        description="Consecutive failed runs that pause the workflow (its events are then "
        "refused `workflow_paused` until resumed); 0 turns the breaker off.",
    )
    notify_url: str | None = Field(
        default=None,
        max_length=2048,
        description="Optional https URL that gets a JSON POST when the breaker trips (sent "
        "through the same SSRF guard as http.request).",
    )


class Budget(_Strict):
    credits: int = Field(
        gt=0,
        le=1_000_000_000,
        description="The most credits this workflow's steps may reserve and spend per window.",
    )
    per: str = Field(
        pattern=DURATION_PATTERN,
        description="The rolling window: `30s`, `1m`, `1h` or `1d` (e.g. `1d`: the last 24 h).",
    )

    @property
    def window_seconds(self) -> int:
        return duration_seconds(self.per)


class Branch(_Strict):
    when: str = Field(
        description=f"CEL condition over the expression scope ({SCOPE_REF}); the first branch "
        "whose condition holds wins."
    )
    next: str


# Config keys whose `{goto: <step>}` is an edge of the graph (wait_for, approval).
JUMP_KEYS = ("on_timeout", "on_reject")
# Config keys that hold a CEL condition evaluated by the block itself, not a `${{ … }}`
# template: validation compiles them and checks the steps they read.
CONDITION_KEYS: dict[str, tuple[str, ...]] = {"wait_for": ("when",)}


class Compensation(_Strict):
    """`compensate: {type, config}` on a step: the block that undoes what the step did (delete
    the task it created, post a correction), run when the run fails after the step succeeded
    (shared/steps/saga.py). Its config reads the step's output as `steps.<id>.output`."""

    type: str = Field(description="Block type of the undo, e.g. crm.update, http.request.")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The undo block's config; a value may be a `${{ … }}` template over the "
        f"expression scope ({SCOPE_REF}), `steps.<this step>.output` included.",
    )


# Step fields added after versions were first stored: left out of the canonical form while
# unset, so a definition that doesn't use them hashes exactly as it did before (as the
# trigger's OPTIONAL_TRIGGER_FIELDS).
OPTIONAL_STEP_FIELDS = ("compensate",)


class Step(_Strict):
    id: str = Field(pattern=STEP_ID_PATTERN)
    type: str = Field(description="Block type, e.g. crm.create, http.request, branch, delay, end.")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The block's config; a value may be a `${{ … }}` template over the "
        f"expression scope ({SCOPE_REF}).",
    )
    next: str | None = None
    branches: list[Branch] = Field(default_factory=list)
    otherwise: str | None = None
    compensate: Compensation | None = Field(
        default=None,
        description="What undoes this step when its run fails after it succeeded: run once, "
        "in reverse order of the steps that succeeded, each under its own idempotency key.",
    )

    @model_serializer(mode="wrap")
    def _canonical(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in OPTIONAL_STEP_FIELDS:
            if data.get(name) is None:
                data.pop(name, None)
        return data

    def compensation(self) -> Step | None:
        """The undo as a node the engine runs: this step's id (its journal key is
        `compensate:<id>`, shared/steps/journal.py), the undo's block and config, no edges."""
        if self.compensate is None:
            return None
        return Step(id=self.id, type=self.compensate.type, config=self.compensate.config)

    def successors(self) -> list[str]:
        """Every node this step can lead to, in declaration order: its branches, `otherwise`,
        `next`, and the jumps a wait's config declares (`on_timeout: {goto: …}`,
        `on_reject: {goto: …}`)."""
        out = [b.next for b in self.branches]
        if self.otherwise:
            out.append(self.otherwise)
        if self.next:
            out.append(self.next)
        out += [j for j in self.jumps() if j not in out]
        return out

    def jumps(self) -> list[str]:
        """The `goto` targets in this step's config (`on_timeout`, `on_reject`), and a
        foreach's body (`do`)."""
        found: list[str] = []
        body = self.config.get("do") if self.type == "foreach" else None
        if isinstance(body, str):
            found.append(body)
        for key in JUMP_KEYS:
            value = self.config.get(key)
            if isinstance(value, dict) and isinstance(value.get("goto"), str):
                found.append(value["goto"])
        return found


class CancelOn(_Strict):
    event: str = Field(
        pattern=EVENT_TYPE_PATTERN, description="The trigger event type that cancels the run."
    )
    when: str = Field(
        default="true",
        description=f"CEL condition over the event as a trigger rule reads it ({SCOPE_REF}: "
        "`event`, `trigger`, `record`).",
    )


class WorkflowDefinition(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,99}$")
    tenant: str
    description: str | None = None
    trigger: Trigger
    steps: list[Step] = Field(min_length=1)
    rate_limit: RateLimit | None = Field(
        default=None,
        description="At most `max` side-effecting steps of this workflow per window, across "
        "all its runs and instances; a step over the limit waits for the next window without "
        "using an attempt.",
    )
    host_rate_limit: RateLimit | None = Field(
        default=None,
        description="At most `max` http.request calls per window to one destination host "
        "(counted per tenant and host, whichever workflow makes them).",
    )
    budget: Budget | None = Field(
        default=None,
        description="A spend cap: each priced step reserves its price before its request leaves; "
        "a step that would go over fails BUDGET_EXCEEDED and sends nothing.",
    )
    breaker: Breaker | None = Field(
        default=None,
        description="The circuit breaker; omitted means the defaults (pause after "
        f"{DEFAULT_BREAKER_AFTER_FAILURES} consecutive failed runs, no notify URL).",
    )
    cancel_on: list[CancelOn] | None = Field(
        default=None,
        min_length=1,
        description="Events that cancel a running run about the same record (the first that "
        "matches; `cancelled_by: event <id>`). A step in flight finishes; nothing starts after.",
    )
    goal: str | None = Field(
        default=None,
        min_length=1,
        description="CEL condition over an admitted event about the run's record, as a trigger "
        "rule reads it (`event`, `trigger`, `record`): the first time it holds, the run ends "
        "`goal_met`. A step in flight finishes; nothing starts after.",
    )

    concurrency: Concurrency | None = Field(
        default=None,
        description="At most `limit` runs running at once per `key` (beyond the trigger's "
        "`dedup`): a run over it is not refused, it waits, in admission order, and starts "
        "when a run of its key ends.",
    )
    priority: str | None = Field(
        default=None,
        min_length=1,
        description="CEL number over the rule scope (`event`, `trigger`, `record`), evaluated "
        "when the run is admitted and clamped to -10..10 (default 0): where steps wait in line "
        "for a limit (connection, workflow or host), a higher priority's step is granted "
        "first. A failure or a non-number is 0; it never refuses a run.",
    )

    # `finally` is a Python keyword: the field is `finally_`, read and written as `finally`.
    finally_: list[Step] | None = Field(
        default=None,
        alias="finally",
        min_length=1,
        description="Steps run once whatever the run's end — succeeded, failed (after its "
        "compensations) or cancelled — the first one first, chained by `next` among "
        "themselves (waits allowed). The run then ends as its main phase decided, or failed "
        "when a finally step failed.",
    )

    @model_serializer(mode="wrap")
    def _canonical(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        # Added after versions were first stored: left out while unset, so a definition that
        # doesn't use it hashes as it did before (as OPTIONAL_TRIGGER_FIELDS).
        data: dict[str, Any] = handler(self)
        for late in ("concurrency", "priority"):
            if data.get(late) is None:
                data.pop(late, None)
        # `finally` is written under its own name (the field is `finally_`), only when set.
        final = data.pop("finally_", data.pop("finally", None))
        if final is not None:
            data["finally"] = final
        return data

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    def final_step(self, step_id: str) -> Step:
        """A step of the `finally:` list (shared/steps/finale.py) by its id."""
        for s in self.finally_ or ():
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    @property
    def entry(self) -> Step:
        return self.steps[0]
