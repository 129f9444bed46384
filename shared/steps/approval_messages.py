"""Approval messages that reach people: the Slack post that asks, and its update as votes come;
the email with a signed link to each named user (`channels.email`).

An approval with `channels.slack` queues its ask with its park row (approvals_queue_asks, same
transaction); each counted vote queues an update of the posted message (approvals_queue_update,
in the vote's transaction). Neither is sent inline: the Slack interaction is answered at once
(Slack wants an answer within 3 s), and this repair of the sweep sends what is due, from the
partial indexes on `approval_messages` (shared/sweep/catalog.py REPAIRS). Before it, the
reminders and escalations come due (`remind_and_escalate_approvals`, from the partial indexes
on `step_parks.remind_at` / `escalate_at`), each at most once per approval, and queue theirs:

    queued ─► claimed (due_at moved past the send's timeout) ─► sent (slack_ts kept)
                       └► failed: due again later, at most MAX_ATTEMPTS tries
    update due ─► claimed (update_due_at cleared) ─► chat.update with the approval as it is now

Slack's Web API (https://api.slack.com/methods/chat.postMessage, /chat.update): POST JSON with
`Authorization: Bearer <bot token>`; the answer is HTTP 200 with `{"ok": false, "error": …}`
on a refusal. The bot token is the tenant's (`tenants.slack_bot_token_env` names the variable,
Secret Manager in the cloud). The buttons carry the approval's id only: who clicked is what
Slack's signed callback says (shared/ops/slack_interactions.py), mapped to an onceflow user.
"""

from __future__ import annotations

import json
import smtplib
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any

from shared.core import queries
from shared.core.db import Database
from shared.core.duty import Dispatch, SweepConfig, SweepReport
from shared.core.logs import get_logger
from shared.core.settings import named_secret, settings
from shared.steps.link_signing import LinksNotConfigured, make_link, public_url

SQL = queries.load("approval_messages")
CLAIM_SENDS = SQL["approval_messages_claim_sends"]
SENT = SQL["approval_messages_sent"]
FAILED = SQL["approval_messages_failed"]
CLAIM_UPDATES = SQL["approval_messages_claim_updates"]
UPDATE_FAILED = SQL["approval_messages_update_failed"]
VIEW = SQL["approval_messages_view"]
REMIND_DUE = SQL["approvals_remind_due"]
ESCALATE_DUE = SQL["approvals_escalate_due"]

SEND_TIMEOUT_SECONDS = 5.0
LEASE_SECONDS = 30.0
RETRY_SECONDS = 60.0
MAX_ATTEMPTS = 5
APPROVE, REJECT = "approve", "reject"

log = get_logger(__name__)


class SlackError(Exception):
    """Slack refused or could not be reached; the message is tried again later."""


class SlackRateLimited(SlackError):
    """Slack answered HTTP 429 with `Retry-After` (https://api.slack.com/docs/rate-limits:
    chat.postMessage allows about one post per second per channel, short bursts tolerated).
    Not a failure of the message: it is tried again after `retry_after` seconds, the attempt
    not counted, and the pass sends nothing more to that channel."""

    def __init__(self, method: str, retry_after: float) -> None:
        super().__init__(f"{method}: rate limited by Slack; retry after {retry_after:g} s")
        self.retry_after = retry_after


def _retry_after(exc: urllib.error.HTTPError) -> float:
    """Slack's Retry-After, in seconds (1 when it is missing or unreadable)."""
    try:
        return max(1.0, float(exc.headers.get("retry-after") or 1))
    except ValueError:
        return 1.0


