"""Slack interactions: a click on an approval message's Approve/Reject button, posted back by
Slack to `POST /slack/interactions/<tenant>` on the public `webhook` function
(functions/webhook.py routes it here; the tenant's Slack app has that Request URL).

What is trusted, and how far:
- the request is Slack's only if its `X-Slack-Signature` is `v0=` + hex HMAC-SHA256 under the
  tenant's signing secret of `v0:<X-Slack-Request-Timestamp>:<raw body>`, and the timestamp is
  within five minutes of now (a replayed capture is refused) — Slack's scheme,
  https://api.slack.com/authentication/verifying-requests-from-slack (as slack_sdk's
  SignatureVerifier checks it: `abs(now - timestamp) > 60 * 5` is refused). Otherwise a 401
  with the reason, and nothing is recorded as a decision;
- who clicked is the payload's `user.id` of that verified request, and nothing else in it: it
  is looked up in the tenant's `approver_identities` (channel `slack`), and the onceflow user it
  maps to must be one who may decide the approval (`parks.may_decide`, roles from the user's
  live ops tokens). Unmapped: 403 with the reason;
- the button's value names the approval; its tenant must be the path's.

The decision is a vote through `parks.decide_approval` (`via: slack`): one per approver, so a
redelivered or double click is one decision; the answer is made at once, with no outbound call
(Slack wants one within 3 s): the message's update ("approved by …") is queued with the vote and
made by the sweep (shared/steps/approval_messages.py). The resumed step is dispatched, as the
signed link does. Every verified click is audited (`approvals.slack_decide`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from shared.core import queries
from shared.core.db import Database
from shared.core.settings import named_secret
from shared.ops import replay
from shared.ops.statements import AUDIT_INSERT
from shared.steps.parks import NotAllowed, decide_approval

OPS = queries.load("ops")
SLACK_SETTINGS = OPS["ops_slack_settings"]
IDENTITY = OPS["ops_approver_identity"]

PATH_PREFIX = "/slack/interactions/"
# Slack's replay window: a request whose timestamp is further from now is refused.
WINDOW_SECONDS = 300
# An interaction payload is a few kilobytes; anything far larger is not Slack's.
MAX_BODY_BYTES = 256 * 1024
DECISIONS = {"approve": "approved", "reject": "rejected"}


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]


class Refused(Exception):
    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.answer = Answer(status, {"ok": False, "error": code, "reason": reason})


def is_path(path: str) -> bool:
    return path.startswith(PATH_PREFIX)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 request signature of `body` sent at `timestamp`."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float) -> None:
    """Refused (401) unless the request is signed with `secret` within the window."""
    lower = {k.lower(): v for k, v in headers.items()}
    stamp = lower.get("x-slack-request-timestamp", "")
    offered = lower.get("x-slack-signature", "")
    if not stamp.isdigit():
        raise Refused(401, "bad_timestamp", "X-Slack-Request-Timestamp is missing or not a number")
    if abs(now - int(stamp)) > WINDOW_SECONDS:
        raise Refused(
            401,
            "stale_timestamp",
            f"the request's timestamp is over {WINDOW_SECONDS} s from now: a replay is refused",
        )
    if not hmac.compare_digest(offered.encode(), signature(secret, stamp, body).encode()):
        raise Refused(401, "bad_signature", "X-Slack-Signature does not match the signing secret")


def handle(
    db: Database,
    dispatch: Callable[[Sequence[str]], None],
    *,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float | None = None,
) -> Answer:
    """One interaction callback, answered; never raises for what the caller sent."""
    try:
        now = time.time() if now is None else now
        return _handle(db, dispatch, path=path, headers=headers, body=body, now=now)
    except Refused as refused:
        return refused.answer


def _handle(
    db: Database,
    dispatch: Callable[[Sequence[str]], None],
    *,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
) -> Answer:
    tenant_id = path[len(PATH_PREFIX) :].strip("/")
    with db.transaction() as tx:
        settings_row = tx.one(SLACK_SETTINGS, tenant_id=tenant_id) if tenant_id else None
    env = settings_row["slack_signing_secret_env"] if settings_row else None
    secret = named_secret(env) if env else None
    if secret is None:
        raise Refused(404, "not_configured", "Slack is not configured for this tenant")
    verify(secret, headers, body, now)
    approval_id, decision, slack_user = _click(body)
    with db.transaction() as tx:
        who = tx.one(IDENTITY, tenant_id=tenant_id, channel="slack", external_id=slack_user)
    if who is None:
        _audit(db, tenant_id, approval_id, {"slack_user": slack_user, "outcome": "unmapped"})
        raise Refused(
            403,
            "unmapped_user",
            f"Slack user {slack_user} is not mapped to an onceflow user in this tenant",
        )
    user = str(who["onceflow_user"])
    detail: dict[str, Any] = {"slack_user": slack_user, "user": user, "decision": decision}
    try:
        outcome = decide_approval(
            db,
            approval_id,
            decision=decision,
            user=user,
            roles=tuple(who["roles"] or ()),
            comment=None,
            tenant_scope=tenant_id,
            via="slack",
        )
    except NotAllowed as exc:
        _audit(db, tenant_id, approval_id, {**detail, "outcome": "refused", "why": str(exc)})
        raise Refused(403, "not_an_approver", str(exc)) from None
    if outcome is None:
        raise Refused(404, "not_found", "there is no such approval in this tenant")
    said = "resumed" if outcome.moved else (outcome.vote or "refused")
    _audit(db, tenant_id, approval_id, {**detail, "outcome": said})
    if outcome.step_id is not None:
        replay.dispatch_committed(dispatch, (outcome.step_id,))
    text = (
        f"{decision} by {user}"
        if outcome.moved
        else f"recorded: {outcome.approvals} of {outcome.required} approvals"
        if outcome.awaiting_quorum
        else outcome.why_not
    )
    return Answer(
        200,
        {"ok": True, "vote": outcome.vote, "resumed": outcome.moved, "text": text, "user": user},
    )


def _click(body: bytes) -> tuple[int, str, str]:
    """(approval id, decision, Slack user id) of a verified block_actions payload."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = json.loads(form["payload"][0])
        action = payload["actions"][0]
        decision = DECISIONS[action["action_id"]]
        approval_id = int(action["value"])
        if not 0 < approval_id < 2**63:  # the park's bigint id: anything else is no approval
            raise ValueError(f"approval id {approval_id} out of range")
        slack_user = str(payload["user"]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise Refused(
            400, "bad_payload", f"not an approval button's interaction payload ({exc!r})"
        ) from None
    return approval_id, decision, slack_user


def _audit(db: Database, tenant_id: str, approval_id: int, detail: Mapping[str, Any]) -> None:
    with db.transaction() as tx:
        tx.execute(
            AUDIT_INSERT,
            token_id=None,
            tenant_id=tenant_id,
            action="approvals.slack_decide",
            target=str(approval_id),
            detail=json.dumps(detail, default=str),
        )
