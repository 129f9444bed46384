"""The ops API's edge: pydantic models that validate requests and describe responses.

`/openapi.json` is generated from these same classes (shared/ops/openapi.py), so the document
can't drift from what the handlers accept. Every request model forbids unknown fields and
refuses NUL characters (Postgres can't store them in text; they are bad input, not a 500).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from shared.admission.admit import Reason
from shared.admission.redecide import Redecidable
from shared.providers import registry
from shared.workflows.definition import EVENT_TYPE_PATTERN


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
RunStatus = Literal["running", "succeeded", "failed", "cancelled", "goal_met"]
StepStatus = Literal[
    "pending",
    "running",
    "waiting_for_delay",
    "waiting_for_retry",
    "waiting_for_event",
    "waiting_for_approval",
    "succeeded",
    "skipped",
    "failed",
]
# Values the registry lists (shared/providers/registry.py), as the closed sets the API
# validates and documents: a provider's name, and what search read a query as (a record key, a
# provider's record page `<provider>_url`, an email, an object id). mypy sees plain strings.
if TYPE_CHECKING:
    ProviderName = str
    SearchKind = str
else:
    ProviderName = Literal[registry.PROVIDERS]
    SearchKind = Literal[
        (
            "record_key",
            *(registry.record_url_kind(p) for p in registry.record_page_providers()),
            "email",
            "object_id",
        )
    ]

# The refusal reasons, written once (shared/admission/admit.py) and imported.
RefusalReason = Reason
RECORD_KEY_DESCRIPTION = "`<connection id>:<object type>:<object id>`, as runs record it."


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


# ---- errors -------------------------------------------------------------------------------


class FieldProblem(_Response):
    location: str = Field(description="Where: `body.source`, `query.limit`, ...")
    problem: str


class ErrorBody(_Response):
    code: str = Field(description="Stable, machine-readable: `not_found`, `invalid_body`, ...")
    message: str = Field(description="For people.")
    problems: list[FieldProblem] = Field(default_factory=list)


# ---- queries ------------------------------------------------------------------------------


class PageQuery(_Request):
    cursor: Text | None = Field(
        default=None, max_length=200, description="`next_cursor` of the previous page."
    )
    limit: int = Field(default=50, ge=1, le=200)


class RunsQuery(PageQuery):
    workflow_id: UUID | None = None
    status: RunStatus | None = Field(
        default=None, description="`failed` lists the dead letters: runs that need a person."
    )
    record_key: Text | None = Field(
        default=None, max_length=500, description=RECORD_KEY_DESCRIPTION
    )
    created_after: AwareDatetime | None = Field(default=None, description="Inclusive.")
    created_before: AwareDatetime | None = Field(default=None, description="Exclusive.")
    event_type: Text | None = Field(
        default=None,
        max_length=200,
        pattern=EVENT_TYPE_PATTERN,
        description="Runs started by a trigger event of this type (`hubspot.contact.created`).",
    )


class RefusalsQuery(PageQuery):
    workflow_id: UUID | None = None
    record_key: Text | None = Field(
        default=None, max_length=500, description=RECORD_KEY_DESCRIPTION
    )
    event_id: int | None = Field(default=None, ge=1, le=2**63 - 1)


class StuckInboxQuery(_Request):
    connection_id: UUID | None = None
    limit: int = Field(default=50, ge=1, le=200)


class TicksQuery(_Request):
    status: Literal["fired", "missed"] | None = Field(
        default=None, description="`missed`: ticks that passed while nothing ran."
    )
    limit: int = Field(default=50, ge=1, le=200)


class RecordQuery(_Request):
    record_key: Text = Field(min_length=5, max_length=500, description=RECORD_KEY_DESCRIPTION)


class WouldRunQuery(_Request):
    workflow_id: UUID
    record_key: Text = Field(min_length=5, max_length=500, description=RECORD_KEY_DESCRIPTION)
    event_type: Text | None = Field(
        default=None,
        max_length=200,
        pattern=EVENT_TYPE_PATTERN,
        description="One of the workflow's bound event types (default: the one of the "
        "record's kind, a property change when the trigger watches fields).",
    )


# ---- bodies -------------------------------------------------------------------------------


class ReplayRequest(_Request):
    reason: Text | None = Field(
        default=None, max_length=500, description="Why, for the audit trail."
    )
    from_step: Text | None = Field(
        default=None,
        max_length=200,
        description="The step key to replay from (a step the run reached); steps before it"
        " are kept, never run again. Default: the first failure. A run that succeeded may be"
        " replayed from a chosen step.",
    )
    on_version: Literal["run", "current"] = Field(
        default="run",
        description="Replay on the run's own version, or on the workflow's current one"
        " (refused, naming the step, when a step the replay keeps or starts is not in it).",
    )
    input: dict[str, Any] | None = Field(
        default=None,
        description="An edited input (the block's config object) for `from_step`; who and"
        " what are kept on the new step and in the audit trail.",
    )
    fresh_ai_answers: bool = Field(
        default=False,
        description="The `ai.generate` steps the replay runs again ask the model afresh instead"
        " of reusing the answers journaled in the lineage (still charged once per lineage).",
    )


class CancelRequest(_Request):
    reason: Text = Field(
        min_length=1, max_length=500, description="Why, kept on the run and in the audit trail."
    )


class DecisionRequest(_Request):
    comment: Text | None = Field(
        default=None, max_length=2000, description="Why, kept with the decision and audited."
    )


class LinkRequest(_Request):
    user: Text = Field(
        min_length=1, max_length=200, description="One of the users the approval names."
    )


class RetryRequest(_Request):
    reason: Text | None = Field(
        default=None, max_length=500, description="What was fixed, for the audit trail."
    )


class WorkflowSource(_Request):
    source: Text = Field(
        min_length=1, max_length=65536, description="The definition, YAML or JSON."
    )


class ActivateRequest(_Request):
    version_id: UUID


class DeactivateRequest(_Request):
    reason: Text | None = Field(default=None, max_length=500)


class SuppliedEvent(_Request):
    event_type: Text = Field(pattern=EVENT_TYPE_PATTERN, max_length=200)
    record_object_type: Text | None = Field(default=None, max_length=100)
    record_object_id: Text | None = Field(default=None, max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)


class RehearsalRequest(_Request):
    workflow_id: UUID
    version_id: UUID | None = Field(default=None, description="Defaults to the active version.")
    event_id: int | None = Field(
        default=None, ge=1, le=2**63 - 1, description="A stored trigger event to rehearse against."
    )
    event: SuppliedEvent | None = Field(default=None, description="Or an event supplied here.")


# ---- responses ----------------------------------------------------------------------------


class RunSummary(_Response):
    id: UUID
    tenant_id: str
    workflow_id: UUID
    workflow_name: str
    version_id: UUID
    start_key: str
    event_id: int | None
    record_key: str | None
    record_label: str | None = Field(
        default=None,
        description="What people call the record (name and email, from onceflow's own CRM"
        " reads and writes); null while unknown.",
    )
    status: RunStatus
    error: str | None
    replay_of: UUID | None
    lineage_root: UUID
    created_at: datetime
    finished_at: datetime | None
    cancelled_by: str | None = Field(default=None, description="Who cancelled the run.")
    cancel_reason: str | None = Field(default=None, description="Why it was cancelled.")


class RunPage(_Response):
    items: list[RunSummary]
    next_cursor: str | None


class LeaseView(_Response):
    """One claim of a step: an attempt, and how its lease ended."""

    attempt: int = Field(
        description="The step's attempt number under this lease. It can repeat: an ops retry "
        "starts the count again, and a throttled attempt gives its number back."
    )
    lease_id: UUID
    claimed_at: datetime
    end_kind: Literal["settled", "reclaimed"] | None = Field(
        description="`settled` by its holder, or `reclaimed` by the sweep after it expired "
        "(its holder, if still alive, found the lease gone). Null while the lease is held."
    )
    end_status: StepStatus | None = Field(description="The status the ending moved the step to.")
    outcome_code: str | None
    error_class: Literal["transient", "permanent"] | None
    error: str | None = Field(description="This attempt's error; the step keeps only the last.")
    ended_at: datetime | None


class AwaitedView(_Response):
    """One event a wait of several (or a correlated wait) waits for."""

    name: str = Field(description="Its name in the step's output.")
    event_type: str
    condition: str
    on: str = Field(description="The correlation over the incoming event ('' = its record).")
    value: str = Field(description="What `on` must equal, computed when the wait parked.")


class VoteView(_Response):
    """One approver's vote on an approval (approval_votes)."""

    voter: str
    decision: Literal["approved", "rejected"]
    via: Literal["ops", "link", "slack", "email"]
    counted: bool = Field(description="False: it came after the approval closed.")
    at: datetime


