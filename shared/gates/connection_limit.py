"""The connection limit: a slot in the step's connection's window (`rate_limit_per_window` per
`rate_limit_window_seconds` on the connection row, shared/gates/throttle.py), narrowed to what
the portal has left by the vendor's rate-limit headers (shared/port/budget.py: a spent daily
budget or short window parks the step before it takes a slot; a 429 shrinks the window), and
served in turn when steps wait for it (shared/gates/limit_queue.py). A connection that doesn't
exist has no window: the gate passes and the port refuses it clearly."""

from __future__ import annotations

from shared.blocks.base import BlockFailure, Gate
from shared.core.db import Tx
from shared.gates import limit_queue
from shared.gates.kind import Attempt, GateKind


def _open(tx: Tx, attempt: Attempt) -> BlockFailure | None:
    assert attempt.target.connection_id is not None  # `applies` checked it
    return limit_queue.open_in_turn(
        tx, attempt, scope="connection", subject=attempt.target.connection_id
    )


GATE = GateKind(
    gate=Gate.CONNECTION_LIMIT,
    applies=lambda attempt: bool(attempt.target.connection_id),
    open=_open,
)
