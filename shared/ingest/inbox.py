"""The webhook inbox: verified raw bodies in, typed trigger events out.

Row states (`webhook_inbox.status`):
- `pending` — stored by the webhook function, waiting to be drained. A drainer's lease is a
  lease id plus a postponed `next_attempt_at`; if the drainer dies the row simply becomes
  claimable again when the lease runs out. Moves to one of the three below.
- `processed` — its events are in the outbox; `outcome` says how many were produced and how
  many dropped, and why. Terminal.
- `rejected` — verified but unparseable; the reason is in `last_error`. Never retried:
  the same bytes can't parse next time. Terminal.
- `dead` — failed `max_attempts` times on transient errors, or once on a permanent one;
  the error stays in `last_error` for a person to look at. Terminal.

A row comes from a connection's own URL (`connection_id`) or from a provider app's URL
(`app_provider`, `app_id`: one provider app, many accounts). An app's row is split when drained:
each event goes to the connection of its (app, portal), in the same one transaction, and an
event no live connection takes is recorded in `unrouted_provider_events` (see
shared/accounts/provider_apps.py), counted as dropped `unrouted` in the row's outcome.

The claim commits on its own (the attempt counter must survive a crash that kills the
process mid-row, or a poison row would be retried forever). The claimed batch is then
processed in ONE transaction (one commit for up to `batch_size` rows: a commit is the
drain's main cost): fence on the leases, then per row, inside its own SAVEPOINT, parse →
shadow records → outbox → stamp processed. A row that fails is rolled back to its savepoint
and settled (retry or dead, with its error) in the same transaction, so its events and
shadow state never get ahead of its inbox row and it can't take the other rows with it. If
the batch's transaction itself is lost, nothing of it committed and each row is processed
again in a transaction of its own (`process_row`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from shared.accounts import connections, provider_apps
from shared.core import queries, tracing
from shared.core.crashpoints import crash_point
from shared.core.db import Database, TransactionLost, Tx
from shared.core.duty import Duty, SweepConfig
from shared.core.errors import PermanentError, TransientError
from shared.core.logs import LogEvent, get_logger, labelled, log_event
from shared.ingest import drops, shadow
from shared.ingest.outbox import PublishReport, TriggerEvent, emit, publish_outbox
from shared.normalize import NormalizedEvent, UnparseableBody
from shared.providers import registry

SQL = queries.load("inbox")
STORE = SQL["inbox_store"]
STORE_FOR_APP = SQL["inbox_store_for_app"]
CLAIM = SQL["inbox_claim"]
LOCK_LEASED = SQL["inbox_lock_leased"]
LOCK_LEASED_BATCH = SQL["inbox_lock_leased_batch"]
MARK_PROCESSED = SQL["inbox_mark_processed"]
MARK_REJECTED = SQL["inbox_mark_rejected"]
MARK_DEAD = SQL["inbox_mark_dead"]
SCHEDULE_RETRY = SQL["inbox_schedule_retry"]
GET = SQL["inbox_get"]

log = get_logger(__name__)

RowResult = Literal["processed", "rejected", "retried", "dead", "lease_lost"]


# --- storing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    inbox_id: int
    deliveries: int  # > 1: an identical retry of a body we already had


def store(tx: Tx, connection_id: str, body: bytes, headers: Mapping[str, str]) -> Stored:
    """Keep a verified body; a byte-identical retry on the same connection is the same row."""
    tracing.stamp(tx)
    row = tx.one(
        STORE,
        connection_id=connection_id,
        body_sha256=hashlib.sha256(body).digest(),
        body=body,
        headers=json.dumps(dict(headers)),
    )
    assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING always returns a row
    return Stored(int(row["id"]), int(row["deliveries"]))


def store_for_app(
    tx: Tx, app: provider_apps.ProviderApp, body: bytes, headers: Mapping[str, str]
) -> Stored:
    """Keep a verified app-level body once; the drain splits it per connection."""
    tracing.stamp(tx)
    row = tx.one(
        STORE_FOR_APP,
        app_provider=app.provider,
        app_id=app.app_id,
        body_sha256=hashlib.sha256(body).digest(),
        body=body,
        headers=json.dumps(dict(headers)),
    )
    assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING always returns a row
    return Stored(int(row["id"]), int(row["deliveries"]))


# --- draining -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrainPolicy:
    batch_size: int = 20
    # Longer than one row can take (a few statements per event), so a live drainer's lease
    # doesn't expire under it; short enough that a dead drainer's rows return quickly.
    lease_seconds: float = 60.0
    max_attempts: int = 8
    backoff_base_seconds: float = 2.0
    backoff_cap_seconds: float = 300.0
    idle_poll_seconds: float = 1.0


def backoff_seconds(attempt: int, policy: DrainPolicy) -> float:
    """Delay before attempt `attempt + 1`: base · 2^(attempt-1), capped."""
    return float(min(policy.backoff_cap_seconds, policy.backoff_base_seconds * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class ClaimedRow:
    id: int
    connection_id: str | None  # None for an app's row (then `app` is set)
    body: bytes
    headers: Mapping[str, str]
    attempts: int
    app: tuple[str, str] | None = None  # (provider, app id)


@dataclass
class DrainReport:
    claimed: int = 0
    processed: int = 0
    rejected: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    events: int = 0

    def count(self, result: RowResult) -> None:
        setattr(self, result, getattr(self, result) + 1)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Outcome:
    produced: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    event_ids: list[int] = field(default_factory=list)

    def as_json(self) -> str:
        return json.dumps({"produced": self.produced, "dropped": dict(self.dropped)})


def claim_rows(db: Database, lease_id: str, policy: DrainPolicy) -> list[ClaimedRow]:
    with db.transaction() as tx:
        rows = tx.all(
            CLAIM, lease_id=lease_id, lease_seconds=policy.lease_seconds, limit=policy.batch_size
        )
    out = []
    for r in rows:
        headers = r["headers"]
        out.append(
            ClaimedRow(
                id=int(r["id"]),
                connection_id=r["connection_id"],
                body=bytes(r["body"]),
                headers=dict(headers or {}),
                attempts=int(r["attempts"]),
                app=(r["app_provider"], r["app_id"]) if r["app_id"] is not None else None,
            )
        )
    return sorted(out, key=lambda c: c.id)


def write_events(
    tx: Tx,
    connection: connections.Connection,
    inbox_id: int | None,
    events: list[NormalizedEvent],
    watched: connections.WatchedFields,
) -> Outcome:
    """Shadow-check and emit each event in the caller's transaction."""
    outcome = Outcome()
    for event in events:
        if event.kind == "property_changed" and event.object_type and event.object_id:
            emit_it, reason = shadow.observe_changes(
                tx,
                connection_id=connection.id,
                object_type=event.object_type,
                object_id=event.object_id,
                changes=event.changed_fields,
                occurred_at=event.occurred_at,
                event_id=event.source_event_id,
                is_watched=watched.watches,
            )
            if not emit_it:
                outcome.dropped[reason or "unchanged"] += 1
                _record_drop(tx, connection, inbox_id, event, reason or "unchanged")
                continue
        event_id = emit(
            tx,
            TriggerEvent(
                tenant_id=connection.tenant_id,
                connection_id=connection.id,
                event_type=event.event_type,
                payload=event.payload,
                source_event_id=event.source_event_id,
                record_object_type=event.object_type,
                record_object_id=event.object_id,
                author_id=event.author_id,
                author_source=event.author_source,
                changed_fields=event.changed_fields,
                occurred_at=event.occurred_at,
                inbox_id=inbox_id,
            ),
        )
        if event_id is None:
            outcome.dropped["re_announced"] += 1
            _record_drop(tx, connection, inbox_id, event, "re_announced")
        else:
            outcome.produced += 1
            outcome.event_ids.append(event_id)
    return outcome


