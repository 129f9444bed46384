"""The receive path of `POST /{provider}/app/{appId}`: one webhook URL per provider app, for the
providers that declare app webhooks (shared/providers/registry.py `app_providers`).

The provider calls one target URL per app, for every account that installed it, and a batch can
mix accounts (shared/providers/<provider>/apps.py says how an event names its own). This path
verifies the delivery
with the APP's client secret, stores the batch once (`inbox.store_for_app`) and answers; the
drain routes each event to its connection by (appId, portalId) and records the events of
portals with no live connection (shared/accounts/provider_apps.py). Nothing about portals is decided
here: the answer must not wait on routing, and an unknown portal is never a reason to refuse
the known ones.

| outcome                                   | status |
|-------------------------------------------|--------|
| not POST                                  | 405    |
| body over the cap                         | 413    |
| malformed framing / body too slow         | 400 / 408 |
| unknown app                               | 404    |
| missing, bad or stale signature (incl. a signature made with another app's secret) | 401 |
| the app's secret env var is not set       | 503 (HubSpot retries; nothing stored) |
| database unavailable                      | 503    |
| stored (new or identical retry)           | 200    |

The body reading (shared/core/request_body.py), the URI rules and the kept headers are the
connection path's (shared/ingest/receive.py), so both paths verify the same way.
"""

from __future__ import annotations

import re

from shared.accounts import provider_apps
from shared.core import request_body
from shared.core.db import Database, get_database
from shared.core.errors import TransientError
from shared.core.logs import get_logger, labelled
from shared.ingest import inbox
from shared.ingest.receive import (
    Answer,
    WebhookRequest,
    kept_headers,
    read_webhook_body,
    signed_request,
    store_and_answer,
)
from shared.providers import registry

APP_PATH = re.compile(
    r"^/?(?P<provider>" + "|".join(map(re.escape, registry.app_providers())) + r")/app/"
    r"(?P<app_id>[^/]+)/?$"
)
log = get_logger(__name__)


def app_path(provider: str, app_id: str) -> str:
    """The app's one webhook URL on the webhook function, below its public base."""
    return f"/{provider}/app/{app_id}"


def is_app_path(path: str) -> bool:
    return APP_PATH.match(path) is not None


def _refuse(status: int, error: str, check: str, app_id: str) -> Answer:
    log.warning("app webhook refused (%d): %s", status, check, extra={"labels": {"app": app_id}})
    return Answer(status, {"error": error, "check": check})


def receive_app_webhook(  # noqa: PLR0911 - one return per row of the outcome table
    request: WebhookRequest, db: Database | None = None
) -> Answer:
    """Size-check, verify against the app and store one app-level delivery; the answer."""
    if request.method != "POST":
        return _refuse(405, "method_not_allowed", "method", "")
    match = APP_PATH.match(request.path)
    if match is None or not provider_apps.is_app_id(match["app_id"]):
        return _refuse(404, "unknown_app", "path", "")
    provider_name, app_id = match["provider"], match["app_id"]
    try:
        body = read_webhook_body(request)
    except request_body.BodyRefused as refused:
        return _refuse(refused.status, refused.code, refused.check, app_id)
    db = db or get_database()
    try:
        with db.transaction() as tx:
            app = provider_apps.get_app(tx, provider_name, app_id)
    except TransientError as exc:
        log.warning("app webhook: database unavailable: %s", exc)
        return Answer(503, {"error": "unavailable"})
    if app is None:
        return _refuse(404, "unknown_app", "app_not_found", app_id)
    with labelled(app=app_id):
        try:
            secret = app.client_secret()
        except provider_apps.SecretUnavailable as exc:
            log.error("app webhook: cannot verify: %s", exc)
            return Answer(503, {"error": "verification_unavailable"})
        signed = signed_request(request, body, app.signature_versions)
        provider = registry.get(provider_name)
        assert provider is not None  # APP_PATH matches only registered app providers
        verdict = provider.verify(secret, signed)
        if not verdict.ok:
            return _refuse(401, "invalid_signature", verdict.check, app_id)
        kept = kept_headers(request.headers)
        return store_and_answer(
            db, lambda tx: inbox.store_for_app(tx, app, body, kept), verdict.check, "app webhook"
        )