class MessageView(_Response):
    """One message the sweep sends for an approval (approval_messages)."""

    channel: Literal["slack", "email"]
    purpose: Literal["ask", "remind", "escalate"]
    recipient: str = Field(description="A Slack channel, or the onceflow user mailed.")
    state: Literal["queued", "sent", "failed"] = Field(
        description="queued: due (again, after `attempts` failed ones); failed: the sweep gave"
        " up after its last attempt, `last_error` says why."
    )
    attempts: int
    last_error: str | None
    sent_at: datetime | None
    next_attempt_at: datetime | None
    update_pending: bool = Field(
        description="A vote or the decision is still to be shown in the posted message."
    )


class WaitView(_Response):
    """What a parked step waits (or waited) for: its park row (shared/steps/parks.py)."""

    id: int = Field(description="The park row; for an approval, the approval id.")
    kind: Literal["event", "approval"]
    until: datetime = Field(description="The deadline.")
    on_timeout: str
    timeout_goto: str | None
    event_type: str | None
    record_key: str | None
    condition: str | None
    summary: str | None
    approver_role: str | None
    approver_users: list[str]
    resumed_at: datetime | None
    resumed_by: Literal["event", "decision", "deadline", "cancel", "goal"] | None
    resumed_event_id: int | None
    mode: Literal["any", "all"] | None = Field(
        default=None, description="A wait of several events: `any` or `all` of `awaits`."
    )
    awaits: list[AwaitedView] | None = Field(
        default=None, description="What a wait of several events, or a correlated one, awaits."
    )
    matched: list[str] = Field(
        default_factory=list, description="The names of the awaited events matched so far."
    )
    decision: Literal["approved", "rejected"] | None
    decided_by: str | None
    decision_comment: str | None
    required: int = Field(default=1, description="An approval: approving votes it needs.")
    reject_quorum: int = Field(default=1, description="An approval: rejecting votes that end it.")
    votes: list[VoteView] = Field(default_factory=list, description="An approval's votes.")
    messages: list[MessageView] = Field(
        default_factory=list,
        description="An approval's Slack and email messages and how far each got.",
    )


class StepView(_Response):
    id: UUID
    step_key: str
    node_id: str
    block_type: str
    status: StepStatus
    attempt: int
    lease_id: UUID | None
    lease_expires_at: datetime | None
    wake_at: datetime | None
    dispatched_at: datetime | None
    idempotency_key: str | None
    side_effect_started_at: datetime | None
    input: Any
    input_override: Any = Field(
        default=None, description="A person's edit of the input, given when replaying from it."
    )
    input_edited_by: str | None = Field(default=None, description="Who edited the input.")
    output: Any
    error: str | None
    error_class: Literal["transient", "permanent"] | None
    outcome_code: str | None
    branch_choice: str | None
    copied_from: UUID | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    waits_for: WaitView | None = Field(
        default=None, description="For a wait_for or approval step: what it waits for."
    )
    leases: list[LeaseView] = Field(
        description="Every attempt's lease, oldest first, as far as kept (the history of runs "
        "finished more than `ONCEFLOW_LEASE_HISTORY_DAYS` ago is trimmed). A step copied by a "
        "replay has none: its attempts are on the step it was copied from."
    )


class _Refundable(_Response):
    """A ledger row's refund, if it had one (at most one per charge)."""

    refunded: int | None = Field(
        default=None, description="Credits paid back because the call provably never applied."
    )
    refund_reason: str | None = None
    refunded_at: datetime | None = None


class Charge(_Refundable):
    lineage_key: str
    amount: int
    block_type: str
    run_id: UUID | None
    step_id: UUID | None
    created_at: datetime


class LineageEntry(_Response):
    id: UUID
    replay_of: UUID | None
    status: RunStatus
    start_key: str
    created_at: datetime
    finished_at: datetime | None


