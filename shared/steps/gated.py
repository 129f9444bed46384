"""Gates: what the step executor checks around a block's side effect, in one order.

A block spec declares its gates (`BlockSpec.gates`) and how to find what they key on
(`BlockSpec.target`); the workflow declares its limits (`rate_limit`, `host_rate_limit`). No
block calls a limiter or the ledger itself, so no block can forget one. Before `execute`:

    0. rehearsal (dry run)      → no gate at all: no live slot, no reservation, no charge
                                  (invariant 13).
    1. target                   → the connection / destination host; a refusal here (no
                                  connection, a forbidden address) costs nothing.
    2. connection limit         ┐ one atomic claim each (shared/gates/throttle.py); over a limit the
    3. workflow limit           │ step parks `THROTTLED` until the window ends, without using
    4. host limit               ┘ an attempt ("throttled until T by workflow limit …").
    5. budget                   → a reservation of the price against the workflow's `budget`,
                                  one per step row (its attempts share it; a replay's step
                                  reserves afresh), checked under the budget's lock
                                  (shared/gates/budgets.py); over the cap the step fails
                                  `BUDGET_EXCEEDED`, nothing sent.
    6. charge                   → the spec's price, once per lineage key (shared/gates/credits.py);
                                  a tenant that can't pay fails `INSUFFICIENT_CREDITS` (and the
                                  reservation is released).
    7. block.execute

After the attempt is classified (`settle_gates`), by what the outcome proves:

    succeeded / applied         → the reservation is spent; the charge stands.
    provably not applied        → the reservation is released (a retry reserves again); when
                                  the step failed for good, the charge its attempts made is
                                  refunded, once (a refund row keyed to it) — also when this
                                  last attempt was refused before the charge gate.
    fate unknown (timeout,      → the reservation stays reserved, the charge is marked
      reset, 5xx)                 never-refundable; the reconcile duty settles what is left.

The order is cheap-and-reversible first: a throttled step has used a window slot, never a
credit. A slot taken by a claim that a later limit refuses stays used (windows end anyway;
undoing it would need a second statement that can race).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import BaseModel

from shared.blocks.base import BlockContext, BlockFailure, BlockResult, BlockSpec, Gate, Target
from shared.core.db import get_database
from shared.gates import budgets, credits, throttle
from shared.gates.catalog import ORDER, WorkflowGates, record_outcome_unknown
from shared.steps.states import StepStatus


@dataclass(frozen=True)
class Passed:
    """What the gates took for this attempt, for `settle_gates`."""

    reserved: bool = False
    charged: bool = False
    # The block is priced and charge-gated, whether or not this attempt reached the charge
    # gate: an earlier attempt of the step may hold a charge to refund (issue 23 item 15).
    chargeable: bool = False
    # What the target resolved (the block reads it from its context: the checked addresses).
    target: Target | None = None


NOTHING = Passed()


def _limits(
    spec: BlockSpec, ctx: BlockContext, target: Target, workflow: WorkflowGates
) -> list[throttle.Limit]:
    limits: list[throttle.Limit] = []
    connection_id = target.connection_id
    for gate in ORDER:
        if gate not in spec.gates:
            continue
        if gate is Gate.CONNECTION_LIMIT and connection_id:
            found = get_database().run(lambda tx: throttle.connection_limit(tx, connection_id))
            if found is not None:
                limits.append(found)
        elif gate is Gate.WORKFLOW_LIMIT and workflow.rate_limit is not None:
            limits.append(
                throttle.Limit(
                    "workflow",
                    workflow.workflow_id,
                    workflow.rate_limit.max,
                    workflow.rate_limit.window_seconds,
                )
            )
        elif gate is Gate.HOST_LIMIT and workflow.host_rate_limit is not None and target.host:
            limits.append(
                throttle.Limit(
                    "host",
                    f"{ctx.tenant_id}|{target.host.lower()}",
                    workflow.host_rate_limit.max,
                    workflow.host_rate_limit.window_seconds,
                )
            )
    return limits


def _before_gates(spec: BlockSpec, ctx: BlockContext) -> Passed:
    """What an attempt holds before any gate: nothing taken yet, and whether the step is
    charged at all (a rehearsal never is)."""
    if ctx.dry_run:
        return NOTHING
    return Passed(chargeable=Gate.CHARGE in spec.gates and spec.price > 0)


def open_gates(
    spec: BlockSpec, ctx: BlockContext, config: BaseModel, workflow: WorkflowGates
) -> Passed:
    """Run the spec's declared gates in `ORDER`; raise the `BlockFailure` of the first that
    refuses (nothing has left the process then)."""
    before = _before_gates(spec, ctx)
    if ctx.dry_run or not spec.gates:
        return before
    target = spec.target(ctx, config) if spec.target is not None else Target()
    for limit in _limits(spec, ctx, target, workflow):
        throttle.claim_or_park(limit)
    reserved = False
    if Gate.BUDGET in spec.gates and workflow.budget is not None and spec.price > 0:
        landed = spec.landed_query(ctx, config, target) if spec.landed_query else None
        budgets.budget_gate(ctx, workflow.workflow_id, workflow.budget, spec.price, landed)
        reserved = True
    charged = False
    if Gate.CHARGE in spec.gates and spec.price > 0:
        try:
            credits.charge_gate(ctx, spec.type_name, spec.price)
        except Exception:
            if reserved:  # nothing will be sent: give the reservation back
                get_database().run(
                    lambda tx: budgets.settle_released(tx, ctx.idempotency_key, ctx.step_id)
                )
            raise
        charged = True
    return replace(before, reserved=reserved, charged=charged, target=target)


def run_gated(
    spec: BlockSpec, ctx: BlockContext, config: BaseModel, workflow: WorkflowGates
) -> tuple[BlockResult | BaseException, Passed]:
    """Open the gates, then execute the block: (what the attempt produced, what the gates
    took). Never raises for a block's or a gate's failure: it is the outcome."""
    passed = _before_gates(spec, ctx)
    try:
        passed = open_gates(spec, ctx, config, workflow)
        if passed.target is not None:
            ctx = replace(ctx, target=passed.target)
        return spec.execute(ctx, config), passed
    except Exception as exc:
        return exc, passed


def provably_not_applied(outcome: BlockResult | BaseException) -> bool:
    return isinstance(outcome, BlockFailure) and outcome.not_applied


def settle_gates(
    ctx: BlockContext,
    passed: Passed,
    outcome: BlockResult | BaseException,
    status: StepStatus,
) -> None:
    """Settle what the gates took by what the attempt proves (see the module docstring).
    Runs after the block, before the step's own settle; every write here is idempotent, so a
    crash between the two and a second run of this attempt's settle change nothing more."""
    if ctx.dry_run or not (passed.charged or passed.reserved or passed.chargeable):
        return
    key, step_id = ctx.idempotency_key, ctx.step_id
    if isinstance(outcome, BlockResult):
        if passed.reserved:
            get_database().run(lambda tx: budgets.settle_spent(tx, key, step_id))
        return
    if not provably_not_applied(outcome):
        if passed.reserved or passed.charged:
            get_database().run(lambda tx: record_outcome_unknown(tx, key, step_id))
        return
    if passed.reserved:
        get_database().run(lambda tx: budgets.settle_released(tx, key, step_id))
    # The step ends with this attempt provably not applied: pay back the charge any attempt of
    # this step made — not only this attempt's. An earlier attempt may have been charged and
    # answered 429 while this one was stopped by a gate before the charge gate (the budget);
    # `credits.refund` keeps every charge whose request may have left.
    if passed.chargeable and status is StepStatus.FAILED:
        reason = f"not applied: {getattr(outcome, 'outcome_code', type(outcome).__name__)}"
        get_database().run(
            lambda tx: credits.refund(tx, lineage_key=key, reason=reason, step_id=step_id)
        )
