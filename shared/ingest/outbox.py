"""The outbox: typed trigger events written in the transaction of the change they describe,
then published to Pub/Sub by id.

Writing: `emit(tx, event)` inserts into `workflow_trigger_events` inside the caller's
transaction — the drain's, or an embedding application's own domain write — so a rolled-back
transaction leaves no event and a committed one always has its event. Events are never
inferred from row diffs. Payloads above 64 KiB are stored truncated and flagged (replay
refuses truncated events).

Publishing (`publish_outbox`), per batch:
1. claim: a short transaction writes a fresh hold id and expiry on up to `batch_size`
   unpublished rows no live hold covers (`FOR UPDATE SKIP LOCKED`);
2. publish `{"event_id": id}` for each, outside any transaction, waiting for every future;
3. mark published only the rows still carrying our hold id.
A publisher that crashes between 2 and 3 leaves its hold to expire; the next claim publishes
those ids again. Downstream admission dedupes on the event id, so a duplicate is harmless;
a row marked published without having been published would be a loss, which the order of
2 and 3 rules out.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.core import queries, tracing
from shared.core.db import Database, Tx
from shared.core.duty import Dispatch, SweepConfig, SweepReport
from shared.core.errors import PermanentError, TransientError
from shared.core.logs import LogEvent, get_logger, log_event
from shared.core.pubsub import TRIGGER_EVENTS, Publisher, get_publisher
from shared.workflows.definition import EVENT_TYPE_PATTERN

SQL = queries.load("outbox")
INSERT = SQL["outbox_insert"]
CLAIM = SQL["outbox_claim"]
MARK_PUBLISHED = SQL["outbox_mark_published"]
RELEASE_HOLD = SQL["outbox_release_hold"]
REQUEUE_UNDECIDED = SQL["outbox_requeue_undecided"]
REQUEUE_UNDELIVERED = SQL["outbox_requeue_undelivered"]

PAYLOAD_LIMIT_BYTES = 64 * 1024
EVENT_TYPE = re.compile(EVENT_TYPE_PATTERN)
log = get_logger(__name__)


@dataclass(frozen=True)
class TriggerEvent:
    """One typed trigger event. Record identity is both parts or neither."""

    tenant_id: str
    event_type: str
    payload: Mapping[str, Any]
    connection_id: str | None = None
    source_event_id: str | None = None
    record_object_type: str | None = None
    record_object_id: str | None = None
    author_id: str | None = None
    author_source: str | None = None
    changed_fields: Mapping[str, Any] = field(default_factory=dict)
    occurred_at: datetime | None = None
    inbox_id: int | None = None


def _without_nul(value: Any) -> Any:
    """jsonb refuses U+0000 in strings; a provider that sends one gets U+FFFD instead of a
    dead inbox row."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, Mapping):
        return {_without_nul(str(k)): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


def to_json(value: Any) -> str:
    return json.dumps(_without_nul(value), separators=(",", ":"), ensure_ascii=False, default=str)


def fit_payload(payload: Mapping[str, Any]) -> tuple[str, bool]:
    """The payload as JSON text of at most 64 KiB, and whether it had to be truncated.

    A truncated payload keeps a prefix of the original JSON text as a string, with the
    original size, so a person can still see what it was about."""
    text = to_json(payload)
    size = len(text.encode())
    if size <= PAYLOAD_LIMIT_BYTES:
        return text, False
    keep = PAYLOAD_LIMIT_BYTES - 256
    while True:
        wrapped = to_json({"truncated": True, "original_bytes": size, "prefix": text[:keep]})
        excess = len(wrapped.encode()) - PAYLOAD_LIMIT_BYTES
        if excess <= 0:
            return wrapped, True
        keep -= max(excess, 64)  # escapes and multibyte characters grow the text: shrink


def emit(tx: Tx, event: TriggerEvent) -> int | None:
    """Write `event` to the outbox in the caller's transaction; its id.

    None when the connection already has an event with this `source_event_id` (the provider
    re-announced it): that is a duplicate, not a second event."""
    if not EVENT_TYPE.match(event.event_type):
        raise PermanentError(f"event type {event.event_type!r} is not dotted lower snake case")
    if (event.record_object_type is None) != (event.record_object_id is None):
        raise PermanentError("record identity needs both object type and object id, or neither")
    payload, truncated = fit_payload(event.payload)
    tracing.stamp(tx)
    event_id = tx.scalar(
        INSERT,
        tenant_id=event.tenant_id,
        connection_id=event.connection_id,
        event_type=event.event_type,
        source_event_id=event.source_event_id,
        inbox_id=event.inbox_id,
        record_object_type=event.record_object_type,
        record_object_id=event.record_object_id,
        author_id=event.author_id,
        author_source=event.author_source,
        changed_fields=to_json(dict(event.changed_fields)),
        occurred_at=event.occurred_at or datetime.now().astimezone(),
        payload=payload,
        payload_truncated=truncated,
    )
    return None if event_id is None else int(event_id)


# --- publishing -----------------------------------------------------------------------------


def claim_batch(db: Database, hold_id: str, *, limit: int, hold_seconds: float) -> list[int]:
    """Hold up to `limit` unpublished, unheld rows under `hold_id`; their ids, ascending."""
    with db.transaction() as tx:
        rows = tx.all(CLAIM, hold_id=hold_id, hold_seconds=float(hold_seconds), limit=limit)
    return sorted(int(r["id"]) for r in rows)


def mark_published(db: Database, hold_id: str, ids: list[int]) -> int:
    """Stamp `published_at` on those of `ids` still held by `hold_id`; how many.

    Fewer than len(ids) means our hold expired and another publisher took those rows over
    (it will publish them again), or they were already marked."""
    if not ids:
        return 0
    with db.transaction() as tx:
        return tx.execute(MARK_PUBLISHED, ids=ids, hold_id=hold_id)


def release_hold(db: Database, hold_id: str, ids: list[int]) -> int:
    with db.transaction() as tx:
        return tx.execute(RELEASE_HOLD, ids=ids, hold_id=hold_id)


@dataclass(frozen=True)
class PublishPolicy:
    batch_size: int = 500
    # Longer than a batch can take to publish (each future waits up to 30 s), so a live
    # publisher's hold does not expire under it.
    hold_seconds: float = 120.0
    idle_poll_seconds: float = 1.0
    failure_backoff_seconds: float = 2.0


@dataclass
class PublishReport:
    claimed: int = 0
    published: int = 0
    not_marked: int = 0  # published, but our hold had been taken over: the new holder re-sends
    failed_batches: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def publish_batch(
    db: Database, publisher: Publisher, policy: PublishPolicy, report: PublishReport
) -> int:
    """One claim → publish → mark cycle; how many rows it claimed (0 = nothing to do)."""
    hold_id = str(uuid.uuid4())
    ids = claim_batch(db, hold_id, limit=policy.batch_size, hold_seconds=policy.hold_seconds)
    if not ids:
        return 0
    report.claimed += len(ids)
    try:
        publisher.publish_many(TRIGGER_EVENTS, [{"event_id": i} for i in ids])
    except TransientError as exc:
        report.failed_batches += 1
        report.last_error = str(exc)
        log.warning("publishing %d trigger events failed: %s", len(ids), exc)
        # Some may have gone out; releasing only means they go out again (harmless).
        release_hold(db, hold_id, ids)
        raise
    marked = mark_published(db, hold_id, ids)
    report.published += marked
    report.not_marked += len(ids) - marked
    return len(ids)


def publish_outbox(
    db: Database,
    *,
    budget_seconds: float,
    until_empty: bool = False,
    publisher: Publisher | None = None,
    policy: PublishPolicy | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> PublishReport:
    """Publish unpublished events until the budget is spent (or, with `until_empty`, until
    nothing is left). The scheduled tick and every publish right after a commit use
    `until_empty`: nothing polls for events that whoever committed them already sent."""
    policy = policy or PublishPolicy()
    publisher = publisher or get_publisher()
    report = PublishReport()
    deadline = clock() + budget_seconds
    while clock() < deadline:
        try:
            claimed = publish_batch(db, publisher, policy, report)
        except TransientError as exc:
            report.last_error = str(exc)
            if until_empty:
                break
            time.sleep(max(0.0, min(policy.failure_backoff_seconds, deadline - clock())))
            continue
        if claimed:
            continue
        if until_empty:
            break
        time.sleep(max(0.0, min(policy.idle_poll_seconds, deadline - clock())))
    return report


# --- events that never reached a decision ---------------------------------------------------


@dataclass(frozen=True)
class Requeued:
    requeued: tuple[int, ...]
    given_up: tuple[int, ...]


def requeue_undecided(
    db: Database, *, after_seconds: float, max_redeliveries: int, batch: int
) -> Requeued:
    """Put published events that admission never decided back into the outbox, or give them
    up as undelivered at the cap (see `outbox_requeue_undecided`). Idempotent and bounded."""
    with db.transaction() as tx:
        rows = tx.all(
            REQUEUE_UNDECIDED,
            after_seconds=float(after_seconds),
            max_redeliveries=max_redeliveries,
            batch=batch,
        )
    given_up = tuple(int(r["id"]) for r in rows if r["given_up"])
    for event_id in given_up:
        log_event(
            log,
            LogEvent.DEAD_LETTERED,
            f"trigger event {event_id} undelivered: given up after {max_redeliveries} re-publishes",
            level=logging.ERROR,
            kind="undelivered_event",
            reason=f"trigger event {event_id}: admission never decided it",
        )
    return Requeued(
        requeued=tuple(int(r["id"]) for r in rows if not r["given_up"]), given_up=given_up
    )


def requeue_undecided_events(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """The sweep's repair (every pass): undecided events back into the outbox (the publisher
    sends them), or given up at the cap; the number of rows touched. So "every published event
    gets a decision, or an explanation why not" is onceflow's guarantee, not the transport's
    (Pub/Sub may drop a push to a restarting endpoint, dead-letter after its attempts, or back
    off for minutes). `dispatch` is for steps and not used here."""
    done = requeue_undecided(
        db,
        after_seconds=config.redeliver_events_after_seconds,
        max_redeliveries=config.max_event_redeliveries,
        batch=config.batch,
    )
    report.events_requeued += len(done.requeued)
    report.events_undelivered += len(done.given_up)
    return len(done.requeued) + len(done.given_up)


def requeue_event(tx: Tx, *, event_id: int, tenant_id: str | None) -> bool:
    """Ops: back into the outbox with a fresh redelivery budget; False when there is no such
    undecided event (for the tenant, when one is given)."""
    return tx.one(REQUEUE_UNDELIVERED, event_id=event_id, tenant_id=tenant_id) is not None
