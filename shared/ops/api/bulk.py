"""Bulk actions: `/v1/bulk/preview` then `/v1/bulk/act` — replay, retry and cancel runs by
filter, and re-queue dead inbox rows. The one home of bulk: the page's bulk forms call these
two routes (shared/ops/bulk.py words them for people).

A preview stores exactly the set it listed (sorted ids, the action, the caller's tenant, an
expiry) and answers its id as the token; an act runs that set and nothing else, so what runs is
what was shown, not whatever matches by the time someone confirms. Each target goes through its
own route's handler (the single-run replay, retry and cancel, the inbox requeue), whose guarded
statement makes it happen at most once, and is audited one by one, refusals included, naming
the token. The first act to finish records its outcomes on the token; an act on a token already
acted on answers those outcomes (`repeated`) and does nothing. A token is tenant-scoped: another
tenant's is not found.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from shared.admission import redecide
from shared.ops import auth, redrive
from shared.ops.api.events import requeue_inbox_row
from shared.ops.api.http import Call, EmptyQuery
from shared.ops.api.runs import cancel_live_run, replay_failed_run, retry_failed_run
from shared.ops.cursor import BY_CREATED
from shared.ops.errors import OpsError, not_found
from shared.ops.explain import STUCK_INBOX, stuck_inbox_rows
from shared.ops.models import (
    BulkActRequest,
    BulkActResult,
    BulkOutcome,
    BulkPreview,
    BulkPreviewRequest,
    CancelRequest,
    RedecisionPreview,
    ReplayRequest,
    ReplayResult,
    RetryRequest,
    RunSummary,
)
from shared.ops.statements import BULK_ACTED, BULK_GET, BULK_INSERT, RUNS_LIST

# At most this many targets per bulk action; `more` says when the filter matched beyond it.
MAX_TARGETS = 200
# A preview is a decision about the present: after this long, preview again.
TOKEN_TTL = timedelta(minutes=15)

# Each target is audited under its own route's name (with the token), as a single call is.
ROUTE_NAMES = {
    "redrive": "deadletters.redrive",
    "replay": "runs.replay",
    "retry": "runs.retry",
    "cancel": "runs.cancel",
    "requeue_inbox": "inbox.requeue",
    "redecide": "admission.redecide",
}
# The run status each run action takes (the dead-letter list for replay and retry).
RUN_STATUS = {"replay": "failed", "retry": "failed", "cancel": "running"}


def _admin_only(call: Call) -> None:
    # The holds are machinery every tenant shares (shared/ops/redrive.py): a tenant's token is
    # told there is no such thing, as for anything not theirs.
    if not call.principal.is_admin:
        raise not_found("bulk action")


def _matching(call: Call, q: BulkPreviewRequest) -> list[dict[str, Any]]:
    """Up to MAX_TARGETS + 1 rows the action would touch now (one more tells `more`)."""
    if q.action == "redrive":
        _admin_only(call)
        held = [
            {"id": f"{h.subscription}:{i}"} for h in redrive.peek(MAX_TARGETS + 1) for i in h.ids
        ]
        return sorted(held, key=lambda r: r["id"])
    with call.db.transaction() as tx:
        if q.action == "requeue_inbox":
            rows = tx.all(
                STUCK_INBOX,
                tenant_id=call.scope,
                connection_id=str(q.connection_id) if q.connection_id else None,
                limit=MAX_TARGETS + 1,
            )
            return [r for r in rows if r["status"] == "dead"]
        rows = tx.all(
            RUNS_LIST,
            tenant_id=call.scope,
            workflow_id=str(q.workflow_id) if q.workflow_id else None,
            status=RUN_STATUS[q.action],
            record_key=q.record_key,
            created_after=q.created_after,
            created_before=q.created_before,
            event_type=q.event_type,
            **BY_CREATED.window(None, MAX_TARGETS),
        )
    return rows


def preview_bulk(call: Call) -> BulkPreview:
    q: BulkPreviewRequest = call.body
    if q.action == "cancel" and not q.reason:
        raise OpsError(422, "reason_required", "a bulk cancel needs a reason, kept on each run")
    if q.action == "redecide":
        return _preview_redecide(call, q)
    found = _matching(call, q)
    shown = found[:MAX_TARGETS]
    targets = sorted(str(r["id"]) for r in shown)
    with call.db.transaction() as tx:
        row = tx.one(
            BULK_INSERT,
            tenant_id=call.scope,
            action=q.action,
            targets=targets,
            reason=q.reason,
            token_id=call.principal.token_id,
            ttl_seconds=TOKEN_TTL.total_seconds(),
        )
    assert row is not None
    return BulkPreview(
        token=row["id"],
        action=q.action,
        tenant_id=call.scope,
        targets=targets,
        more=len(found) > MAX_TARGETS,
        expires_at=row["expires_at"],
        runs=[RunSummary.model_validate(r) for r in shown] if q.action in RUN_STATUS else [],
        inbox_rows=stuck_inbox_rows(shown) if q.action == "requeue_inbox" else [],
    )


def _store(call: Call, q: BulkPreviewRequest, targets: list[str]) -> dict[str, Any]:
    with call.db.transaction() as tx:
        row = tx.one(
            BULK_INSERT,
            tenant_id=call.scope,
            action=q.action,
            targets=targets,
            reason=q.reason,
            token_id=call.principal.token_id,
            ttl_seconds=TOKEN_TTL.total_seconds(),
        )
    assert row is not None
    return row


def _preview_redecide(call: Call, q: BulkPreviewRequest) -> BulkPreview:
    """The refusals to decide again (shared/admission/redecide.py), each with what the
    workflow's current version says of it now; the token names their refusal ids."""
    found = redecide.preview(
        call.db,
        redecide.Filter(
            tenant_id=call.scope,
            workflow_id=str(q.workflow_id) if q.workflow_id else None,
            record_key=q.record_key,
            event_type=q.event_type,
            created_after=q.created_after,
            created_before=q.created_before,
            reasons=q.reasons or redecide.REDECIDABLE,
        ),
        limit=MAX_TARGETS + 1,
    )
    shown = found[:MAX_TARGETS]
    targets = sorted((str(r.refusal_id) for r in shown), key=int)
    row = _store(call, q, targets)
    return BulkPreview(
        token=row["id"],
        action=q.action,
        tenant_id=call.scope,
        targets=targets,
        more=len(found) > MAX_TARGETS,
        expires_at=row["expires_at"],
        redecisions=[
            RedecisionPreview.model_validate({**vars(r), "would_run": r.would_run}) for r in shown
        ],
    )


