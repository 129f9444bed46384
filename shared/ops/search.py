"""Find a record the way people name it: a HubSpot record URL, an object id, an email, or a
record key, within the caller's own connections.

Support people paste what they have in front of them: the address bar of the HubSpot record,
the id a colleague sent, the lead's email. Each is turned into record keys
(`<connection id>:<object type>:<object id>`, shared/workflows/scope.py) that the timeline
explains. Every lookup is confined to the connections of the caller's tenant (all of them for
an admin token), so another tenant's records are never found, nor counted.

The same module knows the opposite direction: the HubSpot address of a record, for the
"open in HubSpot" links.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Literal
from urllib.parse import urlsplit

from shared.core import queries
from shared.core.db import Tx
from shared.ops.errors import OpsError
from shared.ops.explain import parse_record_key
from shared.ops.models import RecordMatch, RecordSearch
from shared.port.record_labels import shown_for
from shared.providers.hubspot.normalize import object_type_for, type_id_for
from shared.workflows.scope import record_key as make_record_key

SQL = queries.load("search")
CONNECTIONS = SQL["search_connections"]
CONNECTION_GET = SQL["search_connection_get"]
BY_OBJECT_ID = SQL["search_records_by_object_id"]
BY_EMAIL = SQL["search_records_by_email"]

MAX_MATCHES = 50
Kind = Literal["record_key", "hubspot_url", "email", "object_id"]

_HUBSPOT_HOST = re.compile(r"^app(-[a-z0-9]+)?\.hubspot\.com$")
# /contacts/<portal>/record/<type id>/<object id>, and the older /contacts/<portal>/<type>/<id>.
_RECORD_PATH = re.compile(r"^/contacts/(\d{1,20})/record/(\d+-\d+)/(\d{1,30})(?:/.*)?$")
_LEGACY_PATH = re.compile(
    r"^/contacts/(\d{1,20})/(contact|company|deal|ticket)/(\d{1,30})(?:/.*)?$"
)
_EMAIL = re.compile(r"^[^@\s]{1,200}@[^@\s]{1,200}\.[^@\s]{1,50}$")
_OBJECT_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def hubspot_location(url: str) -> tuple[str, str, str]:
    """(portal id, object type, object id) of a HubSpot record URL; 422 for any other URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not _HUBSPOT_HOST.match(parts.hostname or ""):
        raise OpsError(422, "unknown_url", "only HubSpot record URLs (app.hubspot.com) are read")
    found = _RECORD_PATH.match(parts.path)
    if found:
        return found[1], object_type_for(found[2]), found[3]
    legacy = _LEGACY_PATH.match(parts.path)
    if legacy:
        return legacy[1], legacy[2], legacy[3]
    raise OpsError(
        422,
        "unknown_url",
        "that HubSpot address is not a record page (/contacts/<portal>/record/<type>/<id>)",
    )


def classify(q: str) -> Kind:
    if q.startswith(("http://", "https://")):
        return "hubspot_url"
    if "@" in q:
        if not _EMAIL.match(q):
            raise OpsError(422, "invalid_search", "that does not look like an email address")
        return "email"
    if q.count(":") >= 2:
        return "record_key"
    if _OBJECT_ID.match(q):
        return "object_id"
    raise OpsError(
        422,
        "invalid_search",
        "search with a HubSpot record URL, an object id, an email or a record key",
    )


def find_records(tx: Tx, q: str, *, tenant_scope: str | None) -> list[RecordMatch]:
    return search(tx, q, tenant_scope=tenant_scope).items


