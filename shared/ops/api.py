"""The ops JSON API: routes, request parsing, the error model, and the handlers.

Every route is declared once in `ROUTES` with its query and body models; the same table
drives dispatch and `/openapi.json`. A request is authenticated (bearer token, 401 without
one), its query and body validated against the route's models (unknown fields, wrong types,
malformed JSON and oversized bodies are 4xx with a code and a message), and every mutating
call is audited, refused ones included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from flask import Request, Response
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule

from shared import triggers
from shared.accounts import connections
from shared.core import pubsub, queries, request_body
from shared.core.db import Database, get_database
from shared.core.errors import ConflictError, TransientError
from shared.core.logs import get_logger
from shared.gates import credits as credit_ledger
from shared.ops import auth, explain, health, replay
from shared.ops.cursor import decode_cursor, encode_cursor
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    ActivateRequest,
    ActivationResult,
    ApprovalLink,
    ApprovalList,
    ApprovalView,
    BootstrapRequest,
    BreakerStatus,
    BudgetStatus,
    CancelRequest,
    CancelResult,
    Charge,
    ConnectionCreate,
    ConnectionList,
    ConnectionSummary,
    Credits,
    CronTick,
    CronTickList,
    DeactivateRequest,
    DecisionRequest,
    DecisionResult,
    DefinitionProblem,
    ErrorBody,
    FieldProblem,
    HealthReport,
    InstallConfirm,
    InstallConfirmed,
    InstallRequest,
    InstallStarted,
    LeaseView,
    LedgerEntry,
    LineageEntry,
    LinkRequest,
    PageQuery,
    ProviderAppReport,
    PublishResult,
    RecordExplanation,
    RecordQuery,
    RecordSearch,
    RecordSearchQuery,
    Refusal,
    RefusalPage,
    RefusalsQuery,
    RehearsalRequest,
    RehearsalResult,
    ReplayRequest,
    ReplayResult,
    RequeueResult,
    ResumeRequest,
    RetryRequest,
    RetryResult,
    RunDetail,
    RunPage,
    RunsQuery,
    RunSummary,
    StepView,
    StuckInboxList,
    StuckInboxQuery,
    Tenant,
    TenantCreate,
    TenantList,
    TicksQuery,
    TokenCreate,
    TokenList,
    TokenMinted,
    TokenSummary,
    TriggerStatus,
    UnroutedPortal,
    ValidationResult,
    VersionList,
    VersionSummary,
    WorkflowList,
    WorkflowSource,
    WorkflowSummary,
)
from shared.publishing import versions
from shared.publishing.validate import (
    DefinitionInvalid,
    ValidationReport,
    validate_text,
)
from shared.triggers import cron

SQL = queries.load("ops")
RUNS_LIST = SQL["ops_runs_list"]
RUN_GET = SQL["ops_run_get"]
RUN_STEPS = SQL["ops_run_steps"]
RUN_LEASES = SQL["ops_run_leases"]
RUN_CHARGES = SQL["ops_run_charges"]
LINEAGE_RUNS = SQL["ops_lineage_runs"]
REFUSALS_LIST = SQL["ops_refusals_list"]
CREDIT_BALANCE = SQL["ops_credit_balance"]
CREDIT_LEDGER = SQL["ops_credit_ledger"]
WORKFLOWS_LIST = SQL["ops_workflows_list"]
WORKFLOW_GET = SQL["ops_workflow_get"]
WORKFLOW_VERSIONS = SQL["ops_workflow_versions"]
APPROVALS_OPEN = SQL["ops_approvals_open"]
TENANT_INSERT = SQL["ops_tenant_insert"]
TENANTS_LIST = SQL["ops_tenants_list"]
CONNECTIONS_LIST = SQL["ops_connections_list"]
TOKENS_LIST = SQL["ops_tokens_list"]
TOKEN_GET = SQL["ops_token_get"]
TOKEN_REVOKE = SQL["ops_token_revoke"]
MAX_APPROVALS_LISTED = 500
INBOX_REQUEUE_DEAD = queries.load("inbox")["inbox_requeue_dead"]

SOURCE_NAME = "source"
# Requests are small JSON documents; a workflow source is at most 64 KiB of it.
MAX_BODY_BYTES = 96 * 1024

log = get_logger(__name__)


@dataclass(frozen=True)
class Call:
    """One authenticated, validated request, as a handler sees it."""

    db: Database
    principal: auth.Principal
    path: Mapping[str, str]
    query: Any
    body: Any
    dispatch: replay.Dispatch

    @property
    def scope(self) -> str | None:
        return self.principal.tenant_id


Handler = Callable[[Call], BaseModel]


class EmptyQuery(BaseModel):
    model_config = {"extra": "forbid"}


class CreditsQuery(PageQuery):
    tenant_id: str | None = None


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    path: str  # OpenAPI form: /v1/runs/{run_id}
    handler: Handler
    response: type[BaseModel]
    summary: str
    query: type[BaseModel] = EmptyQuery
    body: type[BaseModel] | None = None
    status: int = 200
    errors: tuple[int, ...] = ()
    path_params: tuple[str, ...] = field(default=())
    # For a 303: where the answer sends the client, taken from the result.
    location: Callable[[Any], str] | None = None

    @property
    def mutating(self) -> bool:
        return self.method != "GET"


def _uuid_param(call: Call, name: str, what: str) -> str:
    """A path id; one that is not a UUID names nothing, so it is a 404 like any unknown id."""
    try:
        return str(UUID(call.path[name]))
    except ValueError:
        raise not_found(what) from None


def _int_param(call: Call, name: str, what: str) -> int:
    """A numeric path id; anything else names nothing (404)."""
    raw = call.path[name]
    if not raw.isascii() or not raw.isdigit() or not 0 < int(raw) < 2**63:
        raise not_found(what)
    return int(raw)


# ---- events and inbox rows that never reached a decision ------------------------------------


def requeue_event(call: Call) -> RequeueResult:
    """An undelivered (or still undecided) trigger event back into the outbox, its redelivery
    budget reset. Repeating it is harmless: admission decides each pairing once."""
    from shared.ingest.outbox import requeue_event as requeue

    event_id = _int_param(call, "event_id", "undecided event")
    with call.db.transaction() as tx:
        if not requeue(tx, event_id=event_id, tenant_id=call.scope):
            raise not_found("undecided event")
    return RequeueResult(id=event_id)


def list_stuck_inbox(call: Call) -> StuckInboxList:
    q: StuckInboxQuery = call.query
    with call.db.transaction() as tx:
        rows = tx.all(
            explain.STUCK_INBOX,
            tenant_id=call.scope,
            connection_id=str(q.connection_id) if q.connection_id else None,
            limit=q.limit,
        )
    return StuckInboxList(rows=explain.stuck_inbox_rows(rows))


def requeue_inbox_row(call: Call) -> RequeueResult:
    """A dead inbox row back to pending with a fresh attempt budget; the drain takes it."""
    inbox_id = _int_param(call, "inbox_id", "dead inbox row")
    with call.db.transaction() as tx:
        if tx.one(INBOX_REQUEUE_DEAD, inbox_id=inbox_id, tenant_id=call.scope) is None:
            raise not_found("dead inbox row")
    return RequeueResult(id=inbox_id)


def provider_app_report(call: Call) -> ProviderAppReport:
    """An app spans tenants (one URL for every portal that installed it): operator only; a
    tenant's token gets the 404 an unknown app gets."""
    from shared.accounts import provider_apps
    from shared.publishing.subscriptions import last_app_reconcile

    if call.scope is not None:
        raise not_found("provider app")
    with call.db.transaction() as tx:
        app = provider_apps.get_app(tx, "hubspot", call.path["app_id"])
        if app is None:
            raise not_found("provider app")
        unrouted = provider_apps.unrouted_summary(tx, app.provider, app.app_id)
    last = last_app_reconcile(call.db, app.provider, app.app_id)
    return ProviderAppReport(
        provider=app.provider,
        app_id=app.app_id,
        kind=app.kind,
        unrouted=[UnroutedPortal.model_validate(row) for row in unrouted],
        subscriptions=dict(last) if last else None,
    )