class RunDetail(_Response):
    run: RunSummary
    version_number: int
    dedup_mode: str
    namespace: Literal["live", "rehearsal"]
    trigger_payload: Any
    payload_truncated: bool
    replay_from: str | None = Field(
        default=None, description="The step this replay started from (null: its first failure)."
    )
    replay_by: str | None = Field(default=None, description="Who asked for this replay.")
    phase: Literal["main", "compensating", "finally"] = Field(
        default="main",
        description="`compensating`: a step failed and the run is undoing the steps that "
        "declare `compensate:` (their rows are the steps keyed `compensate:<step>`, each with "
        "its outcome); it ends failed. A failed run that compensated keeps this phase. "
        "`finally`: the run's end is decided (`final_status`) and its `finally:` steps run "
        "(the steps keyed `finally:<id>`); a run that ran them keeps this phase.",
    )
    final_status: Literal["succeeded", "failed", "cancelled", "goal_met"] | None = Field(
        default=None,
        description="How the run's main phase decided it ends, kept while its `finally:` "
        "steps run; it ends so, or failed when a finally step failed. Null: no finally steps.",
    )
    steps: list[StepView]
    charges: list[Charge] = Field(description="Ledger rows for this run's idempotency keys.")
    lineage: list[LineageEntry] = Field(description="Every live run of the replay lineage.")


class Redecided(_Response):
    """A refusal decided again under a later version (`POST /v1/bulk/act`, action redecide)."""

    version_id: UUID
    outcome: str = Field(description="`admitted` (see run_id) or the reason it met then.")
    detail: str | None
    run_id: UUID | None = Field(description="The run it started (None once pruned).")
    bulk_id: UUID | None = Field(description="The bulk preview (token) it was acted on under.")
    decided_at: datetime


class Refusal(_Response):
    id: int
    tenant_id: str
    event_id: int
    workflow_id: UUID
    workflow_name: str
    version_id: UUID | None
    record_key: str | None
    reason: RefusalReason
    detail: str
    explanation: str = Field(description="The reason in plain words.")
    created_at: datetime
    redecisions: list[Redecided] = Field(
        default=[],
        description="Its re-decisions under later versions (the refusal itself stays).",
    )


class RefusalPage(_Response):
    items: list[Refusal]
    next_cursor: str | None


class Decision(_Response):
    workflow_id: UUID
    workflow_name: str
    outcome: Literal["admitted", "refused", "undecided", "undelivered"]
    run_id: UUID | None = None
    run_status: RunStatus | None = None
    reason: str | None = None
    detail: str | None = None
    explanation: str = Field(description="What happened, in plain words.")


class EventDecisions(_Response):
    event_id: int
    event_type: str
    source_event_id: str | None
    author_id: str | None
    changed_fields: Any
    occurred_at: datetime
    received_at: datetime
    published_at: datetime | None
    payload_truncated: bool
    decided_at: datetime | None = Field(
        default=None, description="When admission decided every bound workflow."
    )
    redeliveries: int = Field(
        default=0, description="Times the sweep published it again for want of a decision."
    )
    undelivered_at: datetime | None = Field(
        default=None, description="When onceflow gave up delivering it (re-queue to retry)."
    )
    undelivered_reason: str | None = None
    decisions: list[Decision]


class StuckInboxRow(_Response):
    """A verified webhook body that will not be drained by itself (dead) or ever (rejected).
    The body is never shown."""

    id: int
    connection_id: UUID | None = Field(
        description="The connection it came to; none for a provider app's URL (see app_id)."
    )
    app_id: str | None = Field(
        default=None, description="The HubSpot app whose one URL it came to (operator only)."
    )
    status: Literal["dead", "rejected"]
    attempts: int
    deliveries: int
    received_at: datetime
    finished_at: datetime | None
    last_error: str | None
    explanation: str


class StuckInboxList(_Response):
    rows: list[StuckInboxRow]


class UnroutedPortal(_Response):
    """Events an app's one webhook URL received for a portal that no live connection takes:
    recorded and acknowledged (never a 5xx, never silently dropped)."""

    account_id: str = Field(description="The HubSpot portalId ('' when the event named none).")
    reason: str
    explanation: str
    events: int
    deliveries: int
    first_seen_at: datetime
    last_seen_at: datetime


class JournalGap(_Response):
    """The reader found its offset gone (away longer than the journal keeps entries): entries
    between `lost_after` and `resumed_at` may never have been read."""

    id: int
    lost_after: str
    resumed_at: str | None = Field(description="The earliest offset read instead; null: none.")
    last_entry_at: datetime | None = Field(
        description="When the entry at `lost_after` was stored: the gap starts after it."
    )
    detected_at: datetime
    detail: str


class JournalState(_Response):
    """A provider journal the app's events are read from (shared/ingest/journal.py)."""

    journal: str = Field(description='"global" (every install) or the account of a local one.')
    last_offset: str | None = Field(description="The last entry stored; null: none yet.")
    entries_read: int
    last_entry_at: datetime | None
    last_pass_at: datetime | None
    last_error: str | None = Field(description="The last pass's error; null when it ended well.")
    gaps: list[JournalGap] = Field(description="Gaps detected in the last 7 days, newest first.")


class ProjectSubscription(BaseModel):
    """One webhook subscription: (object type, the provider's event kind, property)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    object_type: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_-]+$")
    event_kind: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_]+$")
    property_name: str | None = Field(default=None, min_length=1, max_length=200)


class ProjectDeclaration(_Request):
    subscriptions: list[ProjectSubscription] = Field(
        max_length=5000,
        description="What the app's project files declare, read back from them after writing.",
    )


class AppProjectReport(_Response):
    """What a project-based app's files should say, what they last said, and the drift."""

    provider: str
    app_id: str
    platform: Literal["legacy", "project"]
    scopes: list[str]
    redirect_urls: list[str] = Field(
        description="The install's redirect URLs: ONCEFLOW_OAUTH_REDIRECT_URL (installs started"
        " in ops) and the app's own callback (installs that start at the provider)."
    )
    target_url: str | None = Field(
        description="The app's webhook URL (ONCEFLOW_PUBLIC_URL + /<provider>/app/<app id>);"
        " null when ONCEFLOW_PUBLIC_URL is not set."
    )
    needed: list[ProjectSubscription] = Field(
        description="The union of what the active workflows of the app's tenants listen to."
    )
    unsupported: list[str]
    declared: list[ProjectSubscription] | None = Field(
        description="What the project files declared when last written; null: never written."
    )
    declared_at: datetime | None
    missing: list[ProjectSubscription] = Field(description="Needed and not declared: the drift.")


