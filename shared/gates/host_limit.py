"""The host limit: a slot in the window of the step's destination host, per tenant (the
definition's `host_rate_limit`, shared/gates/throttle.py), served in turn when steps wait for it
(shared/gates/limit_queue.py)."""

from __future__ import annotations

from shared.blocks.base import BlockFailure, Gate
from shared.core.db import Tx
from shared.gates import limit_queue
from shared.gates.kind import Attempt, GateKind


def _open(tx: Tx, attempt: Attempt) -> BlockFailure | None:
    declared, host = attempt.workflow.host_rate_limit, attempt.target.host
    assert declared is not None and host  # `applies` checked both
    subject = f"{attempt.ctx.tenant_id}|{host.lower()}"
    return limit_queue.open_in_turn(
        tx,
        attempt,
        scope="host",
        subject=subject,
        declared=(declared.max, declared.window_seconds),
    )


GATE = GateKind(
    gate=Gate.HOST_LIMIT,
    applies=lambda attempt: (
        attempt.workflow.host_rate_limit is not None and bool(attempt.target.host)
    ),
    open=_open,
)
