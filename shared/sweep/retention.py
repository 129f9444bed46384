"""Retention: the sweep duty that deletes what no promise needs any more.

onceflow keeps every run, event and delivery it handled until this duty removes it. Every five
minutes, within a 10 s pass that spends a quarter of its time deleting, it deletes in small
batches (one transaction each, found through the partial indexes of
migrations/0300_retention.sql, never a scan of the table), oldest first:

1. rehearsal runs finished more than `rehearsal_retention_days` ago (default 7), whole:
   steps, lease history, parks;
2. live runs finished more than `run_retention_days` ago (default 90), a whole replay lineage
   at a time, with their steps, their lease history (ON DELETE CASCADE) and parks; their
   delivery claims lose the run link and stay with their event;
3. trigger events decided more than `decision_retention_days` ago (default 90) that no run
   names any more, with their delivery claims, admission refusals and superseded cron ticks;
4. inbox rows processed more than `inbox_retention_days` ago (default 30); their events keep
   their own payload and lose only the link to the raw delivery;
5. debounce bursts fired more than `decision_retention_days` ago whose run is gone, with
   their membership rows; throttled run-start queue entries started that long ago. An event
   held in a burst not fired yet, or waiting in a run-start queue, is never deleted.

The lease history of finished runs has its own, shorter retention (`lease_history_days`,
default 30: `trim_lease_history` in shared/steps/repairs.py); expired echo markers
(`expire_echo_markers`) and expired webhook-trigger keys (`expire_webhook_trigger_keys`) are
deleted by their own duties, within minutes of their expiry. All settings are read once, in
`SweepConfig.from_env`.

The promises this duty keeps (each has a test in tests/test_retention.py):

- **An enrollment of `once_per_record` is never deleted**: the row is the promise that the
  record never enrolls again. It keeps the id of the run that enrolled it after that run is
  deleted (the id stops being a foreign key in 0300).
- **Money records are kept for good**: the credit ledger and its refunds, and budget
  reservations (the spend a budget window counts), keep their run and step ids as history.
- **A run not finished is never deleted, nor is any run of its lineage**: a replay pending
  or running keeps the run it replays and the whole lineage, so its copied steps and provider
  idempotency keys keep their history. A lineage goes only when every run of it finished
  before the retention.
- **A run with an open budget reservation or an unexpired echo marker is kept**: the
  reservation's reconcile reads its step; the marker still suppresses an echo.
- **A webhook-trigger key inside its TTL keeps its event**: a duplicate POST is answered with
  that event's id.
- **Each workflow's newest cron tick, and every poll record, keeps its event**: they are the
  cron's cursor and the poll's memory of a record; without them a tick would fire again or a
  record be announced again.
- **A decided event keeps its delivery claims for as long as it exists**: a redelivery of an
  event that outlived its run is answered as handled, never admitted again.
- **Undecided events are never deleted** (the outbox and the sweep's redelivery own them),
  nor events given up as undelivered (each is the explanation of a missing decision).

Races: a lineage's root is locked (SKIP LOCKED) before its delete re-checks the lineage in a
fresh snapshot, and an ops replay locks the same root first, so a replay and the deletion of
its lineage never both happen. Anything else that names a row as it is deleted fails the
statement's foreign-key check and rolls the batch back; the next pass tries again.

Running the duty twice deletes nothing the first run didn't leave for later.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from shared.core import queries
from shared.core.db import Database
from shared.core.duty import Duty, SweepConfig
from shared.core.settings import DEFAULTS

SQL = queries.load("retention")
LINEAGES_LOCK = SQL["retention_lineages_lock"]
LINEAGES_DELETE = SQL["retention_lineages_delete"]
EVENTS_DELETE = SQL["retention_events_delete"]
INBOX_DELETE = SQL["retention_inbox_delete"]
BURSTS_DELETE = SQL["retention_bursts_delete"]
RUN_STARTS_DELETE = SQL["retention_run_starts_delete"]

# Every five minutes, a pass of at most 10 s that deletes a quarter of that time: at about
# 1,300 runs/s while deleting (`make bench-retention`, 2 vCPU) that is ~3,000 runs per pass,
# ~900k runs a day, and the steps running meanwhile keep about 90% of their rate (deleting
# without pauses costs them a third). The pass runs inside the sweep, so it also bounds how
# long the sweep's core jobs wait.
EVERY_SECONDS = 300.0


@dataclass(frozen=True)
class Retention:
    """How long each kind of row is kept after it is done, in days, and how a pass is paced."""

    # The defaults are the settings' (shared/core/settings.py): one home for each figure.
    run_days: int = DEFAULTS.run_retention_days
    decision_days: int = DEFAULTS.decision_retention_days
    inbox_days: int = DEFAULTS.inbox_retention_days
    rehearsal_days: int = DEFAULTS.rehearsal_retention_days
    # Runs per batch (each brings its steps and lease history); events and inbox rows per batch.
    batch: int = DEFAULTS.retention_batch
    # A pass stops after this long; what is left waits for the next period.
    pass_seconds: float = 10.0
    # The share of a pass spent deleting: after a batch that took t, the pass pauses
    # t * (1 - share) / share, so the steps executing meanwhile keep most of the database.
    deleting_share: float = 0.25

    @classmethod
    def from_sweep_config(cls, config: SweepConfig) -> Retention:
        return cls(
            run_days=config.run_retention_days,
            decision_days=config.decision_retention_days,
            inbox_days=config.inbox_retention_days,
            rehearsal_days=config.rehearsal_retention_days,
            batch=config.retention_batch,
        )


@dataclass(frozen=True)
class _Pace:
    deadline: float
    share: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]


def _until_done(step: Callable[[], int], pace: _Pace) -> int:
    """Repeat `step` (one batch, one transaction; rows deleted) until it finds nothing or the
    pass's time is up, pausing after each batch for the pass's share; the rows deleted."""
    total = 0
    while pace.clock() < pace.deadline:
        started = pace.clock()
        n = step()
        total += n
        if n == 0:
            break
        took = pace.clock() - started
        pause = min(took * (1 - pace.share) / pace.share, pace.deadline - pace.clock())
        if pause > 0:
            pace.sleep(pause)
    return total


def prune_lineages(db: Database, namespace: str, days: int, batch: int) -> dict[str, int]:
    """One batch of whole lineages of `namespace` finished more than `days` ago."""
    with db.transaction() as tx:
        roots = [
            str(r["id"]) for r in tx.all(LINEAGES_LOCK, namespace=namespace, days=days, batch=batch)
        ]
        if not roots:
            return {"runs": 0, "steps": 0, "parks": 0, "claims_unlinked": 0}
        row = tx.one(LINEAGES_DELETE, roots=roots, namespace=namespace, days=days)
    assert row is not None  # an aggregate always returns its row
    return {k: int(row[k]) for k in ("runs", "steps", "parks", "claims_unlinked")}


def prune_events(db: Database, days: int, batch: int) -> dict[str, int]:
    """One batch of decided events nothing names any more."""
    with db.transaction() as tx:
        row = tx.one(EVENTS_DELETE, days=days, batch=batch)
    assert row is not None
    return {k: int(row[k]) for k in ("events", "claims", "refusals", "cron_ticks")}


def prune_inbox(db: Database, days: int, batch: int) -> dict[str, int]:
    """One batch of processed inbox rows."""
    with db.transaction() as tx:
        row = tx.one(INBOX_DELETE, days=days, batch=batch)
    assert row is not None
    return {k: int(row[k]) for k in ("inbox", "unlinked")}


def prune_bursts(db: Database, days: int, batch: int) -> dict[str, int]:
    """One batch of fired debounce bursts whose run is gone (shared/admission/debounce.py)."""
    with db.transaction() as tx:
        row = tx.one(BURSTS_DELETE, days=days, batch=batch)
    assert row is not None
    return {"bursts": int(row["bursts"])}


def prune_run_starts(db: Database, days: int, batch: int) -> dict[str, int]:
    """One batch of started run-start queue entries (shared/admission/run_throttle.py)."""
    with db.transaction() as tx:
        row = tx.one(RUN_STARTS_DELETE, days=days, batch=batch)
    assert row is not None
    return {"run_starts": int(row["run_starts"])}


def prune(
    db: Database,
    retention: Retention,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, int]:
    """One retention pass, runs before the events they name and events before their inbox
    rows; the number of rows deleted per kind."""
    pace = _Pace(clock() + retention.pass_seconds, retention.deleting_share, clock, sleep)
    totals: dict[str, int] = {}

    def counted(prefix: str, batch: Callable[[], dict[str, int]], key: str) -> Callable[[], int]:
        def step() -> int:
            counts = batch()
            for k, v in counts.items():
                totals[f"{prefix}{k}"] = totals.get(f"{prefix}{k}", 0) + v
            return counts[key]

        return step

    b = retention.batch
    passes: tuple[tuple[str, Callable[[], dict[str, int]], str], ...] = (
        (
            "rehearsal_",
            partial(prune_lineages, db, "rehearsal", retention.rehearsal_days, b),
            "runs",
        ),
        ("", partial(prune_lineages, db, "live", retention.run_days, b), "runs"),
        ("", partial(prune_events, db, retention.decision_days, b), "events"),
        ("", partial(prune_inbox, db, retention.inbox_days, b), "inbox"),
        ("", partial(prune_bursts, db, retention.decision_days, b), "bursts"),
        ("", partial(prune_run_starts, db, retention.decision_days, b), "run_starts"),
    )
    for prefix, batch, key in passes:
        _until_done(counted(prefix, batch, key), pace)
    return totals


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    """The sweep's retention duty (registered in shared/sweep/catalog.py)."""
    retention = Retention.from_sweep_config(config)
    return (Duty("retention", EVERY_SECONDS, lambda db: prune(db, retention)),)