class ProviderAppReport(_Response):
    """A provider app (one webhook URL for every portal that installed it), for the operator."""

    provider: str
    app_id: str
    kind: Literal["public", "private"]
    platform: Literal["legacy", "project"] = Field(
        description="Where its subscriptions are kept: legacy (the provider's API, or its UI for"
        " a private app) or project (its project files: `GET .../project` shows the drift)."
    )
    unrouted: list[UnroutedPortal]
    subscriptions: dict[str, Any] | None = Field(
        description="The last subscription reconcile: `desired` (for a private app, what the "
        "operator must create in HubSpot's UI), `result`, `ok`, `reconciled_at`."
    )
    journals: list[JournalState] = Field(
        default_factory=list, description="The journals its events are read from, if any."
    )


class RequeueResult(_Response):
    id: int
    requeued: bool = True


class RecordDrop(_Response):
    """A property change of the record that became no trigger event, so no workflow saw it."""

    id: int
    event_type: str
    source_event_id: str | None
    inbox_id: int | None
    reason: Literal["not_watched", "unchanged", "out_of_order", "re_announced"]
    fields: Any = Field(description="{field: value} as announced (values cut to 200 chars).")
    occurred_at: datetime
    recorded_at: datetime
    explanation: str = Field(description="What happened and what to do, in plain words.")


class WebhookRefusalCount(_Response):
    """Deliveries to the record's connection refused at the door (bodies are never kept)."""

    check_name: str = Field(description="The check that failed: `hubspot_v3_mismatch`, ...")
    refusals: int
    first_seen_at: datetime
    last_seen_at: datetime
    explanation: str = Field(description="What it means and what to do, in plain words.")


class RecordExplanation(_Response):
    record_key: str
    record_label: str | None = Field(
        default=None, description="What people call the record; null while unknown."
    )
    events: list[EventDecisions] = Field(
        description="Every event seen for the record, oldest first."
    )
    runs: list[RunSummary] = Field(description="Every live run for the record, oldest first.")
    drops: list[RecordDrop] = Field(
        default_factory=list,
        description="Changes of the record dropped before they became events (newest first, at"
        " most 100, kept for `ONCEFLOW_DROP_RETENTION_DAYS`).",
    )
    webhook_refusals: list[WebhookRefusalCount] = Field(
        default_factory=list,
        description="Webhooks to the record's connection refused before they were stored "
        "(signature, timestamp, disconnected): any of them may have concerned this record.",
    )
    stuck_inbox: list[StuckInboxRow] = Field(
        default_factory=list,
        description=(
            "Webhooks from the record's connection that could not be processed: any of them "
            "may have concerned this record (newest first, at most 20)."
        ),
    )


class RecordSearchQuery(_Request):
    q: Text = Field(
        min_length=1,
        max_length=500,
        description="A HubSpot record URL, an object id, an email, or a record key.",
    )


class RecordMatch(_Response):
    record_key: str = Field(description=RECORD_KEY_DESCRIPTION)
    connection_id: UUID
    object_type: str
    object_id: str
    label: str | None = Field(
        default=None, description="What people call the record; null while unknown."
    )
    matched_on: str = Field(description="What matched, in plain words.")
    last_seen_at: datetime | None = Field(
        description="The newest event or run for it; null when nothing was received yet."
    )


class RecordSearch(_Response):
    query: str
    interpreted_as: SearchKind
    items: list[RecordMatch] = Field(description="Newest first, within your connections.")


class LedgerEntry(_Refundable):
    id: int
    lineage_key: str
    amount: int
    block_type: str
    run_id: UUID | None
    step_id: UUID | None
    created_at: datetime


class Credits(_Response):
    tenant_id: str
    balance: int
    ledger: list[LedgerEntry]
    next_cursor: str | None


class ReplayResult(_Response):
    run: RunSummary
    copied_steps: list[str] = Field(description="Step keys copied from the replayed run.")
    reset_steps: list[str] = Field(description="Step keys reachable from the first error.")
    restarted_steps: list[str] = Field(description="Step keys dispatched again, as pending.")


class CancelResult(_Response):
    run: RunSummary
    skipped_steps: list[str] = Field(description="Pending and parked steps, now skipped.")
    running_steps: list[str] = Field(
        description="Steps finishing their attempt; their settle creates no next steps."
    )


class ApprovalView(_Response):
    """An approval waiting for a decision."""

    id: int
    run_id: UUID
    step_key: str
    tenant_id: str
    summary: str
    approver_role: str | None
    approver_users: list[str]
    expires_at: datetime
    on_timeout: Literal["reject", "proceed"]
    created_at: datetime
    required: int = Field(default=1, description="Approvals it needs (its quorum).")
    approved_by: list[str] = Field(
        default_factory=list, description="Who has approved so far (the quorum's progress)."
    )
    escalated_at: datetime | None = Field(
        default=None, description="When it escalated (then escalate_role/users may decide too)."
    )
    escalate_role: str | None = None
    escalate_users: list[str] = Field(default_factory=list)


class ApprovalList(_Response):
    items: list[ApprovalView] = Field(description="Those the caller may decide, oldest first.")


class DecisionResult(_Response):
    approval_id: int
    decision: Literal["approved", "rejected"]
    decided_by: str
    run_id: UUID
    step_key: str
    resumed: bool = Field(
        default=True,
        description="Whether this decision resumed the step (false: the quorum waits for more,"
        " or this approver had decided already).",
    )
    vote: Literal["counted", "duplicate"] = Field(
        default="counted",
        description="`duplicate`: this approver had decided already; nothing changed.",
    )
    approvals: int = Field(default=0, description="Approving decisions counted so far.")
    required: int = Field(default=1, description="Approving decisions it needs.")


class ApprovalLink(_Response):
    path: str = Field(description="The link's path; valid until expires_at.")
    url: str | None = Field(
        default=None,
        description=(
            "The whole link, on the public webhook function (ONCEFLOW_PUBLIC_URL), which a"
            " browser without a Google identity reaches; null when that is not configured"
            " (then append path to the ops URL)."
        ),
    )
    user: str
    expires_at: datetime


