"""The gates: what the step executor checks around a block's side effect, in one order.

A block spec declares its gates (`BlockSpec.gates`) and how to find what they key on
(`BlockSpec.target`); the workflow declares its limits (`rate_limit`, `host_rate_limit`,
`budget`). No block calls a limiter or the ledger itself, so no block can forget one. Each gate
is one module (shaped by shared/gates/kind.py) and one line in `GATES`; the executor
(shared/steps/gated.py) walks the list. Before `execute`:

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

After the attempt is classified (`settle`), by what the outcome proves:

    succeeded / applied         → the reservation is spent; the charge stands. A token price
                                  (`BlockSpec.token_price`, an AI step's) was taken at its cap
                                  before the call: both come down to what the output says it
                                  used, never up (the difference goes back to the balance).
    provably not applied        → the reservation is released (a retry reserves again); when
                                  the step failed for good, the charge its attempts made is
                                  refunded, once (a refund row keyed to it) — also when this
                                  last attempt was refused before the charge gate.
    fate unknown (timeout,      → the reservation stays reserved, the charge is marked
      reset, 5xx)                 never-refundable; the reconcile duty settles what is left.

The order is cheap-and-reversible first: a throttled step has used a window slot, never a
credit. A slot taken by a claim that a later limit refuses stays used (windows end anyway;
undoing it would need a second statement that can race). The circuit breaker is no step gate:
it pauses a workflow at admission (shared/gates/breaker.py).
"""

from __future__ import annotations

from shared.core.db import Tx
from shared.gates import charge, connection_limit, host_limit, reservation, workflow_limit
from shared.gates.kind import GateKind

GATES: tuple[GateKind, ...] = (
    connection_limit.GATE,
    workflow_limit.GATE,
    host_limit.GATE,
    reservation.GATE,
    charge.GATE,
)


def record_outcome_unknown(tx: Tx, idempotency_key: str, step_id: str | None) -> None:
    """An attempt of step `step_id` under this key may have applied and nobody will learn
    whether: its charge is never refunded and its reservation never released (the settle's
    "fate unknown" rule, and the sweep's reclaim of an attempt whose process died). Harmless
    where a gate took nothing."""
    for kind in GATES:
        if kind.outcome_unknown is not None:
            kind.outcome_unknown(tx, idempotency_key, step_id)
