"""What people call a record: its name and email, as onceflow's own CRM reads and writes saw
them.

A record is identified everywhere by its key (`<connection>:<object type>:<id>`), which no
person recognises, and HubSpot's webhooks carry only the property that changed, so the page
can't name a contact from its events. Every record a port returns (a `crm.get`, a create, an
update, a search page) passes through `shared/port/observed.py`, which keeps the label here;
the page shows it next to the key and the search finds a record by its email.

The label is read from the properties that name each object type, which each provider
declares (`NameProperties`, the `label_properties` of its registry entry: shared/providers/); a
property the read did not ask for is simply absent, and the label then waits for a read that
has it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.core import queries
from shared.core.db import Tx

SQL = queries.load("record_labels")
UPSERT = SQL["record_labels_upsert"]
GET_MANY = SQL["record_labels_get_many"]

MAX_LABEL = 300

# Per object type (singular): the properties whose values, joined by a space, name a record.
NameProperties = Mapping[str, tuple[str, ...]]
EMAIL_PROPERTY = "email"


@dataclass(frozen=True)
class Label:
    label: str | None
    email: str | None


def label_of(
    object_type: str, properties: Mapping[str, Any], name_properties: NameProperties
) -> Label | None:
    """The record's label from its properties, or None when they name nothing."""
    words = [
        str(properties[p]).strip()
        for p in name_properties.get(object_type, ())
        if properties.get(p) not in (None, "")
    ]
    name = " ".join(w for w in words if w)[:MAX_LABEL] or None
    raw_email = properties.get(EMAIL_PROPERTY)
    email = str(raw_email).strip().lower()[:320] if raw_email else None
    if name is None and email is None:
        return None
    return Label(name, email or None)


def remember(tx: Tx, *, record_key: str, connection_id: str, label: Label) -> None:
    """Queued: sent with `tx`'s COMMIT (nobody reads its answer; Tx.at_commit)."""
    tx.at_commit(
        UPSERT,
        record_key=record_key,
        connection_id=connection_id,
        label=label.label,
        email=label.email,
    )


def shown_for(tx: Tx, record_keys: Iterable[str | None]) -> dict[str, str]:
    """How each known record of `record_keys` reads ("Ada Lovelace <ada@example.com>"), in one
    indexed read; the SQL function `record_label` is the one rule for it."""
    keys = sorted({k for k in record_keys if k})
    if not keys:
        return {}
    return {r["record_key"]: r["shown"] for r in tx.all(GET_MANY, keys=keys)}