class RetryResult(_Response):
    run_id: UUID
    restarted_steps: list[str]


class WorkflowSummary(_Response):
    id: UUID
    tenant_id: str
    name: str
    active_version_id: UUID | None
    latest_version: int | None
    created_at: datetime


class WorkflowList(_Response):
    items: list[WorkflowSummary]


class VersionSummary(_Response):
    id: UUID
    number: int
    content_hash: str
    active: bool
    created_at: datetime


class VersionList(_Response):
    workflow_id: UUID
    items: list[VersionSummary]


class CronTick(_Response):
    scheduled_at: datetime = Field(description="The tick's instant; with the workflow, its key.")
    status: Literal["fired", "missed"]
    event_id: int | None = Field(description="The trigger event a fired tick emitted.")
    detail: str = Field(description='e.g. "tick 2026-12-03 09:00 Europe/Paris was missed, …"')
    recorded_at: datetime


class CronTickList(_Response):
    workflow_id: UUID
    items: list[CronTick] = Field(description="Newest first.")


class TriggerStatus(_Response):
    workflow_id: UUID
    active: bool
    kind: str | None = Field(description="events, cron, webhook or poll; null when inactive.")
    detail: dict[str, Any] = Field(
        description="Per kind: a schedule's fired and missed ticks; a poll's last pass, its "
        "last error and where its rows stand; a webhook trigger's refused requests."
    )


class DefinitionProblem(_Response):
    severity: Literal["error", "warning"]
    path: str = Field(description="Where in the definition: `steps[1].config.url`, ...")
    message: str
    line: int | None = Field(description="1-based line in the submitted source.")
    column: int | None


class ValidationResult(_Response):
    valid: bool
    problems: list[DefinitionProblem]


class PublishResult(_Response):
    workflow_id: UUID
    version_id: UUID
    number: int
    content_hash: str
    created: bool = Field(description="False when the same content was already published.")
    warnings: list[DefinitionProblem]


class ResumeRequest(_Request):
    half_open: bool = Field(
        default=False,
        description="Resume on trial: a few runs are admitted (3; later events are refused "
        "`workflow_paused` until one ends), the next run that succeeds closes the "
        "breaker and the next that fails pauses the workflow again at once.",
    )
    reason: Text | None = Field(
        default=None, max_length=500, description="What was fixed, for the audit trail."
    )


class BreakerStatus(_Response):
    workflow_id: UUID
    state: Literal["closed", "open", "half_open"]
    consecutive_failures: int
    trips: int
    opened_at: datetime | None
    reason: str | None
    explanation: str


class BudgetStatus(_Response):
    workflow_id: UUID
    credits: int | None = Field(description="The cap per window; null when none is declared.")
    per: str = Field(description="The rolling window the sums cover.")
    reserved: int = Field(description="Reserved for requests not settled yet (or unknown).")
    spent: int
    released: int = Field(description="Reserved, then given back: the request never applied.")


class ActivationResult(_Response):
    workflow_id: UUID
    active_version_id: UUID | None
    warnings: list[str] = Field(
        default_factory=list,
        description="What stands but needs a person: e.g. a subscription the workflows need"
        " that a project app's deployed files don't declare.",
    )


class RehearsalStep(_Response):
    step_key: str
    node_id: str
    block_type: str
    status: StepStatus
    output: Any
    error: str | None
    outcome_code: str | None
    branch_choice: str | None


class RehearsalResult(_Response):
    run_id: UUID
    status: RunStatus
    steps: list[RehearsalStep]
    would_send: list[Any] = Field(description="Side effects stopped before they left.")


class WouldRunAnswer(_Response):
    """ "Would this record enroll?" (shared/admission/would_run.py): admission's decision for
    the record as the CRM has it now, written nowhere."""

    workflow_id: UUID
    record_key: str
    event_type: str = Field(description="The event type the question was asked for.")
    version_id: UUID
    dedup_mode: str
    would_run: bool = Field(description="True: a new run would start.")
    reason: str | None = Field(description="The refusal reason admission would record.")
    detail: str | None = Field(description="Its words, as admission would record them.")
    explanation: str = Field(description="The answer in plain words.")
    changed_fields: dict[str, Any] = Field(
        description="The fields a change announced now would carry (the watched ones)."
    )
    record: dict[str, Any] = Field(description="The record the trigger rule read.")
    blocking_run_id: UUID | None = Field(description="The run that blocks a new one.")
    breaker_state: str
    notes: list[str] = Field(
        description="What would act on the run's steps rather than its start (the budget)."
    )


# ---- health ("is the machinery running?") --------------------------------------------------


class ScheduledJobHealth(_Response):
    name: str
    state: str | None = Field(description="ENABLED, PAUSED, DISABLED, UPDATE_FAILED.")
    last_attempt_at: datetime | None
    next_attempt_at: datetime | None
    last_status: str | None = Field(
        description="'ok', the failed attempt's error, or null before the first attempt."
    )
    error: str | None = Field(default=None, description="Why the job could not be read.")


class SchedulerHealth(_Response):
    available: bool
    detail: str | None
    jobs: list[ScheduledJobHealth]


class BacklogHealth(_Response):
    inbox_pending: int
    inbox_oldest_seconds: float
    outbox_unpublished: int
    outbox_oldest_seconds: float
    steps_pending: int = Field(description="Pending steps never claimed yet.")
    steps_oldest_pending_seconds: float


class DeadLetterHealth(_Response):
    poisoned_messages: int
    poisoned_messages_24h: int
    dead_inbox_rows: int
    undelivered_events: int = Field(
        description="Trigger events given up after every re-publish (ops can re-queue them)."
    )


class SweepDutyHealth(_Response):
    name: str
    last_started_at: datetime
    last_finished_at: datetime | None
    last_ok: bool | None
    last_error: str | None


class MachineryHealth(_Response):
    scheduler: SchedulerHealth
    backlog: BacklogHealth
    dead_letters: DeadLetterHealth
    sweep_duties: list[SweepDutyHealth]


