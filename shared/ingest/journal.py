"""Provider journals as an event source: an app's events pulled by offset (issue 26 item 2).

A provider that keeps an app's events in a journal (its `Provider.journal`, e.g. HubSpot's
webhooks journal, shared/providers/hubspot/journal.py) is read here, per app and journal (the
rows of `provider_journals`, migration 0380), after the last committed offset:

- Each entry goes into the inbox exactly as a webhook delivery to the app's URL does
  (`inbox.store_for_app`: the same row shape, the same drain, routing per portal, shadow
  check, outbox and admission), with the entry's offset in the row's headers so the provider's
  normalizer reads the file as a journal entry. The offset moves in the SAME transaction
  (`journal_advance`), guarded on the offset the entry was read after: both commit or neither
  (a reader killed between storing and moving the offset left nothing: the entry is read again
  and stored once), and of two readers that read the same entry the first commit wins, the
  other's transaction matches zero rows and rolls back with its inbox write. Nothing skipped,
  nothing stored twice.
- A change that reaches onceflow both ways (webhook and journal) is one event: the provider's
  normalizer gives both the same identity (`source_event_id`), and the outbox keeps one.
- A pass reads until the journal says there is nothing after the offset (one cheap call when
  idle), a budget of entries or seconds runs out, or a call fails (noted on the row for health;
  the next pass goes on from the committed offset).
- A gap — the stored offset is gone, the reader was away longer than the journal keeps
  entries — is recorded in `provider_journal_gaps` in the transaction that resumes from the
  earliest entry still kept, logged as an error and shown by ops health (`recent_gaps`):
  reported, never silently skipped.

Woken by the sweep (`sweep_duties`, every minute); what it stored is drained and published at
once (`inbox.drain_and_publish`), like a webhook's nudge.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.accounts import provider_apps
from shared.core import queries
from shared.core.crashpoints import crash_point
from shared.core.db import Database, Tx
from shared.core.duty import Duty, SweepConfig
from shared.core.errors import OnceflowError
from shared.core.logs import get_logger
from shared.ingest import inbox
from shared.providers import registry
from shared.providers.descriptor import (
    JOURNAL_NAME_HEADER,
    JOURNAL_OFFSET_HEADER,
    Journal,
    JournalEnd,
    JournalEntry,
    OffsetGone,
)

SQL = queries.load("journal")
ENABLE = SQL["journal_enable"]
LIST = SQL["journal_list"]
GET = SQL["journal_get"]
ADVANCE = SQL["journal_advance"]
RESET = SQL["journal_reset"]
NOTE_PASS = SQL["journal_note_pass"]
RECORD_GAP = SQL["journal_record_gap"]
RECENT_GAPS = SQL["journal_recent_gaps"]
OF_APP = SQL["journal_of_app"]
APP_ACCOUNTS = SQL["journal_app_accounts"]

log = get_logger(__name__)

MAX_ENTRIES_PER_PASS = 500
PASS_BUDGET_SECONDS = 40.0  # inside the sweep's minute, with room for the drain after it
GAP_REPORT_DAYS = 7  # how far back health lists gaps


class JournalUnavailable(LookupError):
    """The app, its journal row, or its provider's journal is missing."""


class _LostRace(OnceflowError):
    """Another reader committed this offset first: roll back what we wrote (an onceflow error,
    so the transaction rolls back and passes it on as it is)."""


@dataclass
class PassReport:
    stored: int = 0  # entries stored by this pass
    duplicates: int = 0  # entries whose file the inbox already had (stored once, counted)
    lost_races: int = 0  # entries another reader committed first
    gaps: int = 0
    ended: bool = False  # the journal had nothing more
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def enable(tx: Tx, provider: str, app_id: str, journal: str = "global") -> None:
    """The app's events are read from this journal from now on (its offset kept if it was)."""
    tx.execute(ENABLE, provider=provider, app_id=app_id, journal=journal)


def state(tx: Tx, provider: str, app_id: str, journal: str = "global") -> dict[str, Any] | None:
    return tx.one(GET, provider=provider, app_id=app_id, journal=journal)


def recent_gaps(tx: Tx, days: int = GAP_REPORT_DAYS) -> list[dict[str, Any]]:
    """Support: the gaps detected in the last `days` days, newest first."""
    return tx.all(RECENT_GAPS, days=days)


def app_journals(tx: Tx, provider: str, app_id: str) -> list[dict[str, Any]]:
    """Ops: each journal the app reads, its state and its recent gaps (`gaps`)."""
    gaps = [g for g in recent_gaps(tx) if g["provider"] == provider and g["app_id"] == app_id]
    out = []
    for row in tx.all(OF_APP, provider=provider, app_id=app_id):
        found = state(tx, provider, app_id, str(row["journal"]))
        if found is not None:
            out.append({**found, "gaps": [g for g in gaps if g["journal"] == row["journal"]]})
    return out


def journal_accounts(tx: Tx, app: provider_apps.ProviderApp) -> tuple[str, ...] | None:
    """The accounts whose changes the app's journals carry (an account's local journal: that
    account; the global one: every account with an active connection of the app); None when
    the app reads no journal."""
    journals = [str(r["journal"]) for r in tx.all(OF_APP, provider=app.provider, app_id=app.app_id)]
    if not journals:
        return None
    if "global" in journals:
        rows = tx.all(APP_ACCOUNTS, provider=app.provider, app_id=app.app_id)
        return tuple(str(r["account_id"]) for r in rows)
    return tuple(journals)


def _headers(entry: JournalEntry, journal: str) -> dict[str, str]:
    return {JOURNAL_OFFSET_HEADER: entry.offset, JOURNAL_NAME_HEADER: journal}