def install_app(call: Call) -> InstallStarted:
    """Start installing the HubSpot app on a portal for a tenant (shared/ops/installs.py)."""
    from shared.ops import installs

    return installs.start(call.db, call.principal, call.path["app_id"], call.body)


def confirm_app_install(call: Call) -> InstallConfirmed:
    """Confirm an install with the code its callback page showed (shared/ops/installs.py)."""
    from shared.ops import installs

    return installs.confirm(call.db, call.principal, call.path["app_id"], call.body)


# ---- runs ---------------------------------------------------------------------------------


def list_runs(call: Call) -> RunPage:
    q: RunsQuery = call.query
    cur = decode_cursor(q.cursor, {"at": datetime, "id": UUID})
    with call.db.transaction() as tx:
        rows = tx.all(
            RUNS_LIST,
            tenant_id=call.scope,
            workflow_id=str(q.workflow_id) if q.workflow_id else None,
            status=q.status,
            record_key=q.record_key,
            created_after=q.created_after,
            created_before=q.created_before,
            event_type=q.event_type,
            cursor_at=cur["at"] if cur else None,
            cursor_id=cur["id"] if cur else None,
            limit=q.limit + 1,
        )
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    next_cursor = (
        encode_cursor({"at": rows[-1]["created_at"].isoformat(), "id": str(rows[-1]["id"])})
        if more
        else None
    )
    return RunPage(items=[RunSummary.model_validate(r) for r in rows], next_cursor=next_cursor)


def run_detail(db: Database, run_id: str, scope: str | None, namespace: str = "live") -> RunDetail:
    with db.transaction() as tx:
        run = tx.one(RUN_GET, run_id=run_id, namespace=namespace, tenant_id=scope)
        if run is None:
            raise not_found("run")
        steps = tx.all(RUN_STEPS, run_id=run_id)
        leases: dict[UUID, list[LeaseView]] = {}
        for lease in tx.all(RUN_LEASES, run_id=run_id):
            leases.setdefault(lease["step_id"], []).append(LeaseView.model_validate(lease))
        keys = [s["idempotency_key"] for s in steps if s["idempotency_key"]]
        charges = tx.all(RUN_CHARGES, run_id=run_id, keys=keys)
        lineage = tx.all(LINEAGE_RUNS, lineage_root=str(run["lineage_root"]))
    return RunDetail(
        run=RunSummary.model_validate(run),
        version_number=run["version_number"],
        dedup_mode=run["dedup_mode"],
        namespace=run["namespace"],
        trigger_payload=run["trigger_payload"],
        payload_truncated=run["payload_truncated"],
        steps=[StepView.model_validate({**s, "leases": leases.get(s["id"], [])}) for s in steps],
        charges=[Charge.model_validate(c) for c in charges],
        lineage=[LineageEntry.model_validate(r) for r in lineage],
    )


def get_run(call: Call) -> RunDetail:
    return run_detail(call.db, _uuid_param(call, "run_id", "run"), call.scope)


def replay_failed_run(call: Call) -> ReplayResult:
    outcome = replay.replay_run(
        call.db,
        run_id=_uuid_param(call, "run_id", "run"),
        tenant_scope=call.scope,
        dispatch=call.dispatch,
    )
    detail = run_detail(call.db, outcome.run_id, call.scope)
    return ReplayResult(
        run=detail.run,
        copied_steps=[s.step_key for s in outcome.plan.copy],
        reset_steps=[s.step_key for s in outcome.plan.reset],
        restarted_steps=[s.step_key for s in outcome.plan.restart],
    )


def cancel_live_run(call: Call) -> CancelResult:
    """Stop a running run (shared/steps/cancel.py). A run that already ended is a 409 that
    says how and when ("already cancelled by X at T")."""
    from shared.steps.cancel import cancel_run

    body: CancelRequest = call.body
    run_id = _uuid_param(call, "run_id", "run")
    outcome = cancel_run(
        call.db, run_id, by=call.principal.label, reason=body.reason, tenant_scope=call.scope
    )
    if outcome is None:
        raise not_found("run")
    if not outcome.moved:
        raise OpsError(409, "run_not_running", outcome.why_not or "the run is not running")
    return CancelResult(
        run=run_detail(call.db, run_id, call.scope).run,
        skipped_steps=list(outcome.skipped_steps),
        running_steps=list(outcome.running_steps),
    )


def retry_failed_run(call: Call) -> RetryResult:
    outcome = replay.retry_run(
        call.db,
        run_id=_uuid_param(call, "run_id", "run"),
        tenant_scope=call.scope,
        dispatch=call.dispatch,
    )
    return RetryResult(
        run_id=UUID(outcome.run_id), restarted_steps=[s.step_key for s in outcome.plan.restart]
    )


# ---- approvals ----------------------------------------------------------------------------