class ConnectionHealth(_Response):
    connection_id: UUID
    tenant_id: str
    provider: str
    status: str
    credentials: Literal["token", "service_key", "oauth"] = Field(
        default="token",
        description="A token or a service key in an environment variable, or an OAuth grant"
        " (an app install).",
    )
    credentials_configured: bool = Field(
        description="A token or service-key connection: the variable it names is set in this"
        " function. An OAuth connection: its grant exists and the key that seals it is set here."
    )
    oauth_refreshed_at: datetime | None = Field(
        default=None, description="When the OAuth access token was last issued or refreshed."
    )
    last_call_at: datetime | None = Field(
        default=None,
        description="The connection's last real call to its provider (noted at most once a"
        " minute per instance); null when none was made yet.",
    )
    last_call_ok: bool | None = Field(
        default=None,
        description="Whether the provider served it (an answer about the request itself, such"
        " as a missing record, counts as served).",
    )
    last_call_error: str | None = None
    last_reconcile_ok: bool | None
    last_reconciled_at: datetime | None
    last_reconcile_errors: list[str]


class WaitingClaim(_Response):
    """An install that started at the provider, waiting for a tenant's operator to claim it."""

    provider: str
    app_id: str
    portal_id: str
    created_at: datetime
    claim_by: datetime


class HealthReport(_Response):
    checked_at: datetime
    problems: list[str] = Field(description="What looks stuck or broken, in plain words.")
    machinery: MachineryHealth | None = Field(
        description="Scheduler, queues and dead letters: admin tokens only (null otherwise)."
    )
    connections: list[ConnectionHealth]
    waiting_claims: list[WaitingClaim] = Field(
        default_factory=list,
        description="Installs that started at the provider and wait for a claim"
        " (`POST /v1/apps/{provider}/{app_id}/installs/claim`): admin tokens only.",
    )


# ---- app installs (OAuth) -----------------------------------------------------------------


class InstallRequest(_Request):
    tenant_id: str | None = Field(
        default=None,
        max_length=63,
        description="The tenant the portal's connection will belong to; a tenant token's own "
        "tenant when omitted (an admin token must name one).",
    )


class InstallStarted(_Response):
    """An install in progress: send the browser to `authorize_url` (also the Location of the
    303); HubSpot sends it back to `redirect_uri`, the webhook function's public callback,
    whose page shows the code to confirm the install with (`InstallConfirm`)."""

    tenant_id: str
    app_id: str
    authorize_url: str
    redirect_uri: str
    expires_at: datetime


class InstallConfirm(_Request):
    # exclude=True: never dumped, so never written to the audit with the request body.
    confirm_code: str = Field(
        min_length=20,
        max_length=100,
        pattern=r"^[A-Za-z0-9_-]+$",
        exclude=True,
        description="The code the install's callback page showed; accepted only from the ops "
        "token that started the install, once, within 30 minutes of the callback.",
    )


class InstallClaim(_Request):
    tenant_id: str | None = Field(
        default=None,
        max_length=63,
        description="The tenant that claims the portal; a tenant token's own tenant when"
        " omitted (an admin token must name one).",
    )
    portal_id: str = Field(
        min_length=1,
        max_length=20,
        pattern=r"^[0-9]+$",
        description="The portal the callback page named: the claimer says which portal it"
        " expects, so a code for another portal is refused.",
    )
    # exclude=True: never dumped, so never written to the audit with the request body.
    claim_code: str = Field(
        min_length=20,
        max_length=100,
        pattern=r"^[A-Za-z0-9_-]+$",
        exclude=True,
        description="The code the app's own callback page showed to the browser that installed"
        " the app at the provider; accepted once, within 24 hours.",
    )


class InstallConfirmed(_Response):
    """The confirmed install: the portal's connection, created or re-authorized."""

    tenant_id: str
    app_id: str
    portal_id: str
    connection_id: str
    outcome: Literal["created", "reauthorized"]


# ---- tenants, connections and ops tokens --------------------------------------------------

# The tenants table's CHECK, as the API's first answer (a 422 naming the field, not a 409).
TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{1,62}$"
ENV_NAME_PATTERN = r"^[A-Z][A-Z0-9_]*$"
RoleName = Annotated[Text, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")]


# ---- outbound events (shared/ops/api/outbound.py) ------------------------------------------
OutboundEventType = Literal[
    "run.failed",
    "run.succeeded",
    "event.refused",
    "event.undelivered",
    "breaker.tripped",
    "approval.requested",
]


class OutboundSubscriptionCreate(_Request):
    tenant_id: Text | None = Field(
        default=None, description="Required with an admin token; a tenant token's own tenant."
    )
    url: Text = Field(
        max_length=2048,
        description="http(s) URL the events are POSTed to; refused when the SSRF guard refuses"
        " its address (private, loopback, metadata, …).",
    )
    event_types: list[OutboundEventType] = Field(min_length=1, max_length=6)
    secret_env: Text = Field(
        pattern=ENV_NAME_PATTERN,
        max_length=100,
        description="The *name* of the environment variable holding the Standard Webhooks"
        " secret ('whsec_' + base64; several, space-separated, while rotating: each signs),"
        " never the secret.",
    )


class OutboundSubscription(_Response):
    id: UUID
    tenant_id: str
    url: str
    event_types: list[str]
    secret_env: str
    enabled: bool
    created_at: datetime


class OutboundSubscriptionList(_Response):
    items: list[OutboundSubscription]


class OutboundSubscriptionEnable(_Request):
    enabled: bool


class OutboundDeliveriesQuery(_Request):
    status: Literal["pending", "delivered", "given_up"] | None = None
    limit: int = Field(default=50, ge=1, le=200)


class OutboundDelivery(_Response):
    id: str = Field(description="The `webhook-id` every attempt carries.")
    subscription_id: UUID
    tenant_id: str
    url: str
    event_type: str
    event_key: str
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    given_up_at: datetime | None
    created_at: datetime


class OutboundDeliveryList(_Response):
    items: list[OutboundDelivery]


class OutboundResendResult(_Response):
    id: str
    resent: bool = True


class TenantCreate(_Request):
    id: Text = Field(pattern=TENANT_ID_PATTERN, description="What definitions name as `tenant`.")
    name: Text | None = Field(default=None, max_length=200, description="Defaults to the id.")
    credits: int = Field(default=0, ge=0, le=1_000_000_000, description="Credits granted.")


class Tenant(_Response):
    id: str
    name: str
    credit_balance: int
    created_at: datetime
    connections: int = 0
    workflows: int = 0


class TenantList(_Response):
    items: list[Tenant]


class ConnectionCreate(_Request):
    tenant_id: Text | None = Field(
        default=None, description="Required with an admin token; a tenant token's own tenant."
    )
    provider: ProviderName
    webhook_secret_env: Text = Field(
        pattern=ENV_NAME_PATTERN,
        max_length=100,
        description="The *name* of the environment variable holding the webhook secret.",
    )
    api_credentials_env: Text | None = Field(default=None, pattern=ENV_NAME_PATTERN, max_length=100)
    credential_kind: Literal["token", "service_key"] = Field(
        default="token",
        description="What the variable `api_credentials_env` names holds: an API `token` (e.g."
        " a HubSpot private app's access token) or a `service_key` (HubSpot's replacement for"
        " private apps). Both are used as they are: they neither expire nor refresh, and a"
        " revoked or rotated one fails the calls until the variable holds the new one. (An"
        " OAuth connection is made by installing an app, `/v1/oauth/...`.)",
    )
    api_base_url: Text | None = Field(
        default=None, max_length=500, description="The CRM's API; null: the vendor's."
    )
    provider_account_id: Text | None = Field(
        default=None, max_length=100, description="HubSpot's portal id."
    )
    provider_app_id: Text | None = Field(default=None, pattern=r"^[0-9]{1,20}$")
    provider_user_id: Text | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The provider user the connection's API token acts as (Pipedrive: `id` "
        "of GET /v1/users/me). Events by another user, or not made through the API, are then "
        "never taken for onceflow's own echo.",
    )
    watched_fields: dict[Text, list[Text]] = Field(default_factory=dict)


