"""`webhook` entry point: `POST /{provider}/{connection_id}` (public, no IAM).

Thin: turn the Flask request into a `WebhookRequest`, let `shared.webhooks.receive` decide,
answer with its JSON, then nudge the drain (after the response is decided; never fails it).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import flask
import functions_framework

from shared.logs import labelled, traced
from shared.webhooks import nudge
from shared.webhooks.receive import WebhookRequest, receive_webhook


@functions_framework.http
def webhook(request: Any) -> tuple[str, int, dict[str, str]] | flask.Response:
    with traced(request.headers), labelled(function="webhook"):
        answer = receive_webhook(
            WebhookRequest(
                method=request.method,
                path=request.path,
                query_string=request.query_string.decode("latin-1"),
                scheme=request.scheme,
                host=request.host,
                headers=dict(request.headers),
                content_length=request.content_length,
                read=request.stream.read,
            )
        )
    if answer.stored is not None or answer.event_id is not None:
        # Best effort by contract: the schedule drains anyway, so a nudge can't fail a delivery.
        with contextlib.suppress(Exception):
            nudge.nudge()
    if answer.status == 413:
        # functions-framework reads the whole request body after the view returns, unless the
        # response is streamed; a streamed answer keeps "without reading the rest" true.
        return flask.Response(
            iter([json.dumps(answer.body)]), status=413, mimetype="application/json"
        )
    return json.dumps(answer.body), answer.status, {"Content-Type": "application/json"}