def search(tx: Tx, q: str, *, tenant_scope: str | None, limit: int = MAX_MATCHES) -> RecordSearch:
    q = q.strip()
    kind = classify(q)
    if kind == "record_key":
        items = _by_record_key(tx, q, tenant_scope)
    elif kind == "hubspot_url":
        portal, object_type, object_id = hubspot_location(q)
        conns = tx.all(CONNECTIONS, tenant_id=tenant_scope, account_id=portal)
        conns = [c for c in conns if c["provider"] == "hubspot"]
        items = _by_object_id(
            tx,
            conns,
            object_id,
            object_type=object_type,
            limit=limit,
            matched_on="HubSpot record URL",
        )
        if not items and len(conns) == 1:
            # The portal is one of the caller's connections, and nothing was ever received
            # for the record: that itself answers "why didn't it run?".
            key = make_record_key(str(conns[0]["id"]), object_type, object_id)
            items = [_match(key, "HubSpot record URL (nothing received for it yet)", None)]
    elif kind == "email":
        conns = tx.all(CONNECTIONS, tenant_id=tenant_scope, account_id=None)
        items = _by_email(tx, conns, q, limit)
    else:
        conns = tx.all(CONNECTIONS, tenant_id=tenant_scope, account_id=None)
        items = _by_object_id(tx, conns, q, object_type=None, limit=limit, matched_on="object id")
    shown = shown_for(tx, [m.record_key for m in items])
    items = [m.model_copy(update={"label": shown.get(m.record_key)}) for m in items]
    return RecordSearch(query=q, interpreted_as=kind, items=items)


def _match(record_key: str, matched_on: str, last_seen_at: Any) -> RecordMatch:
    connection_id, object_type, object_id = parse_record_key(record_key)
    return RecordMatch(
        record_key=record_key,
        connection_id=uuid.UUID(connection_id),
        object_type=object_type,
        object_id=object_id,
        matched_on=matched_on,
        last_seen_at=last_seen_at,
    )


def _by_record_key(tx: Tx, q: str, tenant_scope: str | None) -> list[RecordMatch]:
    try:
        connection_id, _, _ = parse_record_key(q)
    except OpsError:
        return []
    conn = tx.one(CONNECTION_GET, connection_id=connection_id)
    if conn is None or (tenant_scope is not None and conn["tenant_id"] != tenant_scope):
        return []
    return [_match(q, "record key", None)]


def _scope_params(conns: list[dict[str, Any]]) -> dict[str, Any]:
    ids = [str(c["id"]) for c in conns]
    return {
        "connection_ids": ids,
        "connection_id_texts": ids,
        "tenant_ids": sorted({c["tenant_id"] for c in conns}),
    }


def _rows_to_matches(rows: list[dict[str, Any]], matched_on: str) -> list[RecordMatch]:
    return [
        _match(
            make_record_key(str(r["connection_id"]), r["object_type"], r["object_id"]),
            matched_on,
            r["last_seen_at"],
        )
        for r in rows
    ]


def _by_object_id(
    tx: Tx,
    conns: list[dict[str, Any]],
    object_id: str,
    *,
    object_type: str | None,
    limit: int,
    matched_on: str,
) -> list[RecordMatch]:
    if not conns:
        return []
    rows = tx.all(
        BY_OBJECT_ID,
        object_id=object_id,
        object_type=object_type,
        limit=limit,
        **_scope_params(conns),
    )
    return _rows_to_matches(rows, matched_on)


def _by_email(tx: Tx, conns: list[dict[str, Any]], email: str, limit: int) -> list[RecordMatch]:
    if not conns:
        return []
    rows = tx.all(
        BY_EMAIL,
        email=email.lower(),
        limit=limit,
        **_scope_params(conns),
    )
    return _rows_to_matches(rows, "email")


def record_url(tx: Tx, record_key: str) -> str | None:
    """The record's page in HubSpot, when its connection is a HubSpot portal we know."""
    try:
        connection_id, object_type, object_id = parse_record_key(record_key)
    except OpsError:
        return None
    conn = tx.one(CONNECTION_GET, connection_id=connection_id)
    if conn is None or conn["provider"] != "hubspot" or not conn["provider_account_id"]:
        return None
    type_id = type_id_for(object_type) or (
        object_type.removeprefix("object_").replace("_", "-")
        if object_type.startswith("object_")
        else None
    )
    if type_id is None:
        return None
    return (
        f"https://app.hubspot.com/contacts/{conn['provider_account_id']}/record/"
        f"{type_id}/{object_id}"
    )