def list_approvals(call: Call) -> ApprovalList:
    """The approvals waiting for a decision that the caller may decide."""
    from shared.steps.parks import may_decide

    with call.db.transaction() as tx:
        rows = tx.all(APPROVALS_OPEN, tenant_id=call.scope, limit=MAX_APPROVALS_LISTED)
    mine = [r for r in rows if may_decide(r, user=call.principal.label, roles=call.principal.roles)]
    return ApprovalList(
        items=[
            ApprovalView.model_validate({**r, "approver_users": list(r["approver_users"] or ())})
            for r in mine
        ]
    )


def _decide(call: Call, decision: str) -> DecisionResult:
    from shared.steps.parks import NotAllowed, decide_approval, park_row

    body: DecisionRequest = call.body
    approval_id = _int_param(call, "approval_id", "approval")
    try:
        outcome = decide_approval(
            call.db,
            approval_id,
            decision=decision,
            user=call.principal.label,
            roles=call.principal.roles,
            comment=body.comment,
            tenant_scope=call.scope,
        )
    except NotAllowed as exc:
        raise OpsError(403, "not_an_approver", str(exc)) from None
    if outcome is None:
        raise not_found("approval")
    if outcome.expired is not None:
        # Past its expiry only the deadline decides (on_timeout), as the signed link says.
        raise OpsError(410, "approval_expired", f"{outcome.expired}; no decision is taken")
    if not outcome.moved:
        raise OpsError(409, "already_decided", outcome.why_not or "the approval is not waiting")
    if outcome.step_id is not None:
        replay.dispatch_committed(call.dispatch, (outcome.step_id,))
    with call.db.transaction() as tx:
        park = park_row(tx, approval_id)
    assert park is not None
    return DecisionResult(
        approval_id=approval_id,
        decision=decision,
        decided_by=call.principal.label,
        run_id=UUID(park["run_id"]),
        step_key=park["step_key"],
    )


def approval_link(call: Call) -> ApprovalLink:
    """A signed link for one of the users an approval names, to decide it without a token."""
    from shared.ops.approval_links import make_link, public_url
    from shared.steps.parks import park_row

    body: LinkRequest = call.body
    approval_id = _int_param(call, "approval_id", "approval")
    with call.db.transaction() as tx:
        park = park_row(tx, approval_id, call.scope)
    if park is None or park["kind"] != "approval":
        raise not_found("approval")
    if body.user not in (park["approver_users"] or ()):
        raise OpsError(
            422,
            "not_an_approver",
            f"{body.user!r} is not among the users this approval names; a link is for one of them",
        )
    if park["resumed_at"] is not None:
        raise OpsError(409, "already_decided", "this approval is no longer waiting")
    link = make_link(approval_id, body.user, park["deadline"])
    return ApprovalLink(
        path=link.path, url=public_url(link), user=body.user, expires_at=park["deadline"]
    )


def approve(call: Call) -> DecisionResult:
    return _decide(call, "approved")


def reject(call: Call) -> DecisionResult:
    return _decide(call, "rejected")


# ---- refusals and "why didn't it run?" ----------------------------------------------------


def list_refusals(call: Call) -> RefusalPage:
    q: RefusalsQuery = call.query
    cur = decode_cursor(q.cursor, {"id": int})
    with call.db.transaction() as tx:
        rows = tx.all(
            REFUSALS_LIST,
            tenant_id=call.scope,
            workflow_id=str(q.workflow_id) if q.workflow_id else None,
            record_key=q.record_key,
            event_id=q.event_id,
            cursor_id=cur["id"] if cur else None,
            limit=q.limit + 1,
        )
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    items = [
        Refusal.model_validate({**r, "explanation": explain.explain_reason(r["reason"])})
        for r in rows
    ]
    return RefusalPage(
        items=items, next_cursor=encode_cursor({"id": rows[-1]["id"]}) if more else None
    )


def explain_record(call: Call) -> RecordExplanation:
    from shared.port.record_labels import shown_for

    q: RecordQuery = call.query
    with call.db.transaction() as tx:
        found = explain.explain_record(tx, record_key=q.record_key, tenant_scope=call.scope)
        shown = shown_for(tx, [found.record_key])
    return found.model_copy(update={"record_label": shown.get(found.record_key)})


def search_records(call: Call) -> RecordSearch:
    from shared.ops import search

    q: RecordSearchQuery = call.query
    with call.db.transaction() as tx:
        return search.search(tx, q.q, tenant_scope=call.scope)


# ---- credits ------------------------------------------------------------------------------


def credits(call: Call) -> Credits:
    q: CreditsQuery = call.query
    tenant_id = q.tenant_id or call.scope
    if tenant_id is None:
        raise OpsError(422, "tenant_required", "an admin token must name the tenant_id")
    if call.scope is not None and tenant_id != call.scope:
        raise not_found("tenant")
    cur = decode_cursor(q.cursor, {"id": int})
    with call.db.transaction() as tx:
        balance = tx.scalar(CREDIT_BALANCE, tenant_id=tenant_id)
        if balance is None:
            raise not_found("tenant")
        rows = tx.all(
            CREDIT_LEDGER,
            tenant_id=tenant_id,
            cursor_id=cur["id"] if cur else None,
            limit=q.limit + 1,
        )
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    return Credits(
        tenant_id=tenant_id,
        balance=int(balance),
        ledger=[LedgerEntry.model_validate(r) for r in rows],
        next_cursor=encode_cursor({"id": rows[-1]["id"]}) if more else None,
    )


# ---- workflows ----------------------------------------------------------------------------


def list_workflows(call: Call) -> WorkflowList:
    with call.db.transaction() as tx:
        rows = tx.all(WORKFLOWS_LIST, tenant_id=call.scope)
    return WorkflowList(items=[WorkflowSummary.model_validate(r) for r in rows])


def list_versions(call: Call) -> VersionList:
    workflow_id = _uuid_param(call, "workflow_id", "workflow")
    with call.db.transaction() as tx:
        if tx.one(WORKFLOW_GET, workflow_id=workflow_id, tenant_id=call.scope) is None:
            raise not_found("workflow")
        rows = tx.all(WORKFLOW_VERSIONS, workflow_id=workflow_id)
    return VersionList(
        workflow_id=UUID(workflow_id), items=[VersionSummary.model_validate(r) for r in rows]
    )


