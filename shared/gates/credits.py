"""Credits: a price per block type, a tenant balance, and a ledger that charges a lineage once.

Where charging happens: in the step executor's charge gate (shared/gates/charge.py), after the
rate limits and the budget and before the block's request leaves (`charge`), in a transaction
committed before it leaves; the price is the block spec's `price`, stated once. Charging before
the side effect is the only place a step that can't be paid for can still be stopped; charging
at settle would bill for a call already made. The ledger holds at most one live (unrefunded)
charge per lineage key, which is the step's idempotency key (stable across retries and replays
of the step), so an attempt that crashed after charging, a retry, and a replay all find the
ledger row and are not charged again (invariant 11). A refunded charge no longer holds the
lineage: the replay that then applies is charged again, once (issue 23 item 4). The balance
moves only through one conditional UPDATE (`credit_balance >= amount`), so concurrent charges
can never take it below zero. Rehearsals are never charged.

A step that can't be paid for fails permanently with `INSUFFICIENT_CREDITS`; admission
refuses `insufficient_credits` up front with `has_credits`.

Refunds: when a step fails for good and its last attempt provably never applied (refused
before it left — by any gate, even one before the charge gate —, refused connection, 429, a 4xx
the port classifies as not applied), the charge its attempts made is refunded (`refund`): the
charge is marked refunded and a `credit_refunds` row keyed to it is written in one guarded
statement, with the balance credit in the same transaction, so no settle, redelivery or replay
pays it twice. Never refunded: a charge any of whose attempts ended with the outcome unknown
(`mark_outcome_unknown`) or lost its lease to the sweep after charging, and a charge another
step row made (a replay's step that found an earlier application's charge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack

from shared.core import queries
from shared.core.db import Database, Tx

SQL = queries.load("credits")
CHARGE = SQL["credits_charge"]
UNCHARGE = SQL["credits_uncharge"]
BALANCE = SQL["credits_balance"]
GRANT = SQL["credits_grant"]
MARK_OUTCOME_UNKNOWN = SQL["credits_mark_outcome_unknown"]
REFUND_INSERT = SQL["credits_refund_insert"]
SETTLE_USED = SQL["credits_settle_used"]

OUTCOME_INSUFFICIENT_CREDITS = "INSUFFICIENT_CREDITS"
ChargeStatus = Literal["charged", "already_charged", "insufficient"]


@dataclass(frozen=True)
class Charge:
    status: ChargeStatus
    amount: int
    balance: int | None = None


class ChargeOf(TypedDict):
    """What a charge is of: `amount` for `block_type`, to `tenant_id`, once per `lineage_key`
    (the step's idempotency key), recorded with the run and step that made it."""

    tenant_id: str
    lineage_key: str
    amount: int
    block_type: str
    run_id: str | None
    step_id: str | None


def charge(tx: Tx, **of: Unpack[ChargeOf]) -> Charge:
    """Charge `amount` once per `lineage_key`: one statement on the happy path. Never raises
    for lack of credits: the ledger row of a charge that can't be paid is deleted again in
    the same transaction (`credits_uncharge`), so the caller's transaction stays usable and
    the next attempt (after a top-up) can still charge."""
    amount, tenant_id = of["amount"], of["tenant_id"]
    if amount <= 0:
        return Charge("charged", 0)
    row = tx.one(CHARGE, **of)
    assert row is not None  # a SELECT of two scalars: always one row
    if row["charged_id"] is None:
        return Charge("already_charged", 0)
    if row["balance"] is None:
        tx.execute(UNCHARGE, id=row["charged_id"])
        return Charge("insufficient", amount, tx.scalar(BALANCE, tenant_id=tenant_id))
    return Charge("charged", amount, int(row["balance"]))


def charge_step(db: Database, **of: Unpack[ChargeOf]) -> Charge:
    """`charge` in its own committed transaction."""
    return db.run(lambda tx: charge(tx, **of))


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


def mark_outcome_unknown(tx: Tx, lineage_key: str) -> None:
    tx.execute(MARK_OUTCOME_UNKNOWN, lineage_key=lineage_key)


def refund(tx: Tx, *, lineage_key: str, reason: str, step_id: str | None) -> int:
    """Refund the live charge of `lineage_key` that step `step_id` made, once; the amount paid
    back now (0 when there is none, it was refunded already, or its outcome may have applied:
    see `credits_refund_insert`)."""
    row = tx.one(REFUND_INSERT, lineage_key=lineage_key, reason=reason[:500], step_id=step_id)
    if row is None:
        return 0
    tx.scalar(GRANT, tenant_id=row["tenant_id"], amount=int(row["amount"]))
    return int(row["amount"])


def settle_used(tx: Tx, *, lineage_key: str, step_id: str | None, amount: int) -> None:
    """Lower the live charge step `step_id` made for `lineage_key` to `amount` (a token price
    taken at the cap, settled at what the call used) and pay the difference back, once.
    Nobody reads the answer: sent with the COMMIT of the gates' settle (one round trip)."""
    tx.at_commit(SETTLE_USED, lineage_key=lineage_key, step_id=step_id, amount=amount)
