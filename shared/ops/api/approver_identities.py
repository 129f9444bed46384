"""Approver identities: `/v1/approver-identities` — who a Slack user id or an email address is
in a tenant (the onceflow user an approval names), so an operator never maps people in SQL.

A click from Slack is trusted only as the Slack user its verified signature is for, looked up
here (shared/ops/slack_interactions.py); an approval email goes to the address mapped here
(shared/steps/approval_messages.py). So what is added is checked for what those readers need:
a Slack user id as Slack writes them, an address that is one address (no second recipient, no
header line), and a user who exists in the tenant (a live ops token labelled so: their roles
are that token's).
"""

from __future__ import annotations

import re

from shared.ops.api.http import Call, named_tenant
from shared.ops.api.tenants import tenant_of
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    ApproverIdentity,
    ApproverIdentityCreate,
    ApproverIdentityList,
    ApproverIdentityQuery,
    ApproverIdentityRef,
)
from shared.ops.statements import (
    APPROVER_IDENTITIES_LIST,
    APPROVER_IDENTITY_DELETE,
    APPROVER_IDENTITY_GET,
    APPROVER_IDENTITY_INSERT,
    TENANT_USER_KNOWN,
)

# Slack user ids: `U…`, or `W…` for an Enterprise Grid user; capitals and digits.
_SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{2,30}")
# One mailbox, plain: no display name, no second address, no whitespace (a CR or LF in an
# address would be a header line of its own in the message the sweep sends).
_ADDRESS = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9][A-Za-z0-9.-]{0,251}")


def address_problem(address: str) -> str | None:
    """Why `address` is not one plain email address (None: it is one)."""
    if not _ADDRESS.fullmatch(address) or "." not in address.rsplit("@", 1)[1]:
        return f"{address!r} is not one plain email address (name@example.com)"
    return None


def _identity(body: ApproverIdentityRef) -> tuple[str, str]:
    """The (channel, external id) a request names: a Slack user id or an email address."""
    if (body.slack_user_id is None) == (body.email is None):
        raise OpsError(422, "identity_required", "name exactly one of slack_user_id or email")
    if body.slack_user_id is not None:
        if not _SLACK_USER_ID.fullmatch(body.slack_user_id):
            raise OpsError(
                422,
                "slack_user_id_malformed",
                f"{body.slack_user_id!r} is not a Slack user id: one starts with U (or W,"
                " Enterprise Grid) followed by capitals and digits, like U024BE7LH (a member's"
                " profile: ⋮ → Copy member ID)",
            )
        return "slack", body.slack_user_id
    assert body.email is not None
    problem = address_problem(body.email)
    if problem is not None:
        raise OpsError(422, "email_malformed", problem)
    return "email", body.email


def add_identity(call: Call) -> ApproverIdentity:
    body: ApproverIdentityCreate = call.body
    tenant_id = tenant_of(call, body.tenant_id)
    channel, external_id = _identity(body)
    with call.db.transaction() as tx:
        if tx.one(TENANT_USER_KNOWN, tenant_id=tenant_id, user=body.user) is None:
            raise OpsError(
                422,
                "unknown_user",
                f"tenant {tenant_id!r} has no user {body.user!r}: a user is the label of a live"
                " ops token of the tenant (onceflow tokens create --label …)",
            )
        row = tx.one(
            APPROVER_IDENTITY_INSERT,
            tenant_id=tenant_id,
            channel=channel,
            external_id=external_id,
            user=body.user,
        )
        if row is None:
            held = tx.one(
                APPROVER_IDENTITY_GET, tenant_id=tenant_id, channel=channel, external_id=external_id
            )
            who = held["user"] if held is not None else "someone"
            raise OpsError(
                409,
                "identity_mapped",
                f"{external_id} is mapped to {who!r} already; remove it first to re-map it",
            )
    return ApproverIdentity.model_validate(row)


def remove_identity(call: Call) -> ApproverIdentity:
    body: ApproverIdentityRef = call.body
    tenant_id = tenant_of(call, body.tenant_id)
    channel, external_id = _identity(body)
    with call.db.transaction() as tx:
        row = tx.one(
            APPROVER_IDENTITY_DELETE, tenant_id=tenant_id, channel=channel, external_id=external_id
        )
    if row is None:
        raise not_found("approver identity")
    return ApproverIdentity.model_validate(row)


def list_identities(call: Call) -> ApproverIdentityList:
    q: ApproverIdentityQuery = call.query
    tenant_id = named_tenant(call, q.tenant_id) if q.tenant_id or call.scope else None
    with call.db.transaction() as tx:
        rows = tx.all(APPROVER_IDENTITIES_LIST, tenant_id=tenant_id, user=q.user)
    return ApproverIdentityList(items=[ApproverIdentity.model_validate(r) for r in rows])