def write_routed_events(
    tx: Tx,
    app: provider_apps.ProviderApp,
    inbox_id: int,
    events: list[NormalizedEvent],
    context: ConnectionContext,
) -> Outcome:
    """An app's batch: each connection's events through `write_events`, the rest recorded as
    unrouted (kept for ops, never silently dropped), all in the caller's transaction."""
    provider = registry.get(app.provider)
    if provider is None or provider.app is None:
        raise UnparseableBody(f"provider {app.provider!r} has no app webhooks")
    routes = provider_apps.route_events(tx, app, events, provider.app.event_account)
    outcome = Outcome()
    for connection_id, group in routes.by_connection.items():
        connection, watched = context.get(tx, connection_id)
        part = write_events(tx, connection, inbox_id, group, watched)
        outcome.produced += part.produced
        outcome.dropped.update(part.dropped)
        outcome.event_ids.extend(part.event_ids)
    for unrouted in routes.unrouted:
        provider_apps.record_unrouted(tx, app, inbox_id, unrouted)
        outcome.dropped["unrouted"] += 1
    return outcome


REROUTE_BATCH = 500


def reroute_unrouted(db: Database, *, batch: int = REROUTE_BATCH) -> dict[str, int]:
    """The sweep's duty: events of an app recorded as unrouted because their portal had no live
    connection, drained into that connection's trigger events now that it has one (at most
    `batch` per call). The claim stamps each event `rerouted_at` in the same transaction that
    writes its trigger events (shadow check and outbox, as the drain does): both commit or
    neither, and a stamped event is never claimed again, so each one is routed at most once.
    An event of that portal seen long before its connection existed is left for ops
    (provider_apps.REROUTE_LOOKBACK_SECONDS)."""
    context = ConnectionContext()
    produced = 0
    with db.transaction() as tx:
        rows = tx.all(
            provider_apps.REROUTE_CLAIM,
            lookback_seconds=float(provider_apps.REROUTE_LOOKBACK_SECONDS),
            batch=batch,
        )
        for row in rows:
            payload = row["payload"]
            # The unrouted row keeps the normalized event's payload, which is the provider's
            # own event: normalized again exactly as the drain did it the first time.
            body = json.dumps([payload]).encode()
            events = registry.normalize(str(row["provider"]), body, {})
            connection, watched = context.get(tx, str(row["connection_id"]))
            produced += write_events(tx, connection, int(row["inbox_id"]), events, watched).produced
    if rows:
        log.info("re-routed %d unrouted app events (%d trigger events)", len(rows), produced)
    return {"rerouted": len(rows), "events": produced}


