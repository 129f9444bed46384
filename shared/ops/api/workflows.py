"""Workflows: `/v1/workflows…` — definitions validated, published and activated; versions,
cron ticks, the trigger's state, the circuit breaker and the spend budget."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from shared import triggers
from shared.core.db import Database, Tx
from shared.core.logs import get_logger
from shared.gates import breaker, budgets
from shared.ops import explain
from shared.ops.api.http import Call, uuid_param
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    ActivateRequest,
    ActivationResult,
    BreakerStatus,
    BudgetStatus,
    CronTick,
    CronTickList,
    DefinitionProblem,
    FieldProblem,
    PublishResult,
    ResumeRequest,
    TicksQuery,
    TriggerStatus,
    ValidationResult,
    VersionList,
    VersionSummary,
    WorkflowList,
    WorkflowSource,
    WorkflowSummary,
)
from shared.ops.statements import WORKFLOW_GET, WORKFLOW_VERSIONS, WORKFLOWS_LIST
from shared.providers.connect import port_for, port_for_app
from shared.publishing import versions
from shared.publishing.subscriptions import project_drift, reconcile_tenant
from shared.publishing.validate import DefinitionInvalid, ValidationReport, validate_text
from shared.triggers import cron
from shared.workflows.definition import WorkflowDefinition

log = get_logger(__name__)
T = TypeVar("T")

SOURCE_NAME = "source"


def _owned_in(tx: Tx, call: Call, workflow_id: str) -> dict[str, Any]:
    """The workflow, read in `tx`; one of another tenant is a 404 like an unknown id."""
    row = tx.one(WORKFLOW_GET, workflow_id=workflow_id, tenant_id=call.scope)
    if row is None:
        raise not_found("workflow")
    return row


def list_workflows(call: Call) -> WorkflowList:
    with call.db.transaction() as tx:
        rows = tx.all(WORKFLOWS_LIST, tenant_id=call.scope)
    return WorkflowList(items=[WorkflowSummary.model_validate(r) for r in rows])


def _read_owned(call: Call, read: Callable[[Tx, str], T]) -> tuple[UUID, T]:
    """What `read` finds about the workflow the path names, in the transaction that checks
    the caller may see it."""
    workflow_id = uuid_param(call, "workflow_id", "workflow")
    with call.db.transaction() as tx:
        _owned_in(tx, call, workflow_id)
        return UUID(workflow_id), read(tx, workflow_id)


def list_versions(call: Call) -> VersionList:
    workflow_id, rows = _read_owned(
        call, lambda tx, workflow_id: tx.all(WORKFLOW_VERSIONS, workflow_id=workflow_id)
    )
    return VersionList(
        workflow_id=workflow_id, items=[VersionSummary.model_validate(r) for r in rows]
    )


def list_cron_ticks(call: Call) -> CronTickList:
    q: TicksQuery = call.query
    workflow_id, rows = _read_owned(
        call,
        lambda tx, workflow_id: cron.list_ticks(tx, workflow_id, status=q.status, limit=q.limit),
    )
    return CronTickList(workflow_id=workflow_id, items=[CronTick.model_validate(r) for r in rows])


def _trigger_state(tx: Tx, workflow_id: str) -> tuple[str, dict[str, Any]] | None:
    definition = versions.active_definition(tx, workflow_id)
    if definition is None:
        return None
    return triggers.status(tx, definition.trigger, workflow_id)


def trigger_status(call: Call) -> TriggerStatus:
    workflow_id, state = _read_owned(call, _trigger_state)
    if state is None:
        return TriggerStatus(workflow_id=workflow_id, active=False, kind=None, detail={})
    kind, detail = state
    return TriggerStatus(workflow_id=workflow_id, active=True, kind=kind, detail=detail)


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
    if report.definition is not None and report.ok:
        problems.extend(_drift_warnings(call, report.definition))
    return ValidationResult(
        valid=not any(p.severity == "error" for p in problems), problems=problems
    )


def _drift_warnings(call: Call, definition: WorkflowDefinition) -> list[DefinitionProblem]:
    """A warning per project app of the tenant whose deployed files would lack a subscription
    this definition (with the tenant's active ones) needs: it can be activated, but those
    events would not arrive until the project is written and uploaded again."""
    tenant = call.scope or definition.tenant
    stored = json.loads(versions.canonical_json(definition))
    return [
        DefinitionProblem(
            severity="warning", path="trigger", line=None, column=None, message=d.message()
        )
        for d in project_drift(call.db, tenant, [stored])
    ]


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


def owned_workflow(call: Call, workflow_id: str) -> dict[str, Any]:
    with call.db.transaction() as tx:
        return _owned_in(tx, call, workflow_id)


def _path_workflow(call: Call) -> dict[str, Any]:
    """The workflow the path names, if the caller may see it."""
    return owned_workflow(call, uuid_param(call, "workflow_id", "workflow"))


def activate_workflow(call: Call) -> ActivationResult:
    body: ActivateRequest = call.body
    workflow = _path_workflow(call)
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
        workflow_id=UUID(activation.workflow_id),
        active_version_id=UUID(activation.version_id),
        # The activation stands: events the project doesn't subscribe to just never arrive
        # until a person deploys the project again, which this says.
        warnings=[d.message() for d in project_drift(call.db, workflow["tenant_id"])],
    )


def _breaker_status(call: Call, workflow_id: str) -> BreakerStatus:
    with call.db.transaction() as tx:
        row = breaker.status(tx, workflow_id)
    return BreakerStatus.model_validate(
        {**row, "explanation": explain.explain_breaker(row["state"], row["reason"])}
    )


def get_breaker(call: Call) -> BreakerStatus:
    workflow = _path_workflow(call)
    return _breaker_status(call, str(workflow["id"]))


def get_budget(call: Call) -> BudgetStatus:
    workflow = _path_workflow(call)
    with call.db.transaction() as tx:
        return BudgetStatus.model_validate(budgets.workflow_summary(tx, str(workflow["id"])))


def resume_workflow(call: Call) -> BreakerStatus:
    """Close (or half-open) a workflow's open circuit breaker; 409 when it is not open."""
    body: ResumeRequest = call.body
    workflow = _path_workflow(call)
    workflow_id = str(workflow["id"])
    with call.db.transaction() as tx:
        moved = breaker.resume(tx, workflow_id, half_open=body.half_open)
    if moved is None:
        raise OpsError(409, "not_paused", f"workflow {workflow_id}'s circuit breaker is not open")
    return _breaker_status(call, workflow_id)


def deactivate_workflow(call: Call) -> ActivationResult:
    workflow = _path_workflow(call)
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
    try:
        reconcile_tenant(db, tenant_id, lambda cid: port_for(db, cid), port_for_app)
    except Exception:
        log.warning("subscription reconcile after an activation failed", exc_info=True)