def slack_call(method: str, token: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One Web API call; its answer when `ok`, else SlackError (Slack says why in `error`)."""
    request = urllib.request.Request(  # noqa: S310 - the configured Slack API base
        f"{settings().slack_api_url.rstrip('/')}/{method}",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json; charset=utf-8",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_SECONDS) as answer:  # noqa: S310
            said = json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        exc.close()  # the error holds the answer's connection
        if exc.code == 429:
            raise SlackRateLimited(method, _retry_after(exc)) from None
        raise SlackError(f"{method}: HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:
        raise SlackError(f"{method}: {exc}") from None
    if not isinstance(said, dict) or not said.get("ok"):
        raise SlackError(f"{method}: {said.get('error') if isinstance(said, dict) else said}")
    return said


def plain(text: str) -> str:
    """`text` as Slack shows it, literally: mrkdwn takes `<…>` as control sequences (`<!channel>`
    pings everyone, `<https://x|Approve>` is a link that says something else), so `&`, `<` and
    `>` are escaped, as Slack asks of any text not meant as markup
    (https://api.slack.com/reference/surfaces/formatting#escaping). A summary is rendered from
    the run's data, chosen by whoever edits the CRM record; a user label by an operator."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(view: Mapping[str, Any]) -> dict[str, Any]:
    """The message's text and blocks for the approval as it is now: the summary, the votes so
    far, and the buttons while it waits (the decision and who made it, once decided)."""
    votes = [v for v in view["votes"] if v["counted"]]
    approvers = [plain(v["voter"]) for v in votes if v["decision"] == "approved"]
    state: str
    if view["decision"] is not None:
        state = f"*{view['decision'].capitalize()}* by {plain(view['decided_by'])}"
        if view["decision"] == "approved" and len(approvers) > 1:
            state += f" (approvals: {', '.join(approvers)})"
    elif view["resumed_by"] == "deadline":
        state = "*Expired* without a decision"
    elif view["resumed_at"] is not None:
        state = "*Closed* (the run ended)"
    else:
        state = f"Waiting: {len(approvers)} of {view['required']} approvals"
        if approvers:
            state += f" ({', '.join(approvers)})"
        if view["escalated_at"] is not None:
            added = [plain(u) for u in view["escalate_users"] or ()]
            added += [f"role {plain(view['escalate_role'])}"] if view["escalate_role"] else []
            state += f"; escalated to {', '.join(added)}"
    text = f"{plain(view['summary'])}\n{state}"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if view["resumed_at"] is None:
        value = str(view["id"])
        blocks.append(
            {
                "type": "actions",
                "block_id": f"approval-{value}",
                "elements": [
                    _button("Approve", APPROVE, value, "primary"),
                    _button("Reject", REJECT, value, "danger"),
                ],
            }
        )
    return {"text": text, "blocks": blocks}


def nudge(view: Mapping[str, Any], purpose: str) -> dict[str, Any]:
    """A reminder (to those named or holding its role who have not decided) or an escalation
    (to those it adds, by name or role), a reply in the ask's thread, mentioning each by their
    mapped Slack id."""
    ids: Mapping[str, str] = view["slack_ids"] or {}
    if purpose == "remind":
        named, members, role = view["approver_users"], view["role_members"], view["approver_role"]
        done = {v["voter"] for v in view["votes"]}
        lead = "Reminder: this approval is still waiting for"
    else:
        named, members = view["escalate_users"], view["escalate_role_members"]
        role, done = view["escalate_role"], set()
        lead = "Escalated: now also for"
    users = [u for u in named or () if u not in done]
    # A role's members with a Slack id (the view lists only those: approval_messages_view) are
    # mentioned; the role's name covers the others, however many.
    users += [u for u in members or () if u not in done and u not in users]
    who = [f"<@{ids[u]}>" if u in ids else plain(u) for u in users]
    who += [f"role {plain(role)}"] if role else []
    text = f"{lead} {', '.join(who) or 'its approvers'}: {plain(view['summary'])}"
    said: dict[str, Any] = {"text": text}
    if view["ask_ts"]:
        said["thread_ts"] = view["ask_ts"]
    return said


def _button(label: str, action_id: str, value: str, style: str) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "action_id": action_id,
        "value": value,
        "style": style,
    }


def _view(db: Database, park_id: int) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one(VIEW, park_id=park_id)
    assert row is not None  # messages are deleted with their park (ON DELETE CASCADE)
    return row


class EmailError(Exception):
    """The email could not be sent (or made); tried again later."""


SUBJECTS = {
    "ask": "Approval needed",
    "remind": "Reminder: approval still needed",
    "escalate": "Escalated: approval needed",
}


def send_email(row: Mapping[str, Any], view: Mapping[str, Any]) -> None:
    """The approval's signed link (shared/steps/link_signing.py) for the recipient user,
    mailed through the tenant's SMTP server (`tenants.smtp_*`; the password by secret
    reference) to their mapped address. Opening the link decides nothing; its form posts the
    decision as that user (a vote, via link)."""
    address, user = row["email_address"], str(row["recipient"])
    if not row["smtp_host"]:
        raise EmailError("the tenant has no SMTP server (tenants.smtp_host)")
    if not address:
        raise EmailError(f"no email address is mapped for user {user}")
    try:
        link = make_link(int(view["id"]), user, view["deadline"])
        url = public_url(link) or link.path
    except LinksNotConfigured as exc:
        raise EmailError(str(exc)) from None
    message = EmailMessage()
    # The summary is the run's data (a CRM record's name): on one line, so a CR/LF in it never
    # makes a header of its own (a Bcc:). str.split() takes every line break Python knows.
    subject_line = " ".join(str(view["summary"]).split())[:80]
    try:
        message["From"] = row["smtp_from"]
        message["To"] = address
        message["Subject"] = f"{SUBJECTS[str(row['purpose'])]}: {subject_line}"
    except ValueError as exc:  # a line break in an address stored before it was checked
        raise EmailError(f"the message's headers cannot be made: {exc}") from None
    message.set_content(
        f"{view['summary']}\n\nApprove or reject (as {user}) here, until "
        f"{view['deadline']:%Y-%m-%d %H:%M %Z}:\n{url}\n"
    )
    password = named_secret(row["smtp_password_env"]) if row["smtp_password_env"] else None
    try:
        with smtplib.SMTP(
            row["smtp_host"], int(row["smtp_port"] or 25), timeout=SEND_TIMEOUT_SECONDS
        ) as smtp:
            if row["smtp_starttls"] and smtp.has_extn("starttls"):
                smtp.starttls()
            if row["smtp_username"] and password:
                smtp.login(row["smtp_username"], password)
            smtp.send_message(message)
    except (smtplib.SMTPException, OSError) as exc:
        raise EmailError(f"smtp: {exc}") from None


def _token(env: str | None) -> str:
    token = named_secret(env) if env else None
    if token is None:
        raise SlackError(f"no Slack bot token: set the tenant's slack_bot_token_env ({env})")
    return token


def _send(row: Mapping[str, Any], view: Mapping[str, Any]) -> dict[str, Any]:
    """Send one claimed message; Slack's answer (its `ts`), or {} for an email or none sent.
    The Slack ask is posted whatever the approval's state (it shows it); a reminder, an
    escalation or an email link is not sent once the approval was decided: it would ask for
    nothing."""
    purpose = str(row["purpose"])
    if row["channel"] == "slack" and purpose == "ask":
        token = _token(row["slack_bot_token_env"])
        return slack_call("chat.postMessage", token, {"channel": row["recipient"], **render(view)})
    if view["resumed_at"] is not None:
        return {}
    if row["channel"] == "email":
        send_email(row, view)
        return {}
    token = _token(row["slack_bot_token_env"])
    return slack_call(
        "chat.postMessage", token, {"channel": row["recipient"], **nudge(view, purpose)}
    )


def deliver_approval_messages(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """The sweep's repair: send the approval messages due, then the updates due. The number
    of rows claimed (a full batch: the loop goes again)."""
    del dispatch, report  # nothing to dispatch: a message never moves a step
    with db.transaction() as tx:
        sends = tx.all(CLAIM_SENDS, lease_seconds=LEASE_SECONDS, batch=config.batch)
    # Slack channels that answered 429 in this pass: their other messages wait as long, unsent.
    held: dict[tuple[str, str], SlackRateLimited] = {}
    for row in sends:
        channel = (str(row["tenant_id"]), str(row["recipient"]))
        limited = held.get(channel) if row["channel"] == "slack" else None
        if limited is not None:
            _failed(db, row, limited, retry_seconds=limited.retry_after, counted=False)
            continue
        try:
            said = _send(row, _view(db, int(row["park_id"])))
        except SlackRateLimited as exc:
            held[channel] = exc
            _failed(db, row, exc, retry_seconds=exc.retry_after, counted=False)
            continue
        except (SlackError, EmailError) as exc:
            log.warning("approval %s: %s send failed: %s", row["park_id"], row["channel"], exc)
            _failed(db, row, exc, retry_seconds=RETRY_SECONDS, counted=True)
            continue
        with db.transaction() as tx:
            tx.execute(
                SENT, id=row["id"], slack_ts=said.get("ts"), slack_channel=said.get("channel")
            )
    with db.transaction() as tx:
        updates = tx.all(CLAIM_UPDATES, batch=config.batch)
    for row in updates:
        try:
            slack_call(
                "chat.update",
                _token(row["slack_bot_token_env"]),
                {
                    "channel": row["slack_channel"],
                    "ts": row["slack_ts"],
                    **render(_view(db, int(row["park_id"]))),
                },
            )
        except SlackError as exc:
            log.warning("approval %s: Slack update failed: %s", row["park_id"], exc)
            wait = exc.retry_after if isinstance(exc, SlackRateLimited) else RETRY_SECONDS
            with db.transaction() as tx:
                tx.execute(UPDATE_FAILED, id=row["id"], retry_seconds=wait, error=str(exc))
    return max(len(sends), len(updates))


def _failed(
    db: Database, row: Mapping[str, Any], exc: Exception, *, retry_seconds: float, counted: bool
) -> None:
    """A claimed message not sent: due again after `retry_seconds`; `counted` (not for a 429)
    spends one of its MAX_ATTEMPTS."""
    with db.transaction() as tx:
        tx.execute(
            FAILED,
            id=row["id"],
            retry_seconds=retry_seconds,
            max_attempts=MAX_ATTEMPTS,
            counted=counted,
            error=str(exc),
        )


def remind_and_escalate_approvals(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """The sweep's repair, before the messages are sent: each approval whose `remind_after`
    has passed is reminded, each whose `escalate_after` has passed escalates — each at most
    once (guarded: approvals_remind_due, approvals_escalate_due); what they send is queued for
    `deliver_approval_messages`. The number of approvals moved (a full batch: go again)."""
    del dispatch, report  # neither moves a step
    with db.transaction() as tx:
        reminded = tx.all(REMIND_DUE, batch=config.batch)
    with db.transaction() as tx:
        escalated = tx.all(ESCALATE_DUE, batch=config.batch)
    return max(len(reminded), len(escalated))