def list_cron_ticks(call: Call) -> CronTickList:
    workflow_id = _uuid_param(call, "workflow_id", "workflow")
    with call.db.transaction() as tx:
        if tx.one(WORKFLOW_GET, workflow_id=workflow_id, tenant_id=call.scope) is None:
            raise not_found("workflow")
        rows = cron.list_ticks(tx, workflow_id, status=call.query.status, limit=call.query.limit)
    return CronTickList(
        workflow_id=UUID(workflow_id), items=[CronTick.model_validate(r) for r in rows]
    )


def trigger_status(call: Call) -> TriggerStatus:
    workflow_id = _uuid_param(call, "workflow_id", "workflow")
    with call.db.transaction() as tx:
        if tx.one(WORKFLOW_GET, workflow_id=workflow_id, tenant_id=call.scope) is None:
            raise not_found("workflow")
        definition = versions.active_definition(tx, workflow_id)
        if definition is None:
            return TriggerStatus(workflow_id=UUID(workflow_id), active=False, kind=None, detail={})
        kind, detail = triggers.status(tx, definition.trigger, workflow_id)
    return TriggerStatus(workflow_id=UUID(workflow_id), active=True, kind=kind, detail=detail)


def _problems_of(report: ValidationReport) -> list[DefinitionProblem]:
    return [
        DefinitionProblem(
            severity=p.severity, path=p.where, message=p.message, line=p.line, column=p.column
        )
        for p in report.problems
    ]


def validate_workflow(call: Call) -> ValidationResult:
    body: WorkflowSource = call.body
    report = validate_text(body.source, SOURCE_NAME)
    problems = _problems_of(report)
    if (
        report.definition is not None
        and call.scope is not None
        and report.definition.tenant != call.scope
    ):
        problems.insert(
            0,
            DefinitionProblem(
                severity="error",
                path="tenant",
                line=None,
                column=None,
                message=f"this definition is for tenant {report.definition.tenant!r}, not yours",
            ),
        )
    return ValidationResult(
        valid=not any(p.severity == "error" for p in problems), problems=problems
    )


def _definition_invalid(report: ValidationReport) -> OpsError:
    return OpsError(
        422,
        "definition_invalid",
        str(DefinitionInvalid(report)),
        [
            FieldProblem(
                location=f"body.source:{p.line or 0}:{p.column or 0} {p.where}".rstrip(),
                problem=p.message,
            )
            for p in report.errors
        ],
    )


def publish_workflow(call: Call) -> PublishResult:
    body: WorkflowSource = call.body
    # Checked before the transaction too, so that YAML the reader refuses outright is a 422.
    checked = validate_text(body.source, SOURCE_NAME)
    if not checked.ok:
        raise _definition_invalid(checked)
    try:
        with call.db.transaction() as tx:
            published = versions.publish(
                tx, body.source, tenant_id=call.scope, filename=SOURCE_NAME
            )
    except DefinitionInvalid as exc:
        raise _definition_invalid(exc.report) from None
    return PublishResult(
        workflow_id=UUID(published.workflow_id),
        version_id=UUID(published.version_id),
        number=published.number,
        content_hash=published.content_hash,
        created=published.created,
        warnings=_problems_of(published.report),
    )


def _owned_workflow(call: Call, workflow_id: str) -> dict[str, Any]:
    with call.db.transaction() as tx:
        row = tx.one(WORKFLOW_GET, workflow_id=workflow_id, tenant_id=call.scope)
    if row is None:
        raise not_found("workflow")
    return row


def activate_workflow(call: Call) -> ActivationResult:
    body: ActivateRequest = call.body
    workflow = _owned_workflow(call, _uuid_param(call, "workflow_id", "workflow"))
    try:
        with call.db.transaction() as tx:
            activation = versions.activate(
                tx,
                tenant_id=workflow["tenant_id"],
                workflow_id=str(workflow["id"]),
                version_id=str(body.version_id),
            )
    except versions.WorkflowNotFound:
        raise not_found("workflow") from None
    except versions.VersionNotFound:
        raise not_found("version") from None
    except DefinitionInvalid as exc:  # the database refuses its trigger (e.g. no index)
        raise _definition_invalid(exc.report) from None
    _reconcile_subscriptions_now(call.db, workflow["tenant_id"])
    return ActivationResult(
        workflow_id=UUID(activation.workflow_id), active_version_id=UUID(activation.version_id)
    )


def _breaker_status(call: Call, workflow_id: str) -> BreakerStatus:
    from shared.gates import breaker

    with call.db.transaction() as tx:
        row = breaker.status(tx, workflow_id)
    return BreakerStatus.model_validate(
        {**row, "explanation": explain.explain_breaker(row["state"], row["reason"])}
    )


def get_breaker(call: Call) -> BreakerStatus:
    workflow = _owned_workflow(call, _uuid_param(call, "workflow_id", "workflow"))
    return _breaker_status(call, str(workflow["id"]))


def get_budget(call: Call) -> BudgetStatus:
    from shared.gates import budgets

    workflow = _owned_workflow(call, _uuid_param(call, "workflow_id", "workflow"))
    with call.db.transaction() as tx:
        return BudgetStatus.model_validate(budgets.workflow_summary(tx, str(workflow["id"])))


def resume_workflow(call: Call) -> BreakerStatus:
    """Close (or half-open) a workflow's open circuit breaker; 409 when it is not open."""
    from shared.gates import breaker

    body: ResumeRequest = call.body
    workflow = _owned_workflow(call, _uuid_param(call, "workflow_id", "workflow"))
    workflow_id = str(workflow["id"])
    with call.db.transaction() as tx:
        moved = breaker.resume(tx, workflow_id, half_open=body.half_open)
    if moved is None:
        raise OpsError(409, "not_paused", f"workflow {workflow_id}'s circuit breaker is not open")
    return _breaker_status(call, workflow_id)


def deactivate_workflow(call: Call) -> ActivationResult:
    workflow = _owned_workflow(call, _uuid_param(call, "workflow_id", "workflow"))
    try:
        with call.db.transaction() as tx:
            versions.deactivate(
                tx, tenant_id=workflow["tenant_id"], workflow_id=str(workflow["id"])
            )
    except versions.WorkflowNotFound:
        raise not_found("workflow") from None
    _reconcile_subscriptions_now(call.db, workflow["tenant_id"])
    return ActivationResult(workflow_id=workflow["id"], active_version_id=None)


def _reconcile_subscriptions_now(db: Database, tenant_id: str) -> None:
    """The provider subscriptions the change needs, at once (after the commit). Best effort:
    the activation stands either way, each outcome is recorded, and the hourly sweep repairs
    what failed here."""
    from shared.providers.connect import port_for, port_for_app
    from shared.publishing.subscriptions import reconcile_tenant

    try:
        reconcile_tenant(db, tenant_id, port_for, port_for_app)
    except Exception:
        log.warning("subscription reconcile after an activation failed", exc_info=True)


