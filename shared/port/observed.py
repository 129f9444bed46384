"""What a connection's port saw, kept for people: the connection's last real call to its
provider (the health view's "last provider call") and the names of the records it read or
wrote (shared/port/record_labels.py).

`ObservedPort` wraps the adapter `shared/providers/connect.py` builds, so every caller of a port
(blocks, polling, the subscription reconcile) is observed without knowing it. Both notes are
best effort and cheap: they never fail or slow the call, a call's outcome is noted at most
once a minute per instance and connection (at once when the connection turns from working
to failing or back), and a record's label only when it differs from what this instance wrote
last. Notes are queued, not written by the port: whoever made the call writes them with
`flush` on its own database — the step executor after its settle, on the step's one
connection (issue 27) — so a call never costs a transaction of its own. A note that can't be
written is dropped: the next call notes again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from shared.core import queries
from shared.core.db import Database
from shared.core.logs import get_logger
from shared.port import budget, record_labels
from shared.port.interface import (
    Association,
    Capabilities,
    CrmPort,
    PortError,
    RateLimitState,
    Record,
    SearchFilter,
    SearchPage,
    Subscription,
)
from shared.workflows.scope import record_key

SQL = queries.load("record_labels")
NOTE_LAST_CALL = SQL["connections_note_last_call"]

NOTE_EVERY_SECONDS = 60.0
REMEMBERED_LABELS = 5000
# The provider answered, and the answer was about the request (a missing record, a clash, a
# bad property): the connection works. Anything else says it doesn't, right now.
ANSWERED_CODES = frozenset({"not_found", "conflict", "invalid_request"})

log = get_logger(__name__)
T = TypeVar("T")

_lock = threading.Lock()
_last_noted: dict[str, tuple[float, bool]] = {}
_labels_written: OrderedDict[str, record_labels.Label] = OrderedDict()


# Notes waiting to be written by the next `flush` (a step's executor after its settle, a
# poll pass, a reconcile), oldest first; bounded, so a process whose caller never flushes
# keeps only the latest.
_pending: list[Callable[[Any], None]] = []
MAX_PENDING = 1000


def _write(work: Callable[[Any], None]) -> None:
    """Queue a note: nothing below the executor opens a transaction of its own (issue 27: a
    port call inside a step runs while the step holds its one connection)."""
    with _lock:
        _pending.append(work)
        del _pending[:-MAX_PENDING]


def flush(db: Database) -> None:
    """Write the queued notes in one transaction of `db` (the caller's: a step's pinned
    connection, after its settle committed). Best effort by contract: a note that can't be
    written is dropped, and the next call notes again."""
    with _lock:
        works = list(_pending)
        _pending.clear()
    if not works:
        return

    def write(tx: Any) -> None:
        for work in works:
            work(tx)

    try:
        db.run(write, attempts=1)
    except Exception as exc:  # best effort by contract (module docstring)
        log.debug("port observations not written: %s", exc)


def note_call(connection_id: str, ok: bool, error: str | None) -> None:
    now = time.monotonic()
    with _lock:
        last = _last_noted.get(connection_id)
        if last is not None and last[1] == ok and now - last[0] < NOTE_EVERY_SECONDS:
            return
        _last_noted[connection_id] = (now, ok)
    at = datetime.now(UTC)
    _write(
        lambda tx: tx.at_commit(
            NOTE_LAST_CALL,
            connection_id=connection_id,
            at=at,
            ok=ok,
            error=None if ok else (error or "failed")[:500],
        )
    )


def note_records(
    connection_id: str,
    records: Iterable[Record],
    singular: Callable[[str], str],
    name_properties: record_labels.NameProperties,
) -> None:
    fresh: list[tuple[str, record_labels.Label]] = []
    with _lock:
        for r in records:
            try:
                object_type = singular(r.object_type)
            except PortError:
                object_type = r.object_type
            label = record_labels.label_of(object_type, r.properties, name_properties)
            if label is None:
                continue
            key = record_key(connection_id, object_type, r.id)
            if _labels_written.get(key) == label:
                _labels_written.move_to_end(key)
                continue
            _labels_written[key] = label
            while len(_labels_written) > REMEMBERED_LABELS:
                _labels_written.popitem(last=False)
            fresh.append((key, label))
    if not fresh:
        return

    def write(tx: Any) -> None:
        for key, label in fresh:
            record_labels.remember(tx, record_key=key, connection_id=connection_id, label=label)

    _write(write)


def note_budget(connection_id: str, state: RateLimitState | None, error: PortError | None) -> None:
    """What a call's answer said of the portal's budget (shared/port/budget.py): its headers
    narrow the connection's window, a 429 shrinks it. Written at the next flush, like the other
    notes; a note that can't be written is dropped, and the next answer says again."""
    if error is not None and error.status == 429:
        retry_after = error.retry_after or 0.0
        _write(lambda tx: budget.shrink(tx, connection_id, retry_after))
        return
    answered = error is None or error.status is not None
    if state is not None and answered and budget.worth_noting(state):
        _write(lambda tx: budget.observe(tx, connection_id, state))


