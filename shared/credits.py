"""Credits: a price per block type, a tenant balance, and a ledger that charges a lineage once.

Where charging happens: in the side-effecting block, after throttling and before the request
leaves (`charge_step`), in its own committed transaction. Charging before the side effect is the
only place a step that can't be paid for can still be stopped; charging at settle would bill
for a call already made. The ledger is unique on the lineage key, which is the step's
idempotency key (stable across retries and replays of the step), so an attempt that crashed
after charging, a retry, and a replay all find the ledger row and are not charged again
(invariant 11). The balance moves only through one conditional UPDATE (`credit_balance >=
amount`), so concurrent charges can never take it below zero. Rehearsals are never charged.

A step that can't be paid for fails permanently with `INSUFFICIENT_CREDITS`; admission
refuses `insufficient_credits` up front with `has_credits`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared import queries
from shared.blocks.base import BlockContext, BlockFailure
from shared.db import Tx, get_database

SQL = queries.load("credits")
SAVEPOINT = SQL["credits_savepoint"]
ROLLBACK_SAVEPOINT = SQL["credits_rollback_savepoint"]
RELEASE_SAVEPOINT = SQL["credits_release_savepoint"]
LEDGER_INSERT = SQL["credits_ledger_insert"]
DEBIT = SQL["credits_debit"]
BALANCE = SQL["credits_balance"]
GRANT = SQL["credits_grant"]

OUTCOME_INSUFFICIENT_CREDITS = "INSUFFICIENT_CREDITS"
ChargeStatus = Literal["charged", "already_charged", "insufficient"]


@dataclass(frozen=True)
class Charge:
    status: ChargeStatus
    amount: int
    balance: int | None = None


def charge(
    tx: Tx,
    *,
    tenant_id: str,
    lineage_key: str,
    amount: int,
    block_type: str,
    run_id: str | None,
    step_id: str | None,
) -> Charge:
    """Charge `amount` once per `lineage_key`. Never raises for lack of credits: the ledger row
    of a charge that can't be paid is rolled back to a savepoint, so the caller's transaction
    stays usable and the next attempt (after a top-up) can still charge."""
    if amount <= 0:
        return Charge("charged", 0)
    tx.execute(SAVEPOINT)
    inserted = tx.one(
        LEDGER_INSERT,
        tenant_id=tenant_id,
        lineage_key=lineage_key,
        amount=amount,
        block_type=block_type,
        run_id=run_id,
        step_id=step_id,
    )
    if inserted is None:
        tx.execute(RELEASE_SAVEPOINT)
        return Charge("already_charged", 0)
    balance = tx.scalar(DEBIT, tenant_id=tenant_id, amount=amount)
    if balance is None:
        tx.execute(ROLLBACK_SAVEPOINT)
        tx.execute(RELEASE_SAVEPOINT)
        return Charge("insufficient", amount, tx.scalar(BALANCE, tenant_id=tenant_id))
    tx.execute(RELEASE_SAVEPOINT)
    return Charge("charged", amount, int(balance))


def charge_step(
    *, tenant_id: str, lineage_key: str, amount: int, block_type: str, run_id: str, step_id: str
) -> Charge:
    """`charge` in its own committed transaction: done before a side effect leaves."""
    return get_database().run(
        lambda tx: charge(
            tx,
            tenant_id=tenant_id,
            lineage_key=lineage_key,
            amount=amount,
            block_type=block_type,
            run_id=run_id,
            step_id=step_id,
        )
    )


def balance(tx: Tx, tenant_id: str) -> int | None:
    value = tx.scalar(BALANCE, tenant_id=tenant_id)
    return None if value is None else int(value)


def has_credits(tx: Tx, tenant_id: str, needed: int = 1) -> bool:
    """For admission's up-front `insufficient_credits` refusal."""
    current = balance(tx, tenant_id)
    return current is not None and current >= needed


def grant(tx: Tx, tenant_id: str, amount: int) -> int | None:
    value = tx.scalar(GRANT, tenant_id=tenant_id, amount=amount)
    return None if value is None else int(value)


def charge_block(ctx: BlockContext, block_type: str, price: int) -> None:
    """Charge a block's step by its lineage key, once and committed, before the side effect
    leaves; a tenant that can't pay fails the step permanently."""
    outcome = charge_step(
        tenant_id=ctx.tenant_id,
        lineage_key=ctx.idempotency_key,
        amount=price,
        block_type=block_type,
        run_id=ctx.run_id,
        step_id=ctx.step_id,
    )
    if outcome.status == "insufficient":
        raise BlockFailure(
            f"tenant {ctx.tenant_id} has {outcome.balance} credits; {block_type} costs {price}",
            error_class="permanent",
            outcome_code=OUTCOME_INSUFFICIENT_CREDITS,
        )