# ---- rehearsals ---------------------------------------------------------------------------


def rehearse(call: Call) -> RehearsalResult:
    from shared.ops import rehearsal

    body: RehearsalRequest = call.body
    _owned_workflow(call, str(body.workflow_id))
    start = rehearsal.start_rehearsal(call.db, body, call.scope)
    rehearsal.drive_rehearsal(call.db, start.run_id)
    return rehearsal.rehearsal_result(call.db, start.run_id)


# ---- health -------------------------------------------------------------------------------


def get_health(call: Call) -> HealthReport:
    return health.health_report(call.db, call.principal)


# ---- tenants, connections and ops tokens --------------------------------------------------


def _admin_only(call: Call, what: str) -> None:
    if not call.principal.is_admin:
        raise OpsError(403, "admin_required", f"{what} needs an admin token")


def _tenant_of(call: Call, named: str | None) -> str:
    """The tenant a create names: a tenant token's own (naming another is a 404, as for any
    id of another tenant); an admin token must name one, and it must exist."""
    tenant_id = named or call.scope
    if tenant_id is None:
        raise OpsError(422, "tenant_required", "an admin token must name the tenant_id")
    if call.scope is not None and tenant_id != call.scope:
        raise not_found("tenant")
    with call.db.transaction() as tx:
        if tx.one(auth.TENANT_EXISTS, tenant_id=tenant_id) is None:
            raise not_found("tenant")
    return tenant_id


def create_tenant(call: Call) -> Tenant:
    """A tenant, with the credits it starts with: admin only (a tenant token is one tenant's)."""
    _admin_only(call, "creating a tenant")
    body: TenantCreate = call.body
    with call.db.transaction() as tx:
        row = tx.one(TENANT_INSERT, tenant_id=body.id, name=body.name or body.id)
        if row is None:
            raise OpsError(409, "tenant_exists", f"a tenant named {body.id!r} exists")
        balance = credit_ledger.grant(tx, body.id, body.credits) if body.credits else 0
    return Tenant.model_validate({**row, "credit_balance": balance})


def list_tenants(call: Call) -> TenantList:
    with call.db.transaction() as tx:
        rows = tx.all(TENANTS_LIST, tenant_id=call.scope)
    return TenantList(items=[Tenant.model_validate(r) for r in rows])


def create_connection(call: Call) -> ConnectionSummary:
    """A CRM connection of a tenant. It names environment variables, never secrets."""
    body: ConnectionCreate = call.body
    tenant_id = _tenant_of(call, body.tenant_id)
    with call.db.transaction() as tx:
        connection_id = connections.create_connection(
            tx,
            tenant_id=tenant_id,
            provider=body.provider,
            webhook_secret_env=body.webhook_secret_env,
            api_credentials_env=body.api_credentials_env,
            api_base_url=body.api_base_url,
            provider_account_id=body.provider_account_id,
            watched_fields=body.watched_fields,
            provider_app_id=body.provider_app_id,
        )
        rows = tx.all(CONNECTIONS_LIST, tenant_id=tenant_id)
    return next(ConnectionSummary.model_validate(r) for r in rows if str(r["id"]) == connection_id)


def list_connections(call: Call) -> ConnectionList:
    with call.db.transaction() as tx:
        rows = tx.all(CONNECTIONS_LIST, tenant_id=call.scope)
    return ConnectionList(items=[ConnectionSummary.model_validate(r) for r in rows])


def create_token(call: Call) -> TokenMinted:
    """Mint a token, shown once in the answer (the audit row keeps its id, never the token).
    Admin only: a tenant token that could mint tokens could mint itself any role."""
    _admin_only(call, "minting a token")
    body: TokenCreate = call.body
    if body.admin == (body.tenant_id is not None):
        raise OpsError(422, "scope_required", "name exactly one of tenant_id and admin")
    if body.admin and body.roles:
        raise OpsError(422, "roles_need_tenant", "roles are a tenant's; an admin token has none")
    if body.expires_at is not None and body.expires_at <= datetime.now(UTC):
        raise OpsError(422, "expired", "expires_at is in the past")
    if body.tenant_id is not None:
        _tenant_of(call, body.tenant_id)
    with call.db.transaction() as tx:
        token, token_id = auth.mint_token(
            tx,
            tenant_id=body.tenant_id,
            label=body.label,
            roles=tuple(body.roles),
            expires_at=body.expires_at,
            created_by=call.principal.token_id,
        )
        row = tx.one(TOKEN_GET, token_id=token_id, tenant_id=None)
    return TokenMinted(token=token, details=TokenSummary.model_validate(row))


def list_tokens(call: Call) -> TokenList:
    with call.db.transaction() as tx:
        rows = tx.all(TOKENS_LIST, tenant_id=call.scope)
    return TokenList(items=[TokenSummary.model_validate(r) for r in rows])


def revoke_token(call: Call) -> TokenSummary:
    """Revoke a token at once (its next request is a 401). A tenant token may revoke its own
    tenant's tokens, itself included: revoking only ever takes access away."""
    token_id = _uuid_param(call, "token_id", "token")
    with call.db.transaction() as tx:
        row = tx.one(TOKEN_REVOKE, token_id=token_id, tenant_id=call.scope)
        if row is None:
            existing = tx.one(TOKEN_GET, token_id=token_id, tenant_id=call.scope)
            if existing is None:
                raise not_found("token")
            raise OpsError(
                409, "already_revoked", f"token {token_id} was revoked at {existing['revoked_at']}"
            )
    return TokenSummary.model_validate(row)


def bootstrap_token(call: Call) -> TokenMinted:
    """Never called through `run_route`: OpsApi.bootstrap answers this route (it has no
    principal until it has minted one)."""
    raise AssertionError("POST /v1/bootstrap is answered by OpsApi.bootstrap")


# ---- the route table ----------------------------------------------------------------------

