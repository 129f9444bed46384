"""Spend budgets: a cap enforced by a reservation written before the side effect (invariant 16).

A workflow's `budget: {credits: N, per: 1d}` caps what its steps may spend over a rolling
window. The step executor's budget gate (shared/gates/reservation.py) reserves a priced step's
price right before its request leaves, keyed by the step's idempotency key and its step row — the
attempts of one step (retries, a re-run of an attempt) find their own row and never count
twice, while a replay, a new step row that really sends again, reserves against the cap afresh
and is refused when it is full (issue 23 item 7) — in one transaction under the budget's
advisory lock:

    live reservations + settled spend in the window + amount <= cap   →  reserved
    otherwise                                                         →  BUDGET_EXCEEDED

and the step fails permanently with nothing sent. After the attempt, by what it proves:

- sent (the block returned)                      → `spent`
- provably not applied (refused before it left,  → `released` (a retry reserves it again,
  refused connection, 429, …)                       counted against the cap afresh)
- fate unknown (timeout, reset, 5xx)             → stays `reserved`, marked outcome-unknown
                                                   (it can then only become spent)

A reservation whose step ended without reporting (a crash between reserve and settle, a lease
that expired for good, a fate that stayed unknown) is settled by the
`reconcile_budget_reservations` sweep duty, once (guarded on its status): counted as spent,
since the request may have left — unless the provider can be asked (`LandedQuery`, recorded
with the reservation: a create stamped with a unique-value key property): then it is asked,
and the record's existence decides, landed ⇒ spent, never landed ⇒ released. A provider that
can't answer now leaves it reserved (counted) for the next period. Rehearsals never reserve.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from shared.blocks.base import LandedQuery
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Duty, SweepConfig
from shared.core.logs import get_logger
from shared.port import observed
from shared.workflows.definition import Budget, WorkflowDefinition

SQL = queries.load("budgets")
LOCK = SQL["budget_lock"]
RESERVE = SQL["budget_reserve"]
RESERVE_AGAIN = SQL["budget_reserve_again"]
SETTLE_SPENT = SQL["budget_settle_spent"]
SETTLE_RELEASED = SQL["budget_settle_released"]
MARK_OUTCOME_UNKNOWN = SQL["budget_mark_outcome_unknown"]
RECONCILE = SQL["budget_reconcile"]
RECONCILE_ASKABLE = SQL["budget_reconcile_askable"]
RECONCILE_SETTLE = SQL["budget_reconcile_settle"]
SUMMARY = SQL["budget_summary"]
ACTIVE_DEFINITION = SQL["budget_active_definition"]

OUTCOME_BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
# A reservation this old whose step has ended is reconciled (longer than a step's lease, so an
# attempt still running is never judged).
RECONCILE_AFTER_SECONDS = 900
# The window the ops view sums over for a workflow that declares no budget.
UNCAPPED_WINDOW = Budget(credits=1, per="30d")
ReserveStatus = Literal["reserved", "already_reserved", "exceeded"]
log = get_logger(__name__)


@dataclass(frozen=True)
class Reservation:
    status: ReserveStatus
    used: int
    cap: int


def workflow_budget_key(workflow_id: str) -> str:
    return f"workflow:{workflow_id}"


def reserve(
    tx: Tx,
    *,
    budget_key: str,
    budget: Budget,
    amount: int,
    idempotency_key: str,
    tenant_id: str,
    run_id: str | None,
    step_id: str | None,
    landed: LandedQuery | None = None,
) -> Reservation:
    """Reserve `amount` for `idempotency_key` if it fits under the cap (see the module
    docstring). Under the budget's lock: the sum and the write can't interleave with another
    reservation of the same budget."""
    # The lock is a statement of its own (the reservation's snapshot must be taken after it is
    # granted; the server runs them in order) sent in the reservation's round trip.
    tx.ahead(LOCK, budget_key=budget_key)
    read = tx.one(
        RESERVE,
        budget_key=budget_key,
        window_seconds=budget.window_seconds,
        idempotency_key=idempotency_key,
        tenant_id=tenant_id,
        run_id=run_id,
        step_id=step_id,
        amount=amount,
        cap=budget.credits,
        landed_query=_landed_json(landed),
    )
    assert read is not None  # a SELECT from a one-row CTE: always one row
    used, existing = int(read["used"]), read["existing"]
    if read["inserted"]:
        return Reservation("reserved", used + amount, budget.credits)
    if existing is not None and existing != "released":
        return Reservation("already_reserved", used, budget.credits)
    if used + amount > budget.credits:
        return Reservation("exceeded", used, budget.credits)
    # Released by an attempt that provably never applied: this retry reserves it again.
    tx.execute(
        RESERVE_AGAIN,
        idempotency_key=idempotency_key,
        amount=amount,
        step_id=step_id,
        landed_query=_landed_json(landed),
    )
    return Reservation("reserved", used + amount, budget.credits)


def _landed_json(landed: LandedQuery | None) -> str | None:
    return None if landed is None else json.dumps(dataclasses.asdict(landed))


def settle_spent(
    tx: Tx, idempotency_key: str, step_id: str | None, *, amount: int | None = None
) -> None:
    """Spent; at `amount` when the call used less than was reserved (a token price), never
    more. Nobody reads the answer: sent with the COMMIT of the gates' settle (one round trip)."""
    tx.at_commit(SETTLE_SPENT, idempotency_key=idempotency_key, step_id=step_id, amount=amount)


