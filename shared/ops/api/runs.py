"""Runs: `/v1/runs…` — the list, one run's journal, replay, retry and cancel."""

from __future__ import annotations

from uuid import UUID

from shared.core.db import Database
from shared.ops import replay
from shared.ops.api.http import Call, uuid_param
from shared.ops.cursor import BY_CREATED
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    CancelRequest,
    CancelResult,
    Charge,
    LeaseView,
    LineageEntry,
    ReplayRequest,
    ReplayResult,
    RetryResult,
    RunDetail,
    RunPage,
    RunsQuery,
    RunSummary,
    StepView,
)
from shared.ops.statements import (
    LINEAGE_RUNS,
    RUN_CHARGES,
    RUN_GET,
    RUN_LEASES,
    RUN_STEPS,
    RUNS_LIST,
)
from shared.steps.cancel import cancel_run


def _path_run(call: Call) -> str:
    return uuid_param(call, "run_id", "run")


def list_runs(call: Call) -> RunPage:
    q: RunsQuery = call.query
    rows, next_cursor = BY_CREATED.read(
        call.db,
        RUNS_LIST,
        q.cursor,
        q.limit,
        tenant_id=call.scope,
        workflow_id=str(q.workflow_id) if q.workflow_id else None,
        status=q.status,
        record_key=q.record_key,
        created_after=q.created_after,
        created_before=q.created_before,
        event_type=q.event_type,
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
        replay_from=run["replay_from"],
        replay_by=run["replay_by"],
        phase=run["phase"],
        steps=[StepView.model_validate({**s, "leases": leases.get(s["id"], [])}) for s in steps],
        charges=[Charge.model_validate(c) for c in charges],
        lineage=[LineageEntry.model_validate(r) for r in lineage],
    )


def get_run(call: Call) -> RunDetail:
    return run_detail(call.db, _path_run(call), call.scope)


def replay_failed_run(call: Call) -> ReplayResult:
    body: ReplayRequest = call.body
    run_id = _path_run(call)
    outcome = replay.replay_run(
        call.db,
        run_id=run_id,
        tenant_scope=call.scope,
        dispatch=call.dispatch,
        from_step=body.from_step,
        on_version=body.on_version,
        edited_input=body.input,
        by=call.principal.label,
        fresh_ai_answers=body.fresh_ai_answers,
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
    body: CancelRequest = call.body
    run_id = _path_run(call)
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
    run_id = _path_run(call)
    outcome = replay.retry_run(
        call.db, run_id=run_id, tenant_scope=call.scope, dispatch=call.dispatch
    )
    return RetryResult(
        run_id=UUID(outcome.run_id), restarted_steps=[s.step_key for s in outcome.plan.restart]
    )