ROUTES: tuple[Route, ...] = (
    Route(
        "runs.list",
        "GET",
        "/v1/runs",
        list_runs,
        RunPage,
        "List live runs; status=failed is the dead-letter list",
        query=RunsQuery,
        errors=(400, 401),
    ),
    Route(
        "runs.get",
        "GET",
        "/v1/runs/{run_id}",
        get_run,
        RunDetail,
        "One run with its whole step journal, charges and replay lineage",
        errors=(401, 404),
        path_params=("run_id",),
    ),
    Route(
        "runs.replay",
        "POST",
        "/v1/runs/{run_id}/replay",
        replay_failed_run,
        ReplayResult,
        "Replay a failed or cancelled run as a new linked run (invariant 12)",
        body=ReplayRequest,
        status=201,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("run_id",),
    ),
    Route(
        "runs.retry",
        "POST",
        "/v1/runs/{run_id}/retry",
        retry_failed_run,
        RetryResult,
        "Retry a failed run in place, after its cause was fixed",
        body=RetryRequest,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("run_id",),
    ),
    Route(
        "runs.cancel",
        "POST",
        "/v1/runs/{run_id}/cancel",
        cancel_live_run,
        CancelResult,
        "Cancel a running run: pending and parked steps are skipped, a running step finishes"
        " its attempt and nothing follows it",
        body=CancelRequest,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("run_id",),
    ),
    Route(
        "approvals.list",
        "GET",
        "/v1/approvals",
        list_approvals,
        ApprovalList,
        "Approvals waiting for a decision that the caller may decide",
        errors=(401,),
    ),
    Route(
        "approvals.link",
        "POST",
        "/v1/approvals/{approval_id}/links",
        approval_link,
        ApprovalLink,
        "A signed link for a named approver to decide without an ops token",
        body=LinkRequest,
        status=201,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("approval_id",),
    ),
    Route(
        "approvals.approve",
        "POST",
        "/v1/approvals/{approval_id}/approve",
        approve,
        DecisionResult,
        "Approve a waiting approval; the first decision wins",
        body=DecisionRequest,
        errors=(400, 401, 403, 404, 409, 410, 413, 422),
        path_params=("approval_id",),
    ),
    Route(
        "approvals.reject",
        "POST",
        "/v1/approvals/{approval_id}/reject",
        reject,
        DecisionResult,
        "Reject a waiting approval; the first decision wins",
        body=DecisionRequest,
        errors=(400, 401, 403, 404, 409, 410, 413, 422),
        path_params=("approval_id",),
    ),
    Route(
        "refusals.list",
        "GET",
        "/v1/refusals",
        list_refusals,
        RefusalPage,
        "Admission refusals by record, event or workflow",
        query=RefusalsQuery,
        errors=(400, 401),
    ),
    Route(
        "records.explain",
        "GET",
        "/v1/records/explain",
        explain_record,
        RecordExplanation,
        "Why did (or didn't) my workflow run for this record?",
        query=RecordQuery,
        errors=(400, 401, 404, 422),
    ),
    Route(
        "records.search",
        "GET",
        "/v1/records/search",
        search_records,
        RecordSearch,
        "Find records by HubSpot record URL, object id, email or record key, within your"
        " connections",
        query=RecordSearchQuery,
        errors=(400, 401, 422),
    ),
    Route(
        "events.requeue",
        "POST",
        "/v1/events/{event_id}/requeue",
        requeue_event,
        RequeueResult,
        "Publish an undelivered trigger event again, with a fresh redelivery budget",
        errors=(401, 404),
        path_params=("event_id",),
    ),
    Route(
        "inbox.stuck",
        "GET",
        "/v1/inbox/stuck",
        list_stuck_inbox,
        StuckInboxList,
        "Webhooks that will not be drained by themselves (dead) or ever (rejected)",
        query=StuckInboxQuery,
        errors=(400, 401),
    ),
    Route(
        "inbox.requeue",
        "POST",
        "/v1/inbox/{inbox_id}/requeue",
        requeue_inbox_row,
        RequeueResult,
        "Drain a dead inbox row again, with a fresh attempt budget",
        errors=(401, 404),
        path_params=("inbox_id",),
    ),
    Route(
        "apps.hubspot.get",
        "GET",
        "/v1/apps/hubspot/{app_id}",
        provider_app_report,
        ProviderAppReport,
        "A HubSpot app: portals it hears from that no connection takes, and its subscriptions",
        errors=(401, 404),
        path_params=("app_id",),
    ),
    Route(
        "apps.hubspot.install",
        "POST",
        "/v1/apps/hubspot/{app_id}/installs",
        install_app,
        InstallStarted,
        "Start installing the HubSpot app on a portal for a tenant: a 303 to HubSpot's authorize"
        " URL with a single-use state; HubSpot sends the browser back to the webhook function's"
        " /oauth/hubspot/callback",
        body=InstallRequest,
        status=303,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("app_id",),
        location=lambda started: str(started.authorize_url),
    ),
    Route(
        "apps.hubspot.install.confirm",
        "POST",
        "/v1/apps/hubspot/{app_id}/installs/confirm",
        confirm_app_install,
        InstallConfirmed,
        "Confirm an install with the code the callback page showed: only the ops token that"
        " started it, once, within 30 minutes; creates or re-authorizes the portal's connection",
        body=InstallConfirm,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("app_id",),
    ),
    Route(
        "credits.get",
        "GET",
        "/v1/credits",
        credits,
        Credits,
        "Credit balance and ledger",
        query=CreditsQuery,
        errors=(400, 401, 404, 422),
    ),
    Route(
        "workflows.list",
        "GET",
        "/v1/workflows",
        list_workflows,
        WorkflowList,
        "Workflows and their active versions",
        errors=(401,),
    ),
    Route(
        "workflows.versions",
        "GET",
        "/v1/workflows/{workflow_id}/versions",
        list_versions,
        VersionList,
        "A workflow's versions, newest first",
        errors=(401, 404),
        path_params=("workflow_id",),
    ),
    Route(
        "workflows.ticks",
        "GET",
        "/v1/workflows/{workflow_id}/ticks",
        list_cron_ticks,
        CronTickList,
        "A cron workflow's ticks, fired and missed, newest first",
        query=TicksQuery,
        errors=(400, 401, 404),
        path_params=("workflow_id",),
    ),
    Route(
        "workflows.trigger",
        "GET",
        "/v1/workflows/{workflow_id}/trigger",
        trigger_status,
        TriggerStatus,
        "The active trigger's state: missed ticks, a poll's last error, refused webhook posts",
        errors=(401, 404),
        path_params=("workflow_id",),
    ),
    Route(
        "workflows.validate",
        "POST",
        "/v1/workflows/validate",
        validate_workflow,
        ValidationResult,
        "Validate a definition without publishing it",
        body=WorkflowSource,
        errors=(400, 401, 413, 422),
    ),
    Route(
        "workflows.publish",
        "POST",
        "/v1/workflows",
        publish_workflow,
        PublishResult,
        "Publish a definition as a new immutable version",
        body=WorkflowSource,
        status=201,
        errors=(400, 401, 409, 413, 422),
    ),
    Route(
        "workflows.activate",
        "POST",
        "/v1/workflows/{workflow_id}/activate",
        activate_workflow,
        ActivationResult,
        "Activate a version (rebinds its triggers)",
        body=ActivateRequest,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("workflow_id",),
    ),
    Route(
        "workflows.deactivate",
        "POST",
        "/v1/workflows/{workflow_id}/deactivate",
        deactivate_workflow,
        ActivationResult,
        "Deactivate a workflow (unbinds its triggers)",
        body=DeactivateRequest,
        errors=(400, 401, 404, 413, 422),
        path_params=("workflow_id",),
    ),
    Route(
        "workflows.breaker",
        "GET",
        "/v1/workflows/{workflow_id}/breaker",
        get_breaker,
        BreakerStatus,
        "The workflow's circuit breaker: closed, open (paused) or half-open, and why",
        errors=(401, 404),
        path_params=("workflow_id",),
    ),
    Route(
        "workflows.budget",
        "GET",
        "/v1/workflows/{workflow_id}/budget",
        get_budget,
        BudgetStatus,
        "The workflow's spend budget: its cap and the reserved, spent and released credits",
        errors=(401, 404),
        path_params=("workflow_id",),
    ),
    Route(
        "workflows.resume",
        "POST",
        "/v1/workflows/{workflow_id}/resume",
        resume_workflow,
        BreakerStatus,
        "Resume a workflow its circuit breaker paused (closed, or half-open on trial)",
        body=ResumeRequest,
        errors=(400, 401, 404, 409, 413, 422),
        path_params=("workflow_id",),
    ),
    Route(
        "rehearsals.create",
        "POST",
        "/v1/rehearsals",
        rehearse,
        RehearsalResult,
        "Dry-run a workflow version against a stored or supplied event",
        body=RehearsalRequest,
        status=201,
        errors=(400, 401, 404, 409, 413, 422),
    ),
    Route(
        "tenants.create",
        "POST",
        "/v1/tenants",
        create_tenant,
        Tenant,
        "Create a tenant with the credits it starts with (admin tokens only)",
        body=TenantCreate,
        status=201,
        errors=(400, 401, 403, 409, 413, 422),
    ),
    Route(
        "tenants.list",
        "GET",
        "/v1/tenants",
        list_tenants,
        TenantList,
        "Tenants (a tenant token sees its own), with their credits and counts",
        errors=(401,),
    ),
    Route(
        "connections.create",
        "POST",
        "/v1/connections",
        create_connection,
        ConnectionSummary,
        "Connect a tenant's CRM account: the names of the environment variables holding its"
        " secrets, never the secrets",
        body=ConnectionCreate,
        status=201,
        errors=(400, 401, 404, 409, 413, 422),
    ),
    Route(
        "connections.list",
        "GET",
        "/v1/connections",
        list_connections,
        ConnectionList,
        "The caller's connections (every tenant's for an admin token)",
        errors=(401,),
    ),
    Route(
        "tokens.create",
        "POST",
        "/v1/tokens",
        create_token,
        TokenMinted,
        "Mint an ops token (admin tokens only): shown once, stored as its SHA-256",
        body=TokenCreate,
        status=201,
        errors=(400, 401, 403, 404, 413, 422),
    ),
    Route(
        "tokens.list",
        "GET",
        "/v1/tokens",
        list_tokens,
        TokenList,
        "Ops tokens (never the token itself): who holds each, roles, expiry, revocation",
        errors=(401,),
    ),
    Route(
        "tokens.revoke",
        "POST",
        "/v1/tokens/{token_id}/revoke",
        revoke_token,
        TokenSummary,
        "Revoke an ops token: its next request is refused",
        errors=(401, 404, 409),
        path_params=("token_id",),
    ),
    Route(
        "ops.bootstrap",
        "POST",
        "/v1/bootstrap",
        bootstrap_token,
        TokenMinted,
        "Mint the deployment's first admin token, once, with the bootstrap secret"
        " (ONCEFLOW_OPS_BOOTSTRAP_SECRET) as the bearer token instead of an ops token",
        body=BootstrapRequest,
        status=201,
        errors=(400, 401, 409, 413, 422),
    ),
    Route(
        "health.get",
        "GET",
        "/v1/health",
        get_health,
        HealthReport,
        "Is the machinery running? Scheduler jobs, backlog ages and dead letters (admins);"
        " connection credentials (scoped to the caller's tenant)",
        errors=(401,),
    ),
)