def _redecided(call: Call, row: dict[str, Any]) -> list[BulkOutcome]:
    """Each listed refusal decided again (once per event, workflow and version), audited."""
    outcomes: list[BulkOutcome] = []
    for target in row["targets"]:
        done = redecide.redecide(
            call.db,
            int(target),
            tenant_id=call.scope,
            bulk_id=str(row["id"]),
            publish=call.dispatch,
        )
        if done is None:
            outcome = BulkOutcome(
                target=target, ok=False, code="not_found", message="no such refusal"
            )
        else:
            said = f"{done.outcome}: {done.detail}" + (" (decided before)" if done.repeated else "")
            outcome = BulkOutcome(
                target=target,
                ok=done.would_run,
                code=None if done.would_run else done.outcome,
                message=said[:2000],
                run_id=done.run_id,
            )
        auth.record_audit(
            call.db,
            call.principal,
            action=ROUTE_NAMES["redecide"],
            target=target,
            detail={
                "outcome": "done" if outcome.ok else "refused",
                "bulk": str(row["id"]),
                "reason": row["reason"],
                **outcome.model_dump(mode="json"),
            },
        )
        outcomes.append(outcome)
    return outcomes


def _one(call: Call, action: str, target: str, reason: str | None) -> BaseModel:
    """The target through its own route's handler (and so its guarded statement)."""
    route: dict[str, tuple[str, Callable[[Call], BaseModel], BaseModel | None]] = {
        "replay": ("run_id", replay_failed_run, ReplayRequest(reason=reason)),
        "retry": ("run_id", retry_failed_run, RetryRequest(reason=reason)),
        "cancel": ("run_id", cancel_live_run, CancelRequest(reason=reason or "bulk cancel")),
        "requeue_inbox": ("inbox_id", requeue_inbox_row, None),
    }
    param, handler, body = route[action]
    one = Call(
        db=call.db,
        principal=call.principal,
        path={param: target},
        query=EmptyQuery(),
        body=body,
        dispatch=call.dispatch,
    )
    return handler(one)


