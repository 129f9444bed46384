"""Messaging: `/v1/messaging` — how a tenant's approvals reach people: its Slack app and its
SMTP server (issue 31 item 4), set and shown without SQL.

Like a connection, a setting names the environment variables (Secret Manager in the cloud)
that hold the secrets, never a secret: the bot token's and the Slack app signing secret's,
the SMTP password's. Each kind is set whole, so a tenant never has half a Slack app.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shared.core.settings import named_secret
from shared.ops.api.approver_identities import address_problem
from shared.ops.api.http import Call, named_tenant
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    MessagingQuery,
    MessagingSettings,
    SlackSettings,
    SlackSettingsSet,
    SmtpSettings,
    SmtpSettingsSet,
)
from shared.ops.statements import MESSAGING_SETTINGS, SLACK_SETTINGS_SET, SMTP_SETTINGS_SET

# The host column's own check (migration 0511): a name or an address, nothing else.
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}")
# A port not given is submission's (RFC 6409), the one a STARTTLS login expects.
SMTP_SUBMISSION_PORT = 587


def get_messaging(call: Call) -> MessagingSettings:
    q: MessagingQuery = call.query
    return _settings(call, named_tenant(call, q.tenant_id))


def set_slack(call: Call) -> MessagingSettings:
    body: SlackSettingsSet = call.body
    tenant_id = named_tenant(call, body.tenant_id)
    if (body.bot_token_env is None) != (body.signing_secret_env is None):
        raise OpsError(
            422,
            "slack_incomplete",
            "name both bot_token_env and signing_secret_env (or neither, for no Slack): the"
            " sweep posts with the one, the webhook verifies clicks with the other",
        )
    with call.db.transaction() as tx:
        row = tx.one(
            SLACK_SETTINGS_SET,
            tenant_id=tenant_id,
            bot_token_env=body.bot_token_env,
            signing_secret_env=body.signing_secret_env,
        )
    if row is None:
        raise not_found("tenant")
    return _settings(call, tenant_id)


def set_smtp(call: Call) -> MessagingSettings:
    body: SmtpSettingsSet = call.body
    tenant_id = named_tenant(call, body.tenant_id)
    port = body.port
    if body.host is None:
        given = (body.sender, body.username, body.password_env, body.port)
        if any(v is not None for v in given):
            raise OpsError(
                422, "smtp_host_required", "no host clears the SMTP settings: give nothing else"
            )
    else:
        if not _HOST.fullmatch(body.host):
            raise OpsError(422, "smtp_host_malformed", f"{body.host!r} is not a host name")
        port = SMTP_SUBMISSION_PORT if port is None else port
        if body.sender is None:
            raise OpsError(422, "smtp_sender_required", "give the From address (sender)")
        problem = address_problem(body.sender)
        if problem is not None:
            raise OpsError(422, "smtp_sender_malformed", problem)
        if (body.username is None) != (body.password_env is None):
            raise OpsError(
                422, "smtp_login_incomplete", "give both username and password_env, or neither"
            )
    with call.db.transaction() as tx:
        row = tx.one(
            SMTP_SETTINGS_SET,
            tenant_id=tenant_id,
            host=body.host,
            port=port,
            sender=body.sender,
            username=body.username,
            password_env=body.password_env,
            starttls=body.starttls,
        )
    if row is None:
        raise not_found("tenant")
    return _settings(call, tenant_id)


def _settings(call: Call, tenant_id: str) -> MessagingSettings:
    with call.db.transaction() as tx:
        row = tx.one(MESSAGING_SETTINGS, tenant_id=tenant_id)
    if row is None:
        raise not_found("tenant")
    return settings_of(row)


def _set_here(variable: str) -> bool:
    """The variable is set in this (the ops) function's environment, as a connection's
    credentials_configured is judged (shared/ops/health.py); never its value."""
    return named_secret(variable) is not None


def settings_of(row: Mapping[str, Any]) -> MessagingSettings:
    slack = (
        SlackSettings(
            bot_token_env=row["slack_bot_token_env"],
            signing_secret_env=row["slack_signing_secret_env"],
            bot_token_set=_set_here(row["slack_bot_token_env"]),
            signing_secret_set=_set_here(row["slack_signing_secret_env"]),
        )
        if row["slack_bot_token_env"] and row["slack_signing_secret_env"]
        else None
    )
    smtp = (
        SmtpSettings(
            host=row["smtp_host"],
            port=row["smtp_port"],
            sender=row["smtp_from"],
            username=row["smtp_username"],
            password_env=row["smtp_password_env"],
            password_set=_set_here(row["smtp_password_env"]) if row["smtp_password_env"] else None,
            starttls=row["smtp_starttls"],
        )
        if row["smtp_host"]
        else None
    )
    return MessagingSettings(tenant_id=row["tenant_id"], slack=slack, smtp=smtp)