class ConnectionSummary(_Response):
    id: UUID
    tenant_id: str
    provider: str
    status: str
    provider_account_id: str | None
    provider_app_id: str | None
    provider_user_id: str | None = None
    api_base_url: str | None
    webhook_secret_env: str
    api_credentials_env: str | None
    credential_kind: Literal["token", "service_key", "oauth"] = Field(
        description="The credential it calls its provider with: a `token` or `service_key` in"
        " the variable `api_credentials_env` names, or an app install's `oauth` grant."
    )
    watched_fields: dict[str, Any]
    created_at: datetime


class ConnectionList(_Response):
    items: list[ConnectionSummary]


# ---- how approvals reach people (issue 31 item 4): a tenant's Slack app and SMTP server,
# by the names of the variables holding their secrets, and who is who ------------------------

EnvName = Annotated[Text, Field(pattern=ENV_NAME_PATTERN, max_length=100)]


class SlackSettingsSet(_Request):
    tenant_id: Text | None = Field(
        default=None, description="Required with an admin token; a tenant token's own tenant."
    )
    bot_token_env: EnvName | None = Field(
        description="The *name* of the variable holding the bot token (`chat:write`), for the"
        " `sweep` function. Null, with `signing_secret_env` null: the tenant has no Slack."
    )
    signing_secret_env: EnvName | None = Field(
        description="The *name* of the variable holding the Slack app's signing secret, for the"
        " `webhook` function."
    )


class SmtpSettingsSet(_Request):
    tenant_id: Text | None = Field(
        default=None, description="Required with an admin token; a tenant token's own tenant."
    )
    host: Text | None = Field(
        description="The SMTP server. Null (and nothing else given): the tenant sends no email."
    )
    port: int | None = Field(default=None, ge=1, le=65535, description="Default 587.")
    sender: Text | None = Field(default=None, description="The From address.")
    username: Text | None = Field(default=None, max_length=320)
    password_env: EnvName | None = Field(
        default=None, description="The *name* of the variable holding the password (`sweep`)."
    )
    starttls: bool = True


_SET_HERE = (
    "Whether the variable is set in the ops function that answered (as a connection's"
    " credentials_configured): the function that reads it ({}) needs it mounted too."
)


class SlackSettings(_Response):
    bot_token_env: str
    signing_secret_env: str
    bot_token_set: bool = Field(description=_SET_HERE.format("sweep"))
    signing_secret_set: bool = Field(description=_SET_HERE.format("webhook"))


class SmtpSettings(_Response):
    host: str
    port: int | None = Field(description="Null: the sweep's default, 25.")
    sender: str
    username: str | None
    password_env: str | None
    password_set: bool | None = Field(
        description=_SET_HERE.format("sweep") + " Null: no password is named."
    )
    starttls: bool


class MessagingSettings(_Response):
    tenant_id: str
    slack: SlackSettings | None = Field(description="Null: the tenant has no Slack.")
    smtp: SmtpSettings | None = Field(description="Null: the tenant sends no email.")


class MessagingQuery(_Request):
    tenant_id: Text | None = Field(default=None, description="Required with an admin token.")


class ApproverIdentityRef(_Request):
    tenant_id: Text | None = Field(
        default=None, description="Required with an admin token; a tenant token's own tenant."
    )
    slack_user_id: Text | None = Field(
        default=None, max_length=320, description="A Slack user id (U… or W…). Or `email`."
    )
    email: Text | None = Field(default=None, max_length=320, description="Or `slack_user_id`.")


class ApproverIdentityCreate(ApproverIdentityRef):
    user: Text = Field(
        min_length=1,
        max_length=200,
        description="The onceflow user (the label of their ops tokens) approvals name.",
    )


class ApproverIdentity(_Response):
    tenant_id: str
    channel: Literal["slack", "email"]
    external_id: str
    user: str
    created_at: datetime


class ApproverIdentityList(_Response):
    items: list[ApproverIdentity]


class ApproverIdentityQuery(_Request):
    tenant_id: Text | None = Field(default=None, description="An admin token's filter.")
    user: Text | None = Field(default=None, max_length=200)


class TokenCreate(_Request):
    tenant_id: Text | None = Field(
        default=None, description="The tenant the token is scoped to; omit with `admin`."
    )
    admin: bool = Field(default=False, description="A token that sees every tenant.")
    label: Text = Field(min_length=1, max_length=200, description="Who or what holds it.")
    roles: list[RoleName] = Field(default_factory=list, max_length=20)
    expires_at: AwareDatetime | None = Field(
        default=None, description="Refused (401) from then on; null: until revoked."
    )


