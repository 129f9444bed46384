"""The workflow limit: a slot in the workflow's window (its definition's `rate_limit`,
shared/gates/throttle.py)."""

from __future__ import annotations

from shared.blocks.base import BlockFailure, Gate
from shared.core.db import Tx
from shared.gates import throttle
from shared.gates.kind import Attempt, GateKind


def _open(tx: Tx, attempt: Attempt) -> BlockFailure | None:
    declared = attempt.workflow.rate_limit
    assert declared is not None  # `applies` checked it
    limit = throttle.Limit(
        "workflow", attempt.workflow.workflow_id, declared.max, declared.window_seconds
    )
    return throttle.claim_or_refusal(tx, limit)


GATE = GateKind(
    gate=Gate.WORKFLOW_LIMIT,
    applies=lambda attempt: attempt.workflow.rate_limit is not None,
    open=_open,
)
