"""Find a record the way people name it: a record page's URL in the vendor's UI, an object id, an
email, or a record key, within the caller's own connections.

Support people paste what they have in front of them: the address bar of the CRM's record page,
the id a colleague sent, the lead's email. Each is turned into record keys
(`<connection id>:<object type>:<object id>`, shared/workflows/scope.py) that the timeline
explains. Every lookup is confined to the connections of the caller's tenant (all of them for
an admin token), so another tenant's records are never found, nor counted.

The same module knows the opposite direction: a record's page in its vendor's UI, for the
"open in ..." links. What a record page looks like is each provider's (`Crm.record_pages`).
"""

from __future__ import annotations

import re
import uuid
from typing import Any
from urllib.parse import urlsplit

from shared.core import queries
from shared.core.db import Tx
from shared.ops.errors import OpsError
from shared.ops.explain import parse_record_key
from shared.ops.models import RecordMatch, RecordSearch, SearchKind
from shared.port.record_labels import shown_for
from shared.providers import registry
from shared.providers.descriptor import Provider, RecordPages
from shared.workflows.scope import record_key as make_record_key

SQL = queries.load("search")
CONNECTIONS = SQL["search_connections"]
CONNECTION_GET = SQL["search_connection_get"]
BY_OBJECT_ID = SQL["search_records_by_object_id"]
BY_EMAIL = SQL["search_records_by_email"]

MAX_MATCHES = 50
Kind = SearchKind
# Providers whose record pages search reads (their UI's addresses: `Crm.record_pages`).
_PAGES: tuple[tuple[Provider, RecordPages], ...] = tuple(
    (p, p.crm.record_pages)
    for p in registry.record_page_providers()
    if p.crm is not None and p.crm.record_pages is not None
)
_PAGE_NAMES = " or ".join(f"{p.title} record URLs ({pages.site})" for p, pages in _PAGES)
_URL_TITLES = " or ".join(p.title for p, _ in _PAGES)
_EMAIL = re.compile(r"^[^@\s]{1,200}@[^@\s]{1,200}\.[^@\s]{1,50}$")
_OBJECT_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def _owner(url: str) -> tuple[Provider, RecordPages] | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    return next(((p, pages) for p, pages in _PAGES if pages.owns(parts.hostname or "")), None)


def _locate(url: str) -> tuple[Provider, tuple[str, str, str]]:
    """The provider whose record page `url` is, and (account id, object type, object id);
    422 for any other URL."""
    owner = _owner(url)
    if owner is None:
        raise OpsError(422, "unknown_url", f"only {_PAGE_NAMES} are read")
    provider, pages = owner
    found = pages.locate(urlsplit(url).path)
    if found is None:
        raise OpsError(
            422,
            "unknown_url",
            f"that {provider.title} address is not a record page ({pages.page_shape})",
        )
    return provider, found


def record_location(url: str) -> tuple[str, str, str]:
    """(account id, object type, object id) of a record page's URL; 422 for any other URL."""
    return _locate(url)[1]


def classify(q: str) -> Kind:
    if q.startswith(("http://", "https://")):
        # A URL no provider owns is still read as one, and refused as one by `_locate`.
        owner = _owner(q)
        return registry.record_url_kind(owner[0] if owner else _PAGES[0][0])
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
        f"search with a {_URL_TITLES} record URL, an object id, an email or a record key",
    )


def find_records(tx: Tx, q: str, *, tenant_scope: str | None) -> list[RecordMatch]:
    return search(tx, q, tenant_scope=tenant_scope).items


def search(tx: Tx, q: str, *, tenant_scope: str | None, limit: int = MAX_MATCHES) -> RecordSearch:
    q = q.strip()
    kind = classify(q)
    if kind == "record_key":
        items = _by_record_key(tx, q, tenant_scope)
    elif kind not in ("email", "object_id"):
        provider, (account, object_type, object_id) = _locate(q)
        conns = tx.all(CONNECTIONS, tenant_id=tenant_scope, account_id=account)
        conns = [c for c in conns if c["provider"] == provider.name]
        matched_on = f"{provider.title} record URL"
        items = _by_object_id(
            tx, conns, object_id, object_type=object_type, limit=limit, matched_on=matched_on
        )
        if not items and len(conns) == 1:
            # The account is one of the caller's connections, and nothing was ever received
            # for the record: that itself answers "why didn't it run?".
            key = make_record_key(str(conns[0]["id"]), object_type, object_id)
            items = [_match(key, f"{matched_on} (nothing received for it yet)", None)]
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


def record_page(tx: Tx, record_key: str) -> tuple[str, str] | None:
    """(vendor title, URL) of the record's page in its vendor's UI, when its connection names
    the account and the provider has record pages: the ops page's "open in ..." link."""
    try:
        connection_id, object_type, object_id = parse_record_key(record_key)
    except OpsError:
        return None
    conn = tx.one(CONNECTION_GET, connection_id=connection_id)
    if conn is None or not conn["provider_account_id"]:
        return None
    provider = registry.get(conn["provider"])
    pages = provider.crm.record_pages if provider and provider.crm else None
    url = pages.url(conn["provider_account_id"], object_type, object_id) if pages else None
    return (provider.title, url) if provider and url else None