_URL_MAP = Map(
    [
        Rule(r.path.replace("{", "<").replace("}", ">"), endpoint=r.name, methods=[r.method])
        for r in ROUTES
    ]
    + [Rule("/openapi.json", endpoint="openapi", methods=["GET"])],
    strict_slashes=False,
)
ROUTE_BY_NAME = {r.name: r for r in ROUTES}


# ---- request handling ---------------------------------------------------------------------


def json_response(
    model: BaseModel, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        model.model_dump_json(),
        status=status,
        headers=dict(headers or {}),
        mimetype="application/json",
    )


def error_response(err: OpsError) -> Response:
    body = ErrorBody(code=err.code, message=err.message, problems=err.problems)
    return json_response(body, err.status, err.headers)


def _problems(exc: ValidationError, where: str) -> list[FieldProblem]:
    return [
        FieldProblem(location=".".join([where, *(str(p) for p in e["loc"])]), problem=e["msg"])
        for e in exc.errors(include_url=False, include_input=False)
    ]


def parse_query(request: Request, model: type[BaseModel]) -> Any:
    raw: dict[str, str] = {}
    for key in request.args:
        values = request.args.getlist(key)
        if len(values) != 1:
            raise OpsError(400, "invalid_query", f"query parameter {key!r} is given twice")
        raw[key] = values[0]
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise OpsError(
            400, "invalid_query", "the query parameters are not valid", _problems(exc, "query")
        ) from None


def read_body(request: Request, model: type[BaseModel]) -> Any:
    """The route's body model from a bounded read (`shared.core.request_body`): oversize 413 before
    reading, malformed framing or JSON and too deep nesting 400, a stalled body 408."""
    try:
        raw = request_body.read_body(
            request.stream.read,
            declared_length=request.content_length,
            cap=MAX_BODY_BYTES,
            environ=request.environ,
        )
        data = request_body.parse_json(raw) if raw.strip() else {}
    except request_body.BodyRefused as refused:
        raise OpsError(refused.status, refused.code, refused.message) from None
    if not isinstance(data, dict):
        raise OpsError(422, "invalid_body", "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise OpsError(
            422, "invalid_body", "the request body is not valid", _problems(exc, "body")
        ) from None