def settle_released(tx: Tx, idempotency_key: str, step_id: str | None) -> None:
    tx.execute(SETTLE_RELEASED, idempotency_key=idempotency_key, step_id=step_id)


def mark_outcome_unknown(tx: Tx, idempotency_key: str, step_id: str | None) -> None:
    tx.execute(MARK_OUTCOME_UNKNOWN, idempotency_key=idempotency_key, step_id=step_id)


def reconcile(
    db: Database, *, older_than_seconds: int = RECONCILE_AFTER_SECONDS, batch: int = 500
) -> dict[str, int]:
    """The sweep duty: settle open reservations whose step ended without reporting; those
    the provider can tell about by asking it, one search each, outside any transaction."""
    with db.transaction() as tx:
        rows = tx.all(RECONCILE, older_than_seconds=older_than_seconds, batch=batch)
        askable = tx.all(RECONCILE_ASKABLE, older_than_seconds=older_than_seconds, batch=batch)
    settled, unanswered = len(rows), 0
    for row in askable:
        query = LandedQuery(**row["landed_query"])
        try:
            status = "spent" if landed(db, query) else "released"
        except Exception as exc:  # the provider can't answer now: counted, asked next period
            unanswered += 1
            log.warning("budget reconcile: could not ask whether %s landed: %s", query, exc)
            continue
        with db.transaction() as tx:
            settled += len(tx.all(RECONCILE_SETTLE, id=row["id"], status=status))
    observed.flush(db)  # what the searches observed (shared/port/observed.py)
    return {"settled": settled, "unanswered": unanswered}


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    """Budget reservations whose step ended without settling them (`reconcile`)."""
    return (Duty("reconcile_budget_reservations", 300.0, reconcile),)


def landed(db: Database, query: LandedQuery) -> bool:
    """Whether the provider holds the record `query` names (its unique-value property holds
    the key the attempt stamped). HubSpot's search lags its writes (FACTS.md: "Search lags
    writes"); the duty only asks about reservations older than `RECONCILE_AFTER_SECONDS`
    (15 minutes), long after any write of the attempt could still be unindexed. Reading by
    `idProperty` instead of searching would not lag; the port has no such read yet."""
    from shared.port.interface import SearchFilter
    from shared.providers.connect import port_for

    port = port_for(db, query.connection_id)
    found = port.search(
        query.object_type, [SearchFilter(query.property, "EQ", query.value)], limit=1
    )
    return bool(found)


def summary(tx: Tx, workflow_id: str, budget: Budget) -> dict[str, int]:
    """Reserved, spent and released credits of the workflow's current window."""
    row = tx.one(
        SUMMARY, budget_key=workflow_budget_key(workflow_id), window_seconds=budget.window_seconds
    )
    assert row is not None
    return {k: int(row[k]) for k in ("reserved", "spent", "released")}


def workflow_summary(tx: Tx, workflow_id: str) -> dict[str, Any]:
    """For ops: the active version's budget (None when it declares none) and the reserved,
    spent and released credits of its window (30 days without a budget)."""
    definition = tx.scalar(ACTIVE_DEFINITION, workflow_id=workflow_id)
    budget = None
    if definition is not None:
        budget = WorkflowDefinition.model_validate(definition).budget
    sums = summary(tx, workflow_id, budget or UNCAPPED_WINDOW)
    return {
        "workflow_id": workflow_id,
        "credits": None if budget is None else budget.credits,
        "per": (budget or UNCAPPED_WINDOW).per,
        **sums,
    }
