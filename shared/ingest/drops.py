"""Pre-admission drops: a webhook refused at the door of a known connection (counted per
connection and check, never the body), and a property change the drain turned into no
trigger event, recorded per record, so that "I changed firstname and nothing ran" has an
answer.

The drain decides these in its own transaction (shared/ingest/inbox.py `write_events`); the row is
written in that same transaction, so a drop is recorded exactly when it happened (a drain
that rolls back records nothing, and its retry decides again). The inbox row still keeps the
counts; this keeps which record, which fields and values, and why. Values are cut to
`MAX_VALUE_CHARS`, and rows are deleted after `ONCEFLOW_DROP_RETENTION_DAYS` by the sweep,
because a changed property can be personal data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Duty, SweepConfig
from shared.core.errors import OnceflowError
from shared.core.logs import get_logger

SQL = queries.load("drops")
INSERT = SQL["drops_insert"]
FOR_RECORD = SQL["drops_for_record"]
TRIM = SQL["drops_trim"]
COUNT_REFUSAL = SQL["webhook_refusal_count"]
REFUSALS_FOR_CONNECTION = SQL["webhook_refusals_for_connection"]

DropReason = Literal["not_watched", "unchanged", "out_of_order", "re_announced"]
MAX_VALUE_CHARS = 200
DEFAULT_RETENTION_DAYS = 14
log = get_logger(__name__)


def _cut(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "…"
    if isinstance(value, int | float | bool) or value is None:
        return value
    text = json.dumps(value, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"


def record_drop(
    tx: Tx,
    *,
    tenant_id: str,
    connection_id: str,
    object_type: str,
    object_id: str,
    inbox_id: int | None,
    source_event_id: str | None,
    event_type: str,
    reason: DropReason,
    fields: Mapping[str, Any],
    occurred_at: Any,
) -> None:
    tx.execute(
        INSERT,
        tenant_id=tenant_id,
        connection_id=connection_id,
        object_type=object_type,
        object_id=object_id,
        inbox_id=inbox_id,
        source_event_id=source_event_id,
        event_type=event_type,
        reason=reason,
        fields=json.dumps({k: _cut(v) for k, v in fields.items()}),
        occurred_at=occurred_at,
    )


def trim_drops(
    db: Database, days: int, *, batch: int = 5000, max_batches: int = 20
) -> dict[str, int]:
    """Delete drops recorded more than `days` ago, a batch per transaction."""
    deleted = 0
    for _ in range(max_batches):
        with db.transaction() as tx:
            n = tx.execute(TRIM, days=days, batch=batch)
        deleted += n
        if n < batch:
            break
    return {"deleted": deleted}


def count_webhook_refusal(db: Database, connection_id: str, check: str) -> None:
    """Count a refused delivery for its connection. Best effort: the refusal is the answer,
    and a database that can't take the count must not turn a 401 into a 503."""
    try:
        with db.transaction() as tx:
            tx.execute(COUNT_REFUSAL, connection_id=connection_id, check_name=check[:64])
    except OnceflowError as exc:
        log.warning("could not count a webhook refusal: %s", exc)


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    """Drops hold changed property values: kept `drop_retention_days`, trimmed hourly."""
    days = config.drop_retention_days
    return (Duty("trim_pre_admission_drops", 3600.0, lambda db: trim_drops(db, days)),)
