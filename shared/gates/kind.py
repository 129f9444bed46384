"""What a gate is: the shape every module of the catalog (shared/gates/catalog.py) fills in.

A gate stands between a step's block and its side effect. Each one says:
- whether it stands in front of this attempt (`applies`; the walker has already checked that
  the block's spec declares it in `BlockSpec.gates`). Pure: no database, no network;
- what it must learn before its transaction, outside any (`prepare`: the budget's landed query,
  which may build a port);
- what it takes before the block runs (`open`), in the transaction it is handed: `None` when the
  attempt passes, else the `BlockFailure` that refuses it. A refusal is returned, not raised, so
  whatever the refusal wrote (a throttle's counted claim) commits with that transaction;
- what it gives back when a later gate refused the attempt (`release`);
- what it settles once the attempt's outcome is known (`settle`, given a `Verdict`); called for
  every gate that applies, also one this attempt never reached (an earlier attempt's charge
  is refunded when the step ends not applied);
- what it marks when an attempt's fate can no longer be learnt (`outcome_unknown`: the sweep's
  reclaim of an attempt whose process died).

Every callable that touches the database takes the transaction it runs in (`tx`) and opens
none itself: the walker (shared/steps/gated.py) decides which gates share a transaction and
when it commits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel

from shared.blocks.base import (
    BlockContext,
    BlockFailure,
    BlockResult,
    BlockSpec,
    Gate,
    LandedQuery,
    Target,
)
from shared.core.db import Tx
from shared.workflows.definition import Budget, RateLimit, WorkflowDefinition


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


@dataclass(frozen=True)
class Attempt:
    """What a gate sees of one attempt of a step."""

    spec: BlockSpec
    ctx: BlockContext
    config: BaseModel
    workflow: WorkflowGates
    # What the spec's `target` resolved (empty until it did, or when it refused).
    target: Target = field(default_factory=Target)
    # Learnt by the budget gate's `prepare`: how the reconcile duty may ask the provider later.
    landed: LandedQuery | None = None


class Fate(StrEnum):
    """What an attempt's outcome proves about its side effect."""

    APPLIED = "applied"  # the block returned
    NOT_APPLIED = "not_applied"  # provably never took effect (BlockFailure.not_applied)
    UNKNOWN = "unknown"  # may have taken effect: a timeout, a reset, a 5xx, a crash


def fate_of(outcome: BlockResult | BaseException) -> Fate:
    if isinstance(outcome, BlockResult):
        return Fate.APPLIED
    if isinstance(outcome, BlockFailure) and outcome.not_applied:
        return Fate.NOT_APPLIED
    return Fate.UNKNOWN


@dataclass(frozen=True)
class Verdict:
    fate: Fate
    # This attempt passed the gate (so it holds what the gate took).
    opened: bool
    # The step failed for good with this attempt.
    step_failed: bool
    # The outcome's code (or the exception's type), for what a settle records.
    outcome_code: str
    # What the attempt that applied costs by what it used (`BlockSpec.price_used`), when that
    # is below what the gates took before the call; None: what they took stands.
    used_price: int | None = None


def refused_for_good(message: str, outcome_code: str) -> BlockFailure:
    """A refusal that fails the step permanently with nothing sent (over the budget, no credits
    left): provably not applied, so the charge an earlier attempt made is refunded."""
    return BlockFailure(
        message, error_class="permanent", outcome_code=outcome_code, not_applied=True
    )


@dataclass(frozen=True)
class GateKind:
    gate: Gate  # the name a block declares it by
    applies: Callable[[Attempt], bool]
    open: Callable[[Tx, Attempt], BlockFailure | None]
    prepare: Callable[[Attempt], Attempt] | None = None
    release: Callable[[Tx, Attempt], None] | None = None
    settle: Callable[[Tx, Attempt, Verdict], None] | None = None
    # (tx, idempotency key, step id): an attempt of that step may have applied.
    outcome_unknown: Callable[[Tx, str, str | None], None] | None = None