def act_bulk(call: Call) -> BulkActResult:
    body: BulkActRequest = call.body
    with call.db.transaction() as tx:
        row = tx.one(BULK_GET, bulk_id=str(body.token), tenant_id=call.scope)
    if row is None:
        raise not_found("bulk preview")
    if row["acted_at"] is not None:
        return _result(row, row["outcomes"], repeated=True)
    if row["expired"]:
        raise OpsError(410, "preview_expired", "the preview expired; preview again")
    if row["action"] == "redrive":
        outcomes = _redriven(call, row)
    elif row["action"] == "redecide":
        outcomes = _redecided(call, row)
    else:
        outcomes = _each(call, row, body)
    dumped = [o.model_dump(mode="json") for o in outcomes]
    with call.db.transaction() as tx:
        recorded = tx.one(BULK_ACTED, bulk_id=str(body.token), outcomes=json.dumps(dumped))
        if recorded is None:
            # Another act on this token finished first: its outcomes are the token's.
            row = tx.one(BULK_GET, bulk_id=str(body.token), tenant_id=call.scope)
            assert row is not None
            return _result(row, row["outcomes"], repeated=True)
    return _result(row, dumped, repeated=False)


def _redriven(call: Call, row: dict[str, Any]) -> list[BulkOutcome]:
    """Only the held messages the preview listed go back to their topics (one pull of each
    hold); one audit row per hold names how many."""
    _admin_only(call)
    listed = frozenset(row["targets"])
    holds = redrive.redrive(only=listed)
    sent = {f"{h.subscription}:{i}" for h in holds for i in h.ids}
    for h in holds:
        auth.record_audit(
            call.db,
            call.principal,
            action="deadletters.redrive",
            target=h.subscription,
            detail={"bulk": str(row["id"]), "messages": h.messages, "ids": h.ids},
        )
    return [
        BulkOutcome(target=t, ok=True, message="published again")
        if t in sent
        else BulkOutcome(
            target=t, ok=False, code="not_held", message="no longer on the dead-letter hold"
        )
        for t in row["targets"]
    ]


def _each(call: Call, row: dict[str, Any], body: BulkActRequest) -> list[BulkOutcome]:
    """Each target through its own route's handler, audited one by one."""
    outcomes: list[BulkOutcome] = []
    for target in row["targets"]:
        try:
            result = _one(call, row["action"], target, row["reason"])
        except OpsError as err:
            outcome = BulkOutcome(target=target, ok=False, code=err.code, message=err.message)
        else:
            new_run = result.run.id if isinstance(result, ReplayResult) else None
            outcome = BulkOutcome(
                target=target,
                ok=True,
                message=f"new run {new_run}" if new_run else "done",
                run_id=new_run,
            )
        auth.record_audit(
            call.db,
            call.principal,
            action=ROUTE_NAMES[row["action"]],
            target=target,
            detail={
                "outcome": "done" if outcome.ok else "refused",
                "bulk": str(body.token),
                "reason": row["reason"],
                **outcome.model_dump(mode="json"),
            },
        )
        outcomes.append(outcome)
    return outcomes


def _result(
    row: dict[str, Any], outcomes: list[dict[str, Any]], *, repeated: bool
) -> BulkActResult:
    return BulkActResult(
        token=row["id"],
        action=row["action"],
        repeated=repeated,
        outcomes=[BulkOutcome.model_validate(o) for o in outcomes],
    )
