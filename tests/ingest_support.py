"""Test helpers for the events-in path: tenants/connections rows, provider payloads, and
signatures computed here with hmac/hashlib, independently of shared/providers/*/signature.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import functions_framework

from devstack import seed
from shared.core.db import Database

HUBSPOT_SECRET = "hs-app-secret-0123456789"
STANDARD_KEY = b"standard-webhooks-key-bytes-32!!"
STANDARD_SECRET = "whsec_" + base64.b64encode(STANDARD_KEY).decode()
PIPEDRIVE_CREDENTIALS = "onceflow:pd-pass-word"


MAIN = str(Path(__file__).resolve().parent.parent / "main.py")


def webhook_client() -> Any:
    """The `webhook` entry point of main.py as functions-framework serves it; a test client."""
    return functions_framework.create_app("webhook", MAIN, "http").test_client()


def make_tenant(db: Database, tenant_id: str = "acme") -> str:
    with db.transaction() as tx:
        return seed.tenant(tx, tenant_id, existing="keep")


def make_connection(
    db: Database,
    *,
    tenant_id: str = "acme",
    provider: str = "hubspot",
    secret_env: str = "HUBSPOT_SECRET_ACME",
    signature_versions: tuple[str, ...] = ("v3",),
    watched_fields: dict[str, list[str]] | None = None,
    app_id: str | None = None,
    portal_id: str | None = None,
) -> str:
    make_tenant(db, tenant_id)
    with db.transaction() as tx:
        return seed.connection(
            tx,
            tenant_id,
            provider=provider,
            webhook_secret_env=secret_env,
            signature_versions=signature_versions,
            watched_fields=watched_fields,
            provider_app_id=app_id,
            provider_account_id=portal_id,
        )


def hubspot_event(
    event_id: int,
    object_id: int = 101,
    *,
    subscription_type: str = "contact.propertyChange",
    property_name: str | None = "lifecyclestage",
    property_value: Any = "lead",
    occurred_at_ms: int = 1_700_000_000_000,
    change_source: str = "CRM_UI",
    source_id: str = "userId:42",
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "eventId": event_id,
        "subscriptionId": 9,
        "portalId": 555,
        "appId": 77,
        "occurredAt": occurred_at_ms,
        "subscriptionType": subscription_type,
        "attemptNumber": 0,
        "objectId": object_id,
        "changeSource": change_source,
        "sourceId": source_id,
    }
    if subscription_type.endswith("propertyChange"):
        event["propertyName"] = property_name
        event["propertyValue"] = property_value
    return event


def hubspot_body(*events: dict[str, Any]) -> bytes:
    return json.dumps(list(events)).encode()


def hubspot_v3_headers(
    body: bytes,
    uri: str,
    *,
    secret: str = HUBSPOT_SECRET,
    method: str = "POST",
    timestamp_ms: int | None = None,
) -> dict[str, str]:
    stamp = str(timestamp_ms if timestamp_ms is not None else int(time.time() * 1000))
    message = method.encode() + uri.encode() + body + stamp.encode()
    signature = base64.b64encode(hmac.new(secret.encode(), message, hashlib.sha256).digest())
    return {
        "Content-Type": "application/json",
        "X-HubSpot-Signature-v3": signature.decode(),
        "X-HubSpot-Request-Timestamp": stamp,
    }


def hubspot_v2_headers(
    body: bytes, uri: str, *, secret: str = HUBSPOT_SECRET, method: str = "POST"
) -> dict[str, str]:
    digest = hashlib.sha256(secret.encode() + method.encode() + uri.encode() + body).hexdigest()
    return {"X-HubSpot-Signature": digest, "X-HubSpot-Signature-Version": "v2"}


def hubspot_v1_headers(body: bytes, *, secret: str = HUBSPOT_SECRET) -> dict[str, str]:
    digest = hashlib.sha256(secret.encode() + body).hexdigest()
    return {"X-HubSpot-Signature": digest, "X-HubSpot-Signature-Version": "v1"}


def standard_headers(
    body: bytes, *, msg_id: str = "msg_1", timestamp: int | None = None, key: bytes = STANDARD_KEY
) -> dict[str, str]:
    stamp = str(timestamp if timestamp is not None else int(time.time()))
    signed = f"{msg_id}.{stamp}.".encode() + body
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": stamp,
        "webhook-signature": f"v1,{signature}",
    }


def basic_auth(credentials: str = PIPEDRIVE_CREDENTIALS) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


def inbox_rows(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT id, connection_id::text AS connection_id, status, deliveries, attempts,"
            " headers, outcome, last_error, next_attempt_at, lease_id FROM webhook_inbox"
            " ORDER BY id"
        )


def trigger_events(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all("SELECT * FROM workflow_trigger_events ORDER BY id")