def _record_drop(
    tx: Tx,
    connection: connections.Connection,
    inbox_id: int | None,
    event: NormalizedEvent,
    reason: str,
) -> None:
    """Per record, for the timeline (shared/ingest/drops.py); an event naming no record has only
    the inbox row's counts."""
    if not (event.object_type and event.object_id):
        return
    drops.record_drop(
        tx,
        tenant_id=connection.tenant_id,
        connection_id=connection.id,
        object_type=event.object_type,
        object_id=event.object_id,
        inbox_id=inbox_id,
        source_event_id=event.source_event_id,
        event_type=event.event_type,
        reason=cast("drops.DropReason", reason),
        fields=event.changed_fields,
        occurred_at=event.occurred_at,
    )


def _settle(db: Database, query: Any, **params: Any) -> None:
    with db.transaction() as tx:
        tx.execute(query, **params)


class ConnectionContext:
    """A connection and its watched fields, read once per claimed batch (at most
    `batch_size` rows, about a second): a workflow activated meanwhile counts from the next
    batch on, and a busy drain saves two statements per row."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[connections.Connection, connections.WatchedFields]] = {}
        self._apps: dict[tuple[str, str], provider_apps.ProviderApp] = {}

    def app(self, tx: Tx, provider: str, app_id: str) -> provider_apps.ProviderApp:
        if (provider, app_id) not in self._apps:
            app = provider_apps.get_app(tx, provider, app_id)
            if app is None:  # pragma: no cover - the foreign key keeps it
                raise PermanentError("the row's provider app no longer exists")
            self._apps[(provider, app_id)] = app
        return self._apps[(provider, app_id)]

    def get(
        self, tx: Tx, connection_id: str
    ) -> tuple[connections.Connection, connections.WatchedFields]:
        if connection_id not in self._seen:
            connection = connections.get_connection(tx, connection_id)
            if connection is None:  # pragma: no cover - the foreign key keeps it
                raise PermanentError("the row's connection no longer exists")
            self._seen[connection_id] = (connection, connections.watched_fields(tx, connection))
        return self._seen[connection_id]


def _process_fenced(
    tx: Tx, row: ClaimedRow, lease_id: str, context: ConnectionContext
) -> tuple[RowResult, int]:
    """`_process_row` in the drain's span, a child of the webhook's that stored the row."""
    stored = lambda: tracing.stored(tx, "inbox", row.id)  # noqa: E731 - read only when on
    with tracing.span("drain", stored=stored, inbox_id=row.id):
        return _process_row(tx, row, lease_id, context)


def _process_row(
    tx: Tx, row: ClaimedRow, lease_id: str, context: ConnectionContext
) -> tuple[RowResult, int]:
    """One row, already fenced on its lease: parse → shadow records → outbox → stamp, in the
    caller's transaction (or savepoint)."""
    if row.app is not None:
        provider = row.app[0]
    else:
        provider = context.get(tx, str(row.connection_id))[0].provider
    try:
        events = registry.normalize(provider, row.body, row.headers)
    except UnparseableBody as exc:
        # Settled in this same transaction, under the lease we fenced on.
        log.warning("inbox row rejected: %s", exc)
        tx.execute(
            MARK_REJECTED,
            id=row.id,
            lease_id=lease_id,
            error=str(exc)[:2000],
            outcome=json.dumps({"produced": 0, "dropped": {}}),
        )
        return "rejected", 0
    if row.app is None:
        connection, watched = context.get(tx, str(row.connection_id))
        outcome = write_events(tx, connection, row.id, events, watched)
    else:
        app = context.app(tx, *row.app)
        outcome = write_routed_events(tx, app, row.id, events, context)
    tx.execute(MARK_PROCESSED, id=row.id, lease_id=lease_id, outcome=outcome.as_json())
    return "processed", outcome.produced