class ObservedPort:
    """A `CrmPort` that notes its calls (module docstring); everything else is the adapter's."""

    def __init__(
        self,
        inner: CrmPort,
        connection_id: str,
        singular: Callable[[str], str],
        name_properties: record_labels.NameProperties,
        *,
        rate_budget: bool = False,
    ) -> None:
        """`rate_budget`: the provider declares `Crm.rate_budget` — the adapter's `rate_limit`
        after each call is noted for the portal's shared budget (`note_budget`)."""
        self._inner = inner
        self._rate_budget = rate_budget
        self._connection_id = connection_id
        self._singular = singular
        self._name_properties = name_properties  # the provider's (record_labels)
        # Fixed when the adapter is built (connect.py builds a new one when they change).
        self.capabilities: Capabilities = inner.capabilities
        self.idempotency_property: str | None = inner.idempotency_property

    def __getattr__(self, name: str) -> Any:
        # Adapter-specific attributes (rate-limit state, close, base URL) stay reachable.
        return getattr(self._inner, name)

    def _call(self, call: Callable[[], T]) -> T:
        try:
            result = call()
        except PortError as exc:
            answered = exc.code in ANSWERED_CODES
            note_call(self._connection_id, answered, None if answered else f"{exc.code}: {exc}")
            if self._rate_budget:
                note_budget(self._connection_id, getattr(self._inner, "rate_limit", None), exc)
            raise
        note_call(self._connection_id, True, None)
        if self._rate_budget:
            note_budget(self._connection_id, getattr(self._inner, "rate_limit", None), None)
        return result

    def _seen(self, records: Iterable[Record]) -> None:
        note_records(self._connection_id, records, self._singular, self._name_properties)

    def create(
        self,
        object_type: str,
        properties: Mapping[str, Any],
        associations: Sequence[Association] = (),
    ) -> Record:
        record = self._call(lambda: self._inner.create(object_type, properties, associations))
        # The create's answer may carry only what HubSpot computed; what we sent names it.
        self._seen([Record(record.object_type, record.id, {**properties, **record.properties})])
        return record

    def update(self, object_type: str, object_id: str, properties: Mapping[str, Any]) -> Record:
        record = self._call(lambda: self._inner.update(object_type, object_id, properties))
        self._seen([record])
        return record

    def get(self, object_type: str, object_id: str, properties: Sequence[str] = ()) -> Record:
        record = self._call(lambda: self._inner.get(object_type, object_id, properties))
        self._seen([record])
        return record

    def search(
        self, object_type: str, filters: Sequence[SearchFilter], limit: int = 10
    ) -> list[Record]:
        records = self._call(lambda: self._inner.search(object_type, filters, limit))
        self._seen(records)
        return records

    def search_page(
        self,
        object_type: str,
        filters: Sequence[SearchFilter],
        *,
        limit: int = 100,
        after: str | None = None,
        properties: Sequence[str] = (),
    ) -> SearchPage:
        page = self._call(
            lambda: self._inner.search_page(
                object_type, filters, limit=limit, after=after, properties=properties
            )
        )
        self._seen(page.records)
        return page

    def list_subscriptions(self) -> list[Subscription]:
        return self._call(self._inner.list_subscriptions)

    def create_subscription(self, subscription: Subscription) -> Subscription:
        return self._call(lambda: self._inner.create_subscription(subscription))

    def delete_subscription(self, subscription_id: str) -> None:
        self._call(lambda: self._inner.delete_subscription(subscription_id))
