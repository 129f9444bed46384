"""The workflow limit: a slot in the workflow's window (its definition's `rate_limit`,
shared/gates/throttle.py), served in
turn when steps wait for it (shared/gates/limit_queue.py)."""

from __future__ import annotations

from shared.blocks.base import BlockFailure, Gate
from shared.core.db import Tx
from shared.gates import limit_queue
from shared.gates.kind import Attempt, GateKind


def _open(tx: Tx, attempt: Attempt) -> BlockFailure | None:
    declared = attempt.workflow.rate_limit
    assert declared is not None  # `applies` checked it
    return limit_queue.open_in_turn(
        tx,
        attempt,
        scope="workflow",
        subject=attempt.workflow.workflow_id,
        declared=(declared.max, declared.window_seconds),
    )


GATE = GateKind(
    gate=Gate.WORKFLOW_LIMIT,
    applies=lambda attempt: attempt.workflow.rate_limit is not None,
    open=_open,
)