@dataclass(frozen=True)
class _Failure:
    """How a failed row is settled: the statement, its parameters, and the dead-letter log
    line (written only once the settlement committed)."""

    result: RowResult
    query: Any
    params: dict[str, Any]
    dead_reason: str | None = None


def _failure(row: ClaimedRow, lease_id: str, policy: DrainPolicy, exc: Exception) -> _Failure:
    if isinstance(exc, TransientError):
        if row.attempts >= policy.max_attempts:
            return _Failure(
                "dead",
                MARK_DEAD,
                {"id": row.id, "lease_id": lease_id, "error": str(exc)[:2000]},
                f"inbox row dead after {row.attempts} attempts: {exc}",
            )
        delay = backoff_seconds(row.attempts, policy)
        log.warning("inbox row attempt %d failed, retry in %.0f s: %s", row.attempts, delay, exc)
        return _Failure(
            "retried",
            SCHEDULE_RETRY,
            {"id": row.id, "lease_id": lease_id, "delay_seconds": delay, "error": str(exc)[:2000]},
        )
    # Permanent: a retry of the same row would fail the same way. Visible, not looping.
    log.error("inbox row failed permanently: %r", exc, exc_info=exc)
    return _Failure(
        "dead",
        MARK_DEAD,
        {"id": row.id, "lease_id": lease_id, "error": f"{exc!r}"[:2000]},
        f"inbox row failed permanently: {exc!r}",
    )


def process_row(
    db: Database,
    row: ClaimedRow,
    lease_id: str,
    policy: DrainPolicy,
    context: ConnectionContext | None = None,
) -> tuple[RowResult, int]:
    """Turn one claimed inbox row into events, in one transaction; how it ended, and how
    many events it produced. (`process_batch` does several rows per transaction; this is its
    fallback and the one-row form.)"""
    context = context or ConnectionContext()
    try:
        with db.transaction() as tx:
            if tx.one(LOCK_LEASED, id=row.id, lease_id=lease_id) is None:
                return "lease_lost", 0
            return _process_fenced(tx, row, lease_id, context)
    except Exception as exc:
        failure = _failure(row, lease_id, policy, exc)
        _settle(db, failure.query, **failure.params)
        if failure.dead_reason:
            _log_dead(failure.dead_reason)
        return failure.result, 0


