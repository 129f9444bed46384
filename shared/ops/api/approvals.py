"""Approvals: `/v1/approvals…` — the open ones the caller may decide, decisions, signed links."""

from __future__ import annotations

from uuid import UUID

from shared.ops import replay
from shared.ops.api.http import Call, int_param
from shared.ops.approval_links import make_link, public_url
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    ApprovalLink,
    ApprovalList,
    ApprovalView,
    DecisionRequest,
    DecisionResult,
    LinkRequest,
)
from shared.ops.statements import APPROVALS_OPEN
from shared.steps.parks import NotAllowed, decide_approval, may_decide, park_row

MAX_APPROVALS_LISTED = 500


def list_approvals(call: Call) -> ApprovalList:
    """The approvals waiting for a decision that the caller may decide."""
    with call.db.transaction() as tx:
        rows = tx.all(APPROVALS_OPEN, tenant_id=call.scope, limit=MAX_APPROVALS_LISTED)
    mine = [r for r in rows if may_decide(r, user=call.principal.label, roles=call.principal.roles)]
    return ApprovalList(
        items=[
            ApprovalView.model_validate(
                {
                    **r,
                    "approver_users": list(r["approver_users"] or ()),
                    "escalate_users": list(r["escalate_users"] or ()),
                    "approved_by": list(r["approved_by"] or ()),
                }
            )
            for r in mine
        ]
    )


def _decide(call: Call, decision: str) -> DecisionResult:
    body: DecisionRequest = call.body
    approval_id = int_param(call, "approval_id", "approval")
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
    still_open = outcome.park is not None and outcome.park["resumed_at"] is None
    # A vote that counted towards a quorum still open, or a repeat of this approver's own
    # vote while it is open, is answered as done: harmless, it says where the quorum stands.
    waiting = outcome.awaiting_quorum or (outcome.vote == "duplicate" and still_open)
    if not outcome.moved and not waiting:
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
        resumed=outcome.moved,
        vote="duplicate" if outcome.vote == "duplicate" else "counted",
        approvals=outcome.approvals,
        required=outcome.required,
    )


def approval_link(call: Call) -> ApprovalLink:
    """A signed link for one of the users an approval names, to decide it without a token."""
    body: LinkRequest = call.body
    approval_id = int_param(call, "approval_id", "approval")
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
