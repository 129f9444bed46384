"""The budget gate: a reservation of the step's price against its workflow's `budget`, written
before the request leaves and settled by what the attempt proves (invariant 16; the rules,
the lock and the reconcile duty are shared/gates/budgets.py). Over the cap the step fails
`BUDGET_EXCEEDED` for good, nothing sent."""

from __future__ import annotations

from dataclasses import replace

from shared.blocks.base import BlockFailure, Gate
from shared.core.db import Tx
from shared.gates import budgets
from shared.gates.kind import Attempt, Fate, GateKind, Verdict, refused_for_good


def _prepare(attempt: Attempt) -> Attempt:
    """How the reconcile duty may ask the provider later; resolving it may build a port (and
    read the connection), so it runs before the gate's transaction, never inside it."""
    resolve = attempt.spec.landed_query
    if resolve is None:
        return attempt
    return replace(attempt, landed=resolve(attempt.ctx, attempt.config, attempt.target))


def _open(tx: Tx, attempt: Attempt) -> BlockFailure | None:
    ctx, workflow = attempt.ctx, attempt.workflow
    # At the token cap for a token price: the cap must hold for the most the call may use.
    amount = attempt.spec.price_before(attempt.config)
    budget = workflow.budget
    assert budget is not None  # `applies` checked it
    outcome = budgets.reserve(
        tx,
        budget_key=budgets.workflow_budget_key(workflow.workflow_id),
        budget=budget,
        amount=amount,
        idempotency_key=ctx.idempotency_key,
        tenant_id=ctx.tenant_id,
        run_id=ctx.run_id,
        step_id=ctx.step_id,
        landed=attempt.landed,
    )
    if outcome.status != "exceeded":
        return None
    return refused_for_good(
        f"workflow {workflow.workflow_id}'s budget is {budget.credits} credits per {budget.per}; "
        f"{outcome.used} are reserved or spent and this step needs {amount}",
        budgets.OUTCOME_BUDGET_EXCEEDED,
    )


def _release(tx: Tx, attempt: Attempt) -> None:
    """A later gate refused: nothing will be sent, the reservation goes back."""
    budgets.settle_released(tx, attempt.ctx.idempotency_key, attempt.ctx.step_id)


def _settle(tx: Tx, attempt: Attempt, verdict: Verdict) -> None:
    """Sent → spent (at what it used, for a token price); provably not applied → released (a
    retry reserves again); fate unknown → left reserved, marked so that it can only become
    spent."""
    if not verdict.opened:
        return
    key, step_id = attempt.ctx.idempotency_key, attempt.ctx.step_id
    if verdict.fate is Fate.APPLIED:
        budgets.settle_spent(tx, key, step_id, amount=verdict.used_price)
    elif verdict.fate is Fate.NOT_APPLIED:
        budgets.settle_released(tx, key, step_id)
    else:
        budgets.mark_outcome_unknown(tx, key, step_id)


GATE = GateKind(
    gate=Gate.BUDGET,
    applies=lambda attempt: attempt.workflow.budget is not None and attempt.spec.priced,
    prepare=_prepare,
    open=_open,
    release=_release,
    settle=_settle,
    outcome_unknown=budgets.mark_outcome_unknown,
)
