"""Records and refusals: `/v1/refusals`, `/v1/records/…` — "why didn't it run?", "would it
run now?" and search."""

from __future__ import annotations

from dataclasses import asdict

from shared.admission.would_run import WouldRunError, would_run
from shared.ops import explain, search
from shared.ops.api.http import Call
from shared.ops.cursor import BY_ID
from shared.ops.errors import OpsError
from shared.ops.models import (
    RecordExplanation,
    RecordQuery,
    RecordSearch,
    RecordSearchQuery,
    Refusal,
    RefusalPage,
    RefusalsQuery,
    WouldRunAnswer,
    WouldRunQuery,
)
from shared.ops.statements import REFUSALS_LIST
from shared.port.record_labels import shown_for


def list_refusals(call: Call) -> RefusalPage:
    q: RefusalsQuery = call.query
    rows, next_cursor = BY_ID.read(
        call.db,
        REFUSALS_LIST,
        q.cursor,
        q.limit,
        tenant_id=call.scope,
        workflow_id=str(q.workflow_id) if q.workflow_id else None,
        record_key=q.record_key,
        event_id=q.event_id,
    )
    items = [
        Refusal.model_validate({**r, "explanation": explain.explain_reason(r["reason"])})
        for r in rows
    ]
    return RefusalPage(items=items, next_cursor=next_cursor)


def explain_record(call: Call) -> RecordExplanation:
    q: RecordQuery = call.query
    with call.db.transaction() as tx:
        found = explain.explain_record(tx, record_key=q.record_key, tenant_scope=call.scope)
        shown = shown_for(tx, [found.record_key])
    return found.model_copy(update={"record_label": shown.get(found.record_key)})


def search_records(call: Call) -> RecordSearch:
    q: RecordSearchQuery = call.query
    with call.db.transaction() as tx:
        return search.search(tx, q.q, tenant_scope=call.scope)


# A question that can't be asked, as the API answers it (shared/admission/would_run.py).
WOULD_RUN_STATUS = {
    "not_found": 404,
    "record_not_found": 404,
    "not_bound": 409,
    "invalid_record_key": 422,
    "crm_unavailable": 502,
}


def would_run_now(call: Call) -> WouldRunAnswer:
    """Would this record start a run of the workflow now? Admission's answer, written nowhere."""
    q: WouldRunQuery = call.query
    try:
        answer = would_run(
            call.db,
            workflow_id=str(q.workflow_id),
            record_key=q.record_key,
            event_type=q.event_type,
            tenant_scope=call.scope,
        )
    except WouldRunError as exc:
        raise OpsError(WOULD_RUN_STATUS[exc.code], exc.code, str(exc)) from exc
    words = (
        "A new run would start."
        if answer.would_run
        else explain.explain_reason(answer.reason or "")
    )
    return WouldRunAnswer.model_validate({**asdict(answer), "explanation": words})
