"""Rehearsals: a dry run of a workflow version against a stored or supplied event.

A rehearsal run lives in namespace 'rehearsal' (DESIGN invariant 13):
- it never collides with a live claim: its start key is `rehearsal:<uuid>:<event>`, the
  partial unique index on active runs covers only namespace 'live', and it writes no delivery
  claim and no enrollment (it decides nothing about the event);
- a live executor never picks it up: the step claim matches only the namespace it is asked
  for, and the rehearsal's steps are never published to `step-ready`; this call drives them
  in-process, with `BlockContext.dry_run` set so every side effect stops before it leaves
  (the block returns what it would have sent instead, and nothing is charged);
- it never appears in live history: every ops read filters namespace = 'live'.
Delays are served at once; a step that would wait for a retry ends the rehearsal (cancelled,
with the reason), as does the step budget.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.core.db import Database
from shared.ops.errors import OpsError, not_found
from shared.ops.models import RehearsalRequest, RehearsalResult, RehearsalStep
from shared.ops.statements import (
    ACTIVE_VERSION,
    EVENT_GET,
    REHEARSAL_PENDING,
    REHEARSAL_RESULT,
    REHEARSAL_RUN_INSERT,
    REHEARSAL_SERVE_DELAYS,
    REHEARSAL_STATUS,
    REHEARSAL_STOP,
    VERSION_GET,
    WORKFLOW_GET,
)
from shared.providers import registry
from shared.steps.advance import advance_step
from shared.steps.journal import insert_steps
from shared.steps.outcomes import DELAY_UNTIL_KEY
from shared.workflows.definition import WorkflowDefinition
from shared.workflows.expressions import ExpressionError, compile_expression
from shared.workflows.scope import Occurrence, trigger_record

MAX_REHEARSAL_STEPS = 200


@dataclass(frozen=True)
class RehearsalStart:
    run_id: str
    tenant_id: str


def start_rehearsal(
    db: Database, request: RehearsalRequest, tenant_scope: str | None
) -> RehearsalStart:
    """Create the rehearsal run and its entry step (committed, never dispatched)."""
    with db.transaction() as tx:
        workflow = tx.one(
            WORKFLOW_GET, workflow_id=str(request.workflow_id), tenant_id=tenant_scope
        )
        if workflow is None:
            raise not_found("workflow")
        version_id = (
            str(request.version_id)
            if request.version_id
            else tx.scalar(ACTIVE_VERSION, workflow_id=str(request.workflow_id))
        )
        if version_id is None:
            raise OpsError(
                409, "no_active_version", "the workflow has no active version; name a version_id"
            )
        version = tx.one(
            VERSION_GET, version_id=str(version_id), workflow_id=str(request.workflow_id)
        )
        if version is None:
            raise not_found("version")
        definition = WorkflowDefinition.model_validate(version["definition"])
        payload, event_id, record_key, record, truncated, label = _event(
            tx, request, workflow, definition
        )
        run_id = str(uuid.uuid4())
        tx.execute(
            REHEARSAL_RUN_INSERT,
            run_id=run_id,
            tenant_id=workflow["tenant_id"],
            workflow_id=str(request.workflow_id),
            version_id=str(version_id),
            start_key=f"rehearsal:{uuid.uuid4()}:{label}",
            event_id=event_id,
            record_key=record_key,
            dedup_mode=definition.trigger.dedup,
            payload=json.dumps(payload),
            payload_truncated=truncated,
            record=json.dumps(record, default=str),
        )
        insert_steps(tx, run_id=run_id, lineage_root=run_id, nodes=[definition.entry])
    return RehearsalStart(run_id=run_id, tenant_id=workflow["tenant_id"])


def _event(
    tx: Any, request: RehearsalRequest, workflow: dict[str, Any], definition: WorkflowDefinition
) -> tuple[Any, int | None, str | None, dict[str, Any], bool, str]:
    """(payload, event id, record key, the record the rule would see, truncated, label)."""
    if (request.event_id is None) == (request.event is None):
        raise OpsError(422, "invalid_body", "give exactly one of event_id and event")
    if request.event_id is not None:
        event = tx.one(EVENT_GET, event_id=request.event_id, tenant_id=workflow["tenant_id"])
        if event is None:
            raise not_found("event")
        occurrence = Occurrence.from_row(event)
        key, record = _record(occurrence, definition)
        return (
            event["payload"],
            int(event["id"]),
            key,
            record,
            bool(event["payload_truncated"]),
            f"event-{event['id']}",
        )
    supplied = request.event
    assert supplied is not None
    occurrence = Occurrence(
        id=None,
        type=supplied.event_type,
        tenant_id=workflow["tenant_id"],
        payload=supplied.payload,
        record_object_type=supplied.record_object_type,
        record_object_id=supplied.record_object_id,
    )
    key, record = _record(occurrence, definition)
    # No event row: the payload carries the event type for the step scope's `event.type`.
    payload = {"event_type": supplied.event_type, **supplied.payload}
    return payload, None, key, record, False, "supplied"


def _record(
    occurrence: Occurrence, definition: WorkflowDefinition
) -> tuple[str | None, dict[str, Any]]:
    """The record admission's rule would see for this event (the same function builds it)."""
    expression = None
    if definition.trigger.record != "event":
        try:
            expression = compile_expression(definition.trigger.record)
        except ExpressionError as exc:
            raise OpsError(
                422, "invalid_definition", f"the trigger's record expression: {exc}"
            ) from exc
    # A record expression's kind, in any CRM's words: the rehearsal doesn't read the
    # connection's provider (admission does: shared/admission/admit.py `object_kind`).
    key, record, _ = trigger_record(occurrence, expression, kind_of=registry.object_kind)
    return key, record


