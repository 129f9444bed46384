"""How far behind the machinery is: the age of the oldest unfinished work in each queue, and
what was put aside as dead.

One home for these numbers: the sweep logs them every minute as a `backlog_age` event (the
alerts in infra/monitoring.tf read that line) and the ops health view returns them.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.core import queries, tracing
from shared.core.db import Database, Tx
from shared.core.duty import Duty, SweepConfig
from shared.core.logs import LogEvent, get_logger, log_event

SQL = queries.load("backlog")
BACKLOG_AGES = SQL["backlog_ages"]
DEAD_LETTER_COUNTS = SQL["dead_letter_counts"]
log = get_logger(__name__)


@dataclass(frozen=True)
class Backlog:
    inbox_pending: int
    inbox_oldest_seconds: float
    outbox_unpublished: int
    outbox_oldest_seconds: float
    steps_pending: int
    steps_oldest_pending_seconds: float


@dataclass(frozen=True)
class DeadLetters:
    poisoned_messages: int
    poisoned_messages_24h: int
    dead_inbox_rows: int
    undelivered_events: int


def read_backlog(tx: Tx) -> Backlog:
    row = tx.one(BACKLOG_AGES)
    assert row is not None  # an aggregate over three CTEs always returns one row
    return Backlog(
        inbox_pending=int(row["inbox_pending"]),
        inbox_oldest_seconds=round(float(row["inbox_oldest_seconds"]), 1),
        outbox_unpublished=int(row["outbox_unpublished"]),
        outbox_oldest_seconds=round(float(row["outbox_oldest_seconds"]), 1),
        steps_pending=int(row["steps_pending"]),
        steps_oldest_pending_seconds=round(float(row["steps_oldest_pending_seconds"]), 1),
    )


def read_dead_letters(tx: Tx) -> DeadLetters:
    row = tx.one(DEAD_LETTER_COUNTS)
    assert row is not None
    return DeadLetters(
        poisoned_messages=int(row["poisoned_messages"]),
        poisoned_messages_24h=int(row["poisoned_messages_24h"]),
        dead_inbox_rows=int(row["dead_inbox_rows"]),
        undelivered_events=int(row["undelivered_events"]),
    )


def report_backlog(db: Database) -> dict[str, float]:
    """Log the age of the oldest unfinished work per queue: the line the backlog alerts read
    (infra/monitoring.tf). Once a minute across all sweep instances, through the duty row."""
    with db.transaction() as tx:
        backlog = read_backlog(tx)
    ages = {
        "inbox_oldest_seconds": backlog.inbox_oldest_seconds,
        "outbox_oldest_seconds": backlog.outbox_oldest_seconds,
        "steps_oldest_pending_seconds": backlog.steps_oldest_pending_seconds,
    }
    log_event(
        log,
        LogEvent.BACKLOG_AGE,
        "backlog ages",
        inbox_oldest_seconds=backlog.inbox_oldest_seconds,
        outbox_oldest_seconds=backlog.outbox_oldest_seconds,
        steps_oldest_pending_seconds=backlog.steps_oldest_pending_seconds,
    )
    for queue, age in ages.items():
        tracing.gauge("onceflow.backlog.age", age, queue=queue.removesuffix("_seconds"))
    return ages


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    return (Duty("report_backlog", 60.0, report_backlog),)