class TokenSummary(_Response):
    id: UUID
    tenant_id: str | None = Field(description="null: an admin token.")
    label: str
    roles: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenMinted(_Response):
    token: str = Field(description="Shown this once; only its SHA-256 is stored.")
    details: TokenSummary


class TokenList(_Response):
    items: list[TokenSummary]


class BootstrapRequest(_Request):
    label: Text = Field(default="bootstrap admin", min_length=1, max_length=200)


BulkActionName = Literal["replay", "retry", "cancel", "requeue_inbox", "redrive", "redecide"]


class BulkPreviewRequest(_Request):
    """Which runs (or dead inbox rows) an action would touch now. Runs are filtered like
    `GET /v1/runs`; replay and retry take failed runs, cancel running ones; requeue_inbox
    takes the dead inbox rows (optionally of one connection); redrive (admins only) the
    messages waiting on the Pub/Sub dead-letter holds (`<hold>:<event or step id>`);
    redecide the admission refusals (of `reasons`, refused in the window) to decide again
    under each workflow's current version."""

    action: BulkActionName
    workflow_id: UUID | None = None
    record_key: Text | None = Field(
        default=None, max_length=500, description=RECORD_KEY_DESCRIPTION
    )
    created_after: AwareDatetime | None = Field(default=None, description="Inclusive.")
    created_before: AwareDatetime | None = Field(default=None, description="Exclusive.")
    event_type: Text | None = Field(default=None, max_length=200, pattern=EVENT_TYPE_PATTERN)
    connection_id: UUID | None = Field(
        default=None, description="requeue_inbox only: the dead rows of this connection."
    )
    reason: Text | None = Field(
        default=None,
        max_length=500,
        description="Why; kept on each target's audit row (required for cancel).",
    )
    reasons: list[Redecidable] | None = Field(
        default=None,
        max_length=5,
        description="redecide only: the refusal reasons to decide again (default: all of them).",
    )


class RedecisionPreview(_Response):
    """One refusal and what the workflow's current version says of it now."""

    refusal_id: int
    event_id: int
    workflow_id: UUID
    record_key: str | None
    was_reason: str = Field(description="The refusal as admission recorded it (it stays).")
    was_detail: str
    version_id: UUID | None = Field(description="The current version (None: no longer bound).")
    would_run: bool
    outcome: str = Field(
        description="`admitted`, or the reason it would be refused now (`not_bound`, "
        "`holds_starts`: not decided at all)."
    )
    detail: str | None


class BulkPreview(_Response):
    token: UUID = Field(description="Names exactly `targets`; act on it with /v1/bulk/act.")
    action: BulkActionName
    tenant_id: str | None
    targets: list[str] = Field(
        description="Run ids (inbox row ids for requeue_inbox, `<hold>:<id>` for redrive), sorted."
    )
    more: bool = Field(description="More matched than one bulk action takes; narrow the filter.")
    expires_at: datetime
    runs: list[RunSummary] = Field(default=[], description="The runs listed, for people.")
    inbox_rows: list[StuckInboxRow] = Field(default=[], description="requeue_inbox's rows.")
    redecisions: list[RedecisionPreview] = Field(
        default=[], description="redecide's refusals and what the current version says now."
    )


class BulkActRequest(_Request):
    token: UUID


class BulkOutcome(_Response):
    target: str
    ok: bool
    code: str | None = Field(default=None, description="The refusal's code when not ok.")
    message: str
    run_id: UUID | None = Field(default=None, description="A replay's new run.")


class BulkActResult(_Response):
    token: UUID
    action: BulkActionName
    repeated: bool = Field(
        description="True when an earlier act on this token already ran: nothing was done"
        " again, and these are its outcomes."
    )
    outcomes: list[BulkOutcome]


# ---- limits -------------------------------------------------------------------------------

LimitKind = Literal[
    "connection", "workflow", "host", "run_start", "debounce", "batch", "concurrency"
]


class LimitsQuery(_Request):
    tenant_id: Text | None = Field(
        default=None,
        max_length=200,
        description="An admin token's filter to one tenant; a tenant token sees only its own.",
    )
    limit: int = Field(
        default=100, ge=1, le=500, description="At most this many limits of each kind."
    )


class LimitView(_Response):
    """One limit and what it holds back now."""

    kind: LimitKind = Field(
        description="connection, workflow and host: step rate limits (steps wait parked"
        " THROTTLED); run_start: a trigger's throttle on starting runs (events wait queued);"
        " debounce: an open burst (its events are held until it fires); batch: an open batch"
        " (its events are held until it is full or its max_wait ends); concurrency: a"
        " workflow's key with runs waiting for a slot (they start as runs of the key end)."
    )
    tenant_id: str
    subject: str = Field(
        description="The connection id, the workflow id, `<tenant>|<host>`,"
        " `<workflow_id>|<key>` (run_start), or `<workflow_id>|<key>` of a burst (debounce)."
    )
    limit: int | None = Field(
        description="How many the window admits (a debounce: None, it admits one run; a"
        " batch: its max_size)."
    )
    period_seconds: float | None = Field(
        description="The window's length; a debounce's quiet period; a batch's max_wait."
    )
    window_start: AwareDatetime | None = None
    window_end: AwareDatetime | None = None
    admitted: int = Field(
        description="Claims counted in the current window (over-limit included); for a"
        " concurrency key, the runs running (holding a slot)."
    )
    waiting: int = Field(
        description="Steps parked on it, events queued behind it, or events held in the burst."
    )
    waiting_what: Literal["steps", "events"]
    oldest_wait_since: AwareDatetime | None = Field(
        description="When the longest-waiting step or event began to wait."
    )
    oldest_wait_seconds: float | None
    next_at: AwareDatetime | None = Field(
        description="When the next waiter is let through: the window's end, a queue's due"
        " time, a burst's fire time."
    )
    reason: str | None = Field(
        default=None,
        description="A connection: why the portal's shared rate budget narrows its window now"
        " (a spent daily budget or rate window by the vendor's headers, or a 429 that shrank"
        " it); None when only the configured window applies.",
    )


class LimitsReport(_Response):
    items: list[LimitView]
    truncated: bool = Field(
        description="A kind had more than `limit` rows: ask for more, or filter by tenant."
    )
