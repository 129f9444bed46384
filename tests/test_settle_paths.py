"""The two settle paths hold one rule (issue 25 item 6).

The hot path settles a step, creates its next rows and ends its run in one statement
(`steps_settle` with `fold`); the transactional path does the same statement by statement
(`steps_settle`, `steps_insert_many`, `runs_fail`, `runs_finish_if_done`, then the breaker's
`breaker_record_success` from the step executor). The run's moves stay re-typed in the one
statement, because tests/test_sql_statements.py reads every state move from the statement's
text; the key format and the breaker reset are SQL functions both paths call (migration
0340). This test holds the copies together: each case settles the same step of two identical
runs, one by each path, and compares the runs, steps, lease rows and breakers afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.core.db import Database
from shared.gates import breaker
from shared.steps import settle
from shared.steps.claim import ClaimedStep, LeaseConfig, claim_step
from shared.steps.outcomes import Settlement
from shared.steps.states import StepStatus
from shared.workflows.definition import Step
from tests.steps_support import chain, definition, publish_version, start_run

LEASE = LeaseConfig(lease_seconds=60, heartbeat_seconds=30)
WAKE = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

SUCCEEDED = Settlement(status=StepStatus.SUCCEEDED, attempt=1, outcome_code="OK", output={"a": 1})
FAILED = Settlement(
    status=StepStatus.FAILED,
    attempt=1,
    outcome_code="HTTP_400",
    error="bad request",
    error_class="permanent",
)
RETRYING = Settlement(
    status=StepStatus.WAITING_FOR_RETRY,
    attempt=1,
    outcome_code="HTTP_503",
    error="busy",
    error_class="transient",
    wake_at=WAKE,
)


@dataclass(frozen=True)
class Case:
    name: str
    steps: int  # in the chain s0 -> s1 -> …; s0 is settled
    settlement: Settlement
    # The workflow's breaker before: (state, consecutive failures), None for no row.
    breaker: tuple[str, int] | None = ("closed", 2)
    namespace: str = "live"
    cancelled: bool = False  # the run was cancelled while s0 ran


CASES = [
    Case("goes on", 2, SUCCEEDED),
    Case("finishes, streak reset", 1, SUCCEEDED),
    Case("finishes, half-open closes", 1, SUCCEEDED, ("half_open", 0)),
    Case("finishes, open stays open", 1, SUCCEEDED, ("open", 5)),
    Case("finishes, no breaker row", 1, SUCCEEDED, None),
    Case("finishes a rehearsal", 1, SUCCEEDED, namespace="rehearsal"),
    Case("fails the run", 2, FAILED, ("closed", 1)),
    Case("waits to retry", 2, RETRYING, ("closed", 1)),
    Case("succeeds in a cancelled run", 2, SUCCEEDED, cancelled=True),
    Case("fails in a cancelled run", 2, FAILED, cancelled=True),
    Case("waits in a cancelled run", 2, RETRYING, cancelled=True),
]


def _claimed(db: Database, name: str, case: Case) -> tuple[ClaimedStep, list[Step]]:
    """A run of its own workflow `name` (so each path has its own breaker) with s0 claimed."""
    wf = definition(chain(case.steps, "test.noop"), name=name)
    version = publish_version(db, wf)
    run_id, (step_id,) = start_run(db, version, namespace=case.namespace)
    step = claim_step(db, step_id, LEASE, namespace=case.namespace)
    assert step is not None
    with db.transaction() as tx:
        if case.breaker is not None:
            state, failures = case.breaker
            tx.execute(
                "INSERT INTO workflow_breakers (workflow_id, state, consecutive_failures,"
                " opened_at, reason) VALUES (:w, :s, :f,"
                " CASE WHEN :s = 'closed' THEN NULL ELSE now() END,"
                " CASE WHEN :s = 'closed' THEN NULL ELSE 'test' END)",
                w=step.workflow_id,
                s=state,
                f=failures,
            )
        if case.cancelled:
            tx.execute(
                "UPDATE workflow_runs SET status = 'cancelled', finished_at = now(),"
                " cancelled_by = 'test' WHERE id = :r",
                r=run_id,
            )
    return step, wf.steps[1:2]


def _after(db: Database, step: ClaimedStep, settled: settle.Settled) -> dict[str, Any]:
    """What the settle left, with the ids and times that differ between two runs taken out."""
    root = step.lineage_root
    with db.transaction() as tx:
        run = tx.one(
            "SELECT status, error, finished_at IS NOT NULL AS finished FROM workflow_runs"
            " WHERE id = :r",
            r=step.run_id,
        )
        steps = tx.all(
            "SELECT step_key, node_id, block_type, status, attempt, output, input, error,"
            " error_class, outcome_code, branch_choice, wake_at, park_id, park_kind,"
            " replace(idempotency_key, :root, '<root>') AS idempotency_key,"
            " lease_id IS NULL AS lease_cleared, dispatched_at IS NOT NULL AS dispatched,"
            " finished_at IS NOT NULL AS finished"
            " FROM workflow_steps WHERE run_id = :r ORDER BY step_key",
            r=step.run_id,
            root=root,
        )
        leases = tx.all(
            "SELECT end_kind, end_status, outcome_code, error_class, error,"
            " ended_at IS NOT NULL AS ended"
            " FROM workflow_step_leases WHERE step_id = :s ORDER BY attempt",
            s=step.id,
        )
        breakers = tx.all(
            "SELECT state, consecutive_failures, trips, opened_at IS NOT NULL AS opened"
            " FROM workflow_breakers WHERE workflow_id = :w",
            w=step.workflow_id,
        )
    assert run is not None
    return {
        "run": {**run, "error": (run["error"] or "").replace(root, "<root>")},
        "steps": steps,
        "leases": leases,
        "breakers": breakers,
        "settled": (
            settled.fenced_out,
            len(settled.to_dispatch),
            settled.run_status,
            settled.run_failed,
        ),
    }


def _count_for_breaker(db: Database, step: ClaimedStep, settled: settle.Settled) -> None:
    """What the step executor does after either path (shared/steps/advance.py `_finish`)."""
    if (
        step.namespace == "live"
        and (settled.run_failed or settled.run_status == "succeeded")
        and not settled.breaker_counted
    ):
        breaker.record_run_outcome(
            db, step.workflow_id, failed=settled.run_failed, settings=None, why="test"
        )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_one_statement_settle_and_the_transaction_leave_the_same_rows(
    db: Database, case: Case
) -> None:
    settlement = case.settlement
    folded_step, next_nodes = _claimed(db, "fold", case)
    folded = settle._settle_in_one_statement(db, folded_step, settlement, next_nodes)
    if case.cancelled and settlement.status.parked:
        assert folded is None  # the one statement leaves a cancelled run's wait to the other
        return
    assert folded is not None, "the one statement should have decided this case"
    _count_for_breaker(db, folded_step, folded)

    tx_step, tx_next = _claimed(db, "transaction", case)
    in_tx = settle._settle_in_transaction(db, tx_step, settlement, tx_next, loop=None, body=None)
    _count_for_breaker(db, tx_step, in_tx)

    assert _after(db, folded_step, folded) == _after(db, tx_step, in_tx)
