"""The charge gate: the spec's price (at the token cap for a token price, settled down to
what the call used), charged once per lineage key and committed before the request leaves
(the ledger's rules are shared/gates/credits.py). A tenant that can't pay fails the step
`INSUFFICIENT_CREDITS` for good, nothing sent. Rehearsals are never charged (the walker opens
no gate for them)."""

from __future__ import annotations

from shared.blocks.base import BlockFailure, Gate
from shared.core.db import Tx
from shared.gates import credits
from shared.gates.kind import Attempt, Fate, GateKind, Verdict, refused_for_good


def _open(tx: Tx, attempt: Attempt) -> BlockFailure | None:
    ctx, spec = attempt.ctx, attempt.spec
    amount = spec.price_before(attempt.config)
    outcome = credits.charge(
        tx,
        tenant_id=ctx.tenant_id,
        lineage_key=ctx.idempotency_key,
        amount=amount,
        block_type=spec.type_name,
        run_id=ctx.run_id,
        step_id=ctx.step_id,
    )
    if outcome.status != "insufficient":
        return None
    return refused_for_good(
        f"tenant {ctx.tenant_id} has {outcome.balance} credits; {spec.type_name} costs {amount}",
        credits.OUTCOME_INSUFFICIENT_CREDITS,
    )


def _settle(tx: Tx, attempt: Attempt, verdict: Verdict) -> None:
    """Fate unknown → this attempt's charge is never refunded. The step failed for good with
    its last attempt provably not applied → the charge any attempt of this step made is paid
    back, once — also when this attempt was refused before reaching the charge gate (an
    earlier attempt was charged and answered 429); `credits.refund` keeps every charge whose
    request may have left."""
    key = attempt.ctx.idempotency_key
    if verdict.fate is Fate.APPLIED and verdict.used_price is not None:
        # A token price: the charge taken at the cap comes down to what the call used.
        credits.settle_used(
            tx, lineage_key=key, step_id=attempt.ctx.step_id, amount=verdict.used_price
        )
    elif verdict.fate is Fate.UNKNOWN and verdict.opened:
        credits.mark_outcome_unknown(tx, key)
    elif verdict.fate is Fate.NOT_APPLIED and verdict.step_failed:
        credits.refund(
            tx,
            lineage_key=key,
            reason=f"not applied: {verdict.outcome_code}",
            step_id=attempt.ctx.step_id,
        )


GATE = GateKind(
    gate=Gate.CHARGE,
    applies=lambda attempt: attempt.spec.priced,
    open=_open,
    settle=_settle,
    outcome_unknown=lambda tx, key, _step_id: credits.mark_outcome_unknown(tx, key),
)