def process_batch(
    db: Database,
    rows: list[ClaimedRow],
    lease_id: str,
    policy: DrainPolicy,
    context: ConnectionContext | None = None,
) -> list[tuple[RowResult, int]]:
    """Several claimed rows in ONE transaction (one commit, one fence statement), each in its
    own savepoint: a row that fails has its writes rolled back to its savepoint and is
    settled (retry or dead, with its error) in the same transaction, so a bad row can't take
    the batch with it. If the transaction itself is lost (connection, stale plan, commit),
    nothing of it was written: every row, still leased by us, is processed again one by one
    (`process_row`), so no row is lost or done twice."""
    context = context or ConnectionContext()
    results: list[tuple[RowResult, int]] = []
    dead: list[str] = []
    try:
        with db.transaction() as tx:
            held = {
                int(r["id"])
                for r in tx.all(LOCK_LEASED_BATCH, ids=[r.id for r in rows], lease_id=lease_id)
            }
            for row in rows:
                if row.id not in held:
                    results.append(("lease_lost", 0))
                    continue
                with labelled(inbox_id=row.id, connection_id=row.connection_id or ""):
                    try:
                        with tx.savepoint():
                            results.append(_process_fenced(tx, row, lease_id, context))
                    except TransactionLost:
                        raise
                    except Exception as exc:
                        failure = _failure(row, lease_id, policy, exc)
                        tx.execute(failure.query, **failure.params)
                        results.append((failure.result, 0))
                        if failure.dead_reason:
                            dead.append(failure.dead_reason)
    except Exception as exc:
        log.warning("inbox batch of %d rows lost (%s); processing them one by one", len(rows), exc)
        fallback = ConnectionContext()
        results = []
        for row in rows:
            with labelled(inbox_id=row.id, connection_id=row.connection_id or ""):
                results.append(process_row(db, row, lease_id, policy, fallback))
        return results
    for reason in dead:
        _log_dead(reason)
    return results


def _log_dead(reason: str) -> None:
    log_event(
        log,
        LogEvent.DEAD_LETTERED,
        reason[:1000],
        level=logging.ERROR,
        kind="inbox_row",
        reason=reason[:1000],
    )


def drain_inbox(
    db: Database,
    *,
    budget_seconds: float,
    until_empty: bool = False,
    policy: DrainPolicy | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> DrainReport:
    """Drain until the budget is spent (or, with `until_empty`, until nothing is claimable).

    The webhook's nudge and the scheduled tick (once a minute, the safety net) both use
    `until_empty`, so an idle tick is one claim query; without it the loop polls."""
    policy = policy or DrainPolicy()
    report = DrainReport()
    deadline = clock() + budget_seconds
    while clock() < deadline:
        lease_id = str(uuid.uuid4())
        try:
            rows = claim_rows(db, lease_id, policy)
        except TransientError as exc:
            log.warning("inbox claim failed: %s", exc)
            if until_empty:
                break
            time.sleep(max(0.0, min(policy.idle_poll_seconds, deadline - clock())))
            continue
        if not rows:
            if until_empty:
                break
            time.sleep(max(0.0, min(policy.idle_poll_seconds, deadline - clock())))
            continue
        report.claimed += len(rows)
        context = ConnectionContext()
        for result, produced in process_batch(db, rows, lease_id, policy, context):
            report.count(result)
            report.events += produced
    return report


def drain_and_publish(
    db: Database, *, budget_seconds: float
) -> tuple[DrainReport, PublishReport | None]:
    """Drain until nothing is claimable, then publish until the outbox is empty, each within
    `budget_seconds`: what the drain committed goes out right after its commit instead of
    waiting for the scheduled publisher (push, not poll). The publish runs even when this
    drain emitted nothing, since a generic webhook trigger emits without the inbox and
    nudges this same pass. The scheduled `publish_outbox` and the sweep stay the safety net
    for a crash between the commit and the publish (`drain_after_commit_before_publish`)."""
    drained = drain_inbox(db, budget_seconds=budget_seconds, until_empty=True)
    crash_point("drain_after_commit_before_publish")
    try:
        published = publish_outbox(db, budget_seconds=budget_seconds, until_empty=True)
    except Exception:
        # Committed either way: the scheduled publisher sends what this pass couldn't, so a
        # publisher that can't even start must not turn a finished drain into a failure.
        log.warning(
            "publishing after the drain failed; the scheduled publisher will", exc_info=True
        )
        published = None
    return drained, published


def get_row(tx: Tx, inbox_id: int) -> dict[str, Any] | None:
    return tx.one(GET, id=inbox_id)


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    """App events that arrived before their portal's connection existed, routed to it now
    (`reroute_unrouted`), every minute."""
    return (Duty("reroute_unrouted_app_events", 60.0, reroute_unrouted),)
