"""The gates' order and what a workflow declares for them; the executor that runs them around
a block is shared/steps/gated.py."""

from __future__ import annotations

from dataclasses import dataclass

from shared.blocks.base import Gate
from shared.core.db import Tx
from shared.gates import budgets, credits
from shared.workflows.definition import Budget, RateLimit, WorkflowDefinition

# The documented order; `open_gates` runs the declared ones in it.
ORDER: tuple[Gate, ...] = (
    Gate.CONNECTION_LIMIT,
    Gate.WORKFLOW_LIMIT,
    Gate.HOST_LIMIT,
    Gate.BUDGET,
    Gate.CHARGE,
)


@dataclass(frozen=True)
class WorkflowGates:
    """What a workflow declares for its steps' gates (from the run's pinned version)."""

    workflow_id: str
    rate_limit: RateLimit | None = None
    host_rate_limit: RateLimit | None = None
    budget: Budget | None = None

    @classmethod
    def of(cls, workflow_id: str, graph: WorkflowDefinition) -> WorkflowGates:
        return cls(workflow_id, graph.rate_limit, graph.host_rate_limit, graph.budget)


def record_outcome_unknown(tx: Tx, idempotency_key: str, step_id: str | None) -> None:
    """An attempt of step `step_id` under this key may have applied and nobody will learn
    whether: its charge is never refunded and its reservation never released (settle_gates'
    "fate unknown" rule, and the sweep's reclaim of an attempt whose process died). Harmless
    where there is neither."""
    budgets.mark_outcome_unknown(tx, idempotency_key, step_id)
    credits.mark_outcome_unknown(tx, idempotency_key)