class OpsApi:
    """The API bound to a database and a step dispatcher (Pub/Sub in production)."""

    def __init__(
        self, db: Database | None = None, dispatch: replay.Dispatch = pubsub.publish_step_ready
    ) -> None:
        self._db = db
        self.dispatch = dispatch

    @property
    def db(self) -> Database:
        return self._db or get_database()

    def handle(self, request: Request) -> Response:
        try:
            return self._handle(request)
        except OpsError as err:
            return error_response(err)

    def _handle(self, request: Request) -> Response:
        try:
            # Before the token lookup and before a byte is read, as the webhook does.
            request_body.refuse_declared_length(request.content_length, MAX_BODY_BYTES)
        except request_body.BodyRefused as refused:
            raise OpsError(refused.status, refused.code, refused.message) from None
        adapter = _URL_MAP.bind("ops", "/")
        try:
            endpoint, params = adapter.match(request.path, method=request.method)
        except MethodNotAllowed:
            raise OpsError(
                405, "method_not_allowed", f"{request.method} is not allowed on {request.path}"
            ) from None
        except NotFound:
            raise OpsError(404, "no_such_route", f"nothing is served at {request.path}") from None
        if endpoint == "openapi":
            from shared.ops.openapi import openapi_document

            return Response(json.dumps(openapi_document()), mimetype="application/json")
        route = ROUTE_BY_NAME[endpoint]
        if route.handler is bootstrap_token:
            return self.bootstrap(request, route)
        principal = self.authenticate(request)
        query = parse_query(request, route.query)
        body = read_body(request, route.body) if route.body is not None else None
        call = Call(
            db=self.db,
            principal=principal,
            path=params,
            query=query,
            body=body,
            dispatch=self.dispatch,
        )
        return self.invoke(route, call)

    def bootstrap(self, request: Request, route: Route) -> Response:
        """The first admin token of a deployment, for whoever holds the bootstrap secret, once
        ever (auth.mint_bootstrap_token). A wrong secret is a 401 like a wrong token; the right
        one after the bootstrap happened is a 409 (audited: someone still holds that secret)."""
        offered = auth.bearer_from_header(request.headers.get("Authorization"))
        if not auth.bootstrap_secret_matches(offered):
            raise OpsError(
                401,
                "unauthenticated",
                "send the bootstrap secret as 'Authorization: Bearer <secret>'",
                headers={"WWW-Authenticate": 'Bearer realm="onceflow-ops"'},
            )
        body: BootstrapRequest = read_body(request, BootstrapRequest)
        try:
            minted = auth.mint_bootstrap_token(self.db, body.label)
        except TransientError as exc:
            raise _unavailable(exc) from exc
        if minted is None:
            auth.record_audit(
                self.db, None, action=route.name, target=None, detail={"outcome": "refused"}
            )
            raise OpsError(
                409,
                "already_bootstrapped",
                "the first admin token was minted already (the bootstrap works once); mint more"
                " with `onceflow tokens create --admin`",
            )
        token, token_id = minted
        auth.record_audit(
            self.db,
            None,
            action=route.name,
            target=token_id,
            detail={"outcome": "done", "label": body.label},
        )
        with self.db.transaction() as tx:
            row = tx.one(TOKEN_GET, token_id=token_id, tenant_id=None)
        return json_response(
            TokenMinted(token=token, details=TokenSummary.model_validate(row)), route.status
        )

    def authenticate(self, request: Request) -> auth.Principal:
        token = auth.bearer_from_header(request.headers.get("Authorization"))
        try:
            principal = auth.authenticate(self.db, token)
        except TransientError as exc:
            raise _unavailable(exc) from exc
        if principal is None:
            raise OpsError(
                401,
                "unauthenticated",
                "send a valid ops token as 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": 'Bearer realm="onceflow-ops"'},
            )
        return principal

    def invoke(self, route: Route, call: Call) -> Response:
        result = self.run_route(route, call)
        headers = {"Location": route.location(result)} if route.location else None
        return json_response(result, route.status, headers)

    def run_route(self, route: Route, call: Call) -> BaseModel:
        """The handler's result; errors as OpsError; mutating calls audited either way."""
        target = next((call.path[p] for p in route.path_params), None)
        try:
            result = route.handler(call)
        except OpsError as err:
            if route.mutating:
                self._audit(
                    call,
                    route,
                    target,
                    {"outcome": "refused", "code": err.code, "status": err.status},
                )
            raise
        except TransientError as exc:
            raise _unavailable(exc) from exc
        except ConflictError as exc:
            raise OpsError(
                409, "conflict", f"the change conflicts with existing data: {exc}"
            ) from exc
        except Exception as exc:
            log.exception("ops %s failed", route.name)
            raise OpsError(500, "internal", "the request failed; it was logged") from exc
        if route.mutating:
            self._audit(
                call,
                route,
                target,
                {"outcome": "done", "status": route.status, "body": _audited_body(call.body)},
            )
        return result

    def _audit(self, call: Call, route: Route, target: str | None, detail: dict[str, Any]) -> None:
        auth.record_audit(call.db, call.principal, action=route.name, target=target, detail=detail)


def _audited_body(body: BaseModel | None) -> Any:
    if body is None:
        return None
    dumped = body.model_dump(mode="json")
    # A definition's source is kept in its version row; the audit notes only its size.
    if isinstance(dumped.get("source"), str):
        dumped["source"] = {"chars": len(dumped["source"])}
    return dumped


def _unavailable(exc: TransientError) -> OpsError:
    return OpsError(
        503,
        "unavailable",
        f"try again shortly: {exc}",
        headers={"Retry-After": str(int(exc.retry_after or 1))},
    )


_default_api: OpsApi | None = None


def default_api() -> OpsApi:
    global _default_api  # noqa: PLW0603 - one per instance, reused across invocations
    if _default_api is None:
        _default_api = OpsApi()
    return _default_api


def handle_request(request: Request) -> Response:
    """The `ops` function's whole job: the JSON API, the page, and /openapi.json."""
    if request.path == "/ui" or request.path.startswith("/ui/"):
        from shared.ops import page

        return page.handle(default_api(), request)
    return default_api().handle(request)