def store_entry(
    db: Database,
    app: provider_apps.ProviderApp,
    journal: str,
    expected: str | None,
    entry: JournalEntry,
) -> inbox.Stored | None:
    """The entry in the inbox and the offset moved to it, in one transaction, if the offset is
    still `expected`; None: another reader moved it first (nothing of ours committed)."""
    try:
        with db.transaction() as tx:
            stored = inbox.store_for_app(tx, app, entry.body, _headers(entry, journal))
            crash_point("journal_after_store_before_offset")
            moved = tx.one(
                ADVANCE,
                provider=app.provider,
                app_id=app.app_id,
                journal=journal,
                expected=expected,
                new_offset=entry.offset,
            )
            if moved is None:
                raise _LostRace
    except _LostRace:
        return None
    return stored


def _resume_after_gap(
    db: Database,
    app: provider_apps.ProviderApp,
    journal: str,
    *,
    lost: str,
    gone: OffsetGone,
    source: Journal,
) -> bool:
    """Record the gap and resume at the earliest entry kept, in one guarded transaction;
    False: another reader moved the offset first."""
    earliest = source.next_entry(app, journal, None)
    first = earliest if isinstance(earliest, JournalEntry) else None
    detail = (
        f"{gone.detail}; the journal keeps {source.retention_seconds // 3600} h of entries, so"
        " entries between it and the earliest one kept may be lost"
    )
    try:
        with db.transaction() as tx:
            tx.one(
                RECORD_GAP,
                provider=app.provider,
                app_id=app.app_id,
                journal=journal,
                lost_after=lost,
                resumed_at=first.offset if first else None,
                detail=detail,
            )
            if first is not None:
                inbox.store_for_app(tx, app, first.body, _headers(first, journal))
                moved = tx.one(
                    ADVANCE,
                    provider=app.provider,
                    app_id=app.app_id,
                    journal=journal,
                    expected=lost,
                    new_offset=first.offset,
                )
            else:
                moved = tx.one(
                    RESET, provider=app.provider, app_id=app.app_id, journal=journal, expected=lost
                )
            if moved is None:
                raise _LostRace
    except _LostRace:
        return False
    log.error(
        "journal gap: app %s/%s journal %s lost offset %s, resumed at %s",
        app.provider,
        app.app_id,
        journal,
        lost,
        first.offset if first else "the start",
    )
    return True


def _offset(db: Database, provider: str, app_id: str, journal: str) -> str | None:
    with db.transaction() as tx:
        row = tx.one(GET, provider=provider, app_id=app_id, journal=journal)
    if row is None:
        raise JournalUnavailable(f"{provider} app {app_id} does not read journal {journal}")
    return None if row["last_offset"] is None else str(row["last_offset"])


def read_journal(
    db: Database,
    provider: str,
    app_id: str,
    journal: str = "global",
    *,
    max_entries: int = MAX_ENTRIES_PER_PASS,
    budget_seconds: float = PASS_BUDGET_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> PassReport:
    """One pass over the app's journal from its committed offset (see the module docstring)."""
    source = registry.get(provider)
    if source is None or source.journal is None:
        raise JournalUnavailable(f"provider {provider!r} has no journal")
    with db.transaction() as tx:
        app = provider_apps.get_app(tx, provider, app_id)
    if app is None:
        raise JournalUnavailable(f"{provider} app {app_id} is not registered")
    report = PassReport()
    deadline = clock() + budget_seconds
    offset = _offset(db, provider, app_id, journal)
    try:
        while report.stored < max_entries and clock() < deadline:
            read = source.journal.next_entry(app, journal, offset)
            if isinstance(read, JournalEnd):
                report.ended = True
                break
            if isinstance(read, OffsetGone):
                assert offset is not None  # "earliest" is never gone
                if _resume_after_gap(
                    db, app, journal, lost=offset, gone=read, source=source.journal
                ):
                    report.gaps += 1
                else:
                    report.lost_races += 1
                offset = _offset(db, provider, app_id, journal)
                continue
            stored = store_entry(db, app, journal, offset, read)
            if stored is None:
                report.lost_races += 1
                offset = _offset(db, provider, app_id, journal)
                continue
            report.stored += 1
            report.duplicates += stored.deliveries > 1
            offset = read.offset
    except Exception as exc:
        # Noted for health; the committed offset is where the next pass goes on from.
        report.error = f"{exc}"[:2000] or repr(exc)
        log.warning("journal %s/%s %s: pass failed: %s", provider, app_id, journal, exc)
    with db.transaction() as tx:
        tx.execute(NOTE_PASS, provider=provider, app_id=app_id, journal=journal, error=report.error)
    return report


def read_all_journals(db: Database) -> dict[str, Any]:
    """The sweep's duty: every journal read once, then what it stored drained and published."""
    with db.transaction() as tx:
        rows = tx.all(LIST)
    totals = PassReport()
    failed = 0
    for row in rows:
        try:
            report = read_journal(db, row["provider"], row["app_id"], row["journal"])
        except JournalUnavailable as exc:
            log.warning("journal skipped: %s", exc)
            failed += 1
            continue
        totals.stored += report.stored
        totals.duplicates += report.duplicates
        totals.lost_races += report.lost_races
        totals.gaps += report.gaps
        failed += report.error is not None
    if totals.stored or totals.gaps:
        inbox.drain_and_publish(db, budget_seconds=10.0)
    return {"journals": len(rows), "failed": failed, **totals.as_dict()}


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    """Every journal read every minute; an idle journal costs one call."""
    return (Duty("read_provider_journals", 60.0, read_all_journals),)