class RehearsalClock:
    """Wall time plus the delays a rehearsal skipped: a served delay looks served."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def skip_to(self, moment: datetime) -> None:
        ahead = moment - datetime.now(UTC)
        self.offset = max(self.offset, ahead)


def drive_rehearsal(db: Database, run_id: str) -> None:
    """Run the rehearsal's steps in-process, through the step engine in namespace
    'rehearsal' (which sets `dry_run` on every block), until none is left or the budget is
    spent. Next steps are never published: this loop is their only executor."""
    clock = RehearsalClock()
    executed = 0
    reason = "a step would have waited for a retry"
    while True:
        with db.transaction() as tx:
            for woken in tx.all(REHEARSAL_SERVE_DELAYS, run_id=run_id):
                until = (woken["output"] or {}).get(DELAY_UNTIL_KEY)
                if until:
                    clock.skip_to(datetime.fromisoformat(str(until)))
            pending = [r["id"] for r in tx.all(REHEARSAL_PENDING, run_id=run_id)]
        if not pending:
            break
        progressed = False
        for step_id in pending:
            if executed >= MAX_REHEARSAL_STEPS:
                break
            executed += 1
            advanced = advance_step(
                db, step_id, namespace="rehearsal", dispatch=_nowhere, now=clock
            )
            progressed = advanced.claimed or progressed
        if executed >= MAX_REHEARSAL_STEPS:
            reason = f"stopped after {MAX_REHEARSAL_STEPS} steps"
            break
        if not progressed:
            break
    with db.transaction() as tx:
        tx.execute(REHEARSAL_STOP, run_id=run_id, error=f"rehearsal {reason}")


def _nowhere(step_ids: Sequence[str]) -> None:
    """Rehearsal steps are never published to `step-ready`: a live executor never sees them."""


def rehearsal_result(db: Database, run_id: str) -> RehearsalResult:
    with db.transaction() as tx:
        steps = tx.all(REHEARSAL_RESULT, run_id=run_id)
        status = _run_status(tx, run_id)
    would_send = [
        s["output"]
        for s in steps
        if isinstance(s["output"], dict) and s["output"].get("dry_run") is True
    ]
    return RehearsalResult(
        run_id=uuid.UUID(run_id),
        status=status,
        steps=[RehearsalStep.model_validate(s) for s in steps],
        would_send=would_send,
    )


def _run_status(tx: Any, run_id: str) -> Any:
    return tx.scalar(REHEARSAL_STATUS, run_id=run_id)
