"""`webhook` entry point: `POST /{provider}/{connection_id}` and, for a provider app's one URL
for all its accounts, `POST /{provider}/app/{appId}` (public, no IAM). Also the provider's browser
redirect back from an app install, `GET /oauth/{provider}/callback`, and signed approval links,
`/ui/decide/...`: this is the one public function, and those pages are authenticated by what
the browser brings (the install's single-use state, shared/accounts/oauth_install_http.py; the
link's
signature, shared/ops/approval_links.py), and Slack's interaction callbacks for approval
messages, `POST /slack/interactions/<tenant>` (Slack's signature, shared/ops/slack_interactions.py).
Nothing else of the ops page is served here.

Thin: turn the Flask request into a `WebhookRequest`, let `shared.ingest.receive` decide,
answer with its JSON, then nudge the drain (after the response is decided; never fails it).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import flask
import functions_framework

from shared.core import tracing
from shared.core.db import get_database
from shared.core.logs import labelled, traced
from shared.core.request_body import BodyRefused, detached, read_body
from shared.core.settings import settings
from shared.ingest import app_webhook, nudge
from shared.ingest.receive import WebhookRequest, receive_webhook
from shared.ops import install_callback, slack_interactions
from shared.ops.approval_links import PATH_PREFIX as APPROVAL_LINK_PREFIX


@functions_framework.http
def webhook(request: Any) -> flask.Response:
    if install_callback.is_callback(request.path):
        with traced(request.headers), labelled(function="webhook"):
            return install_callback.callback(get_database(), request)
    if request.path.startswith(f"{APPROVAL_LINK_PREFIX}/"):
        # Imported here: the page's templates are not what a CRM delivery should wait for.
        from shared.ops.api.app import default_api
        from shared.ops.page import handle_approval_link

        with traced(request.headers), labelled(function="webhook"):
            return detached(handle_approval_link(default_api(), request), request)
    if slack_interactions.is_path(request.path):
        return _slack_interaction(request)
    with traced(request.headers), labelled(function="webhook"):
        receive = (
            app_webhook.receive_app_webhook
            if app_webhook.is_app_path(request.path)
            else receive_webhook
        )
        webhook_request = WebhookRequest(
            method=request.method,
            path=request.path,
            query_string=request.query_string.decode("latin-1"),
            scheme=request.scheme,
            host=request.host,
            headers=dict(request.headers),
            content_length=request.content_length,
            read=request.stream.read,
            environ=request.environ,
        )
        # The trace's first span (or the caller's `traceparent`, continued): what it stores
        # carries its context to the drain, admission and every step (shared/core/tracing.py).
        with tracing.span("webhook", headers=request.headers, path=request.path):
            answer = receive(webhook_request)
    if answer.stored is not None or answer.event_id is not None:
        # Best effort by contract: the schedule drains anyway, so a nudge can't fail a delivery.
        with contextlib.suppress(Exception):
            nudge.nudge()
    # Detached: a refused request's unread body is never read after the answer (an oversize
    # one is refused "without reading the rest"; a 404 or 405 never read any of it).
    return detached(
        flask.Response(json.dumps(answer.body), status=answer.status, mimetype="application/json"),
        request,
    )


def _slack_interaction(request: Any) -> flask.Response:
    """A Slack button click: the raw body (the signature covers its exact bytes), decided by
    shared/ops/slack_interactions.py, answered at once."""
    from shared.ops.api.app import default_api

    with traced(request.headers), labelled(function="webhook"):
        if request.method != "POST":
            status, body = 405, {"ok": False, "error": "method_not_allowed"}
        else:
            try:
                raw = read_body(
                    request.stream.read,
                    declared_length=request.content_length,
                    cap=slack_interactions.MAX_BODY_BYTES,
                    environ=request.environ,
                    deadline_seconds=settings().request_deadline_seconds,
                )
            except BodyRefused as refused:
                status, body = refused.status, {"ok": False, "error": refused.code}
            else:
                api = default_api()
                answer = slack_interactions.handle(
                    api.db,
                    api.dispatch,
                    path=request.path,
                    headers=dict(request.headers),
                    body=raw,
                )
                status, body = answer.status, answer.body
    return detached(
        flask.Response(json.dumps(body), status=status, mimetype="application/json"), request
    )
