"""Which provider a connection is, for the rules that read a workflow's neutral words in its
provider's terms: an object kind (`registry.object_kind`: Pipedrive's `person` is a
`contact`) and an any-CRM event type (`registry.event_type_on`: `crm.contact.created` is
`pipedrive.contact.created` there)."""

from __future__ import annotations

from shared.core.db import Database
from shared.providers import connect

_providers: dict[str, str] = {}  # connection id -> its provider, which never changes


def provider_of(db: Database | None, connection_id: str | None) -> str | None:
    """The connection's provider, read once per process on `db` (a step's: its own
    connection, issue 27); None without a connection or for one that doesn't exist (building
    its port says so), or when it isn't known yet and there is no database to read it on."""
    if not connection_id:
        return None
    if connection_id not in _providers:
        if db is None:
            return None
        settings = db.run(lambda tx: connect.load_port_settings(tx, connection_id))
        if not settings.provider:
            return None
        _providers[connection_id] = settings.provider
    return _providers[connection_id]
