"""A step failed by the sweep's reclaim (its process died: the lease expired with an
at-most-once side effect started, or with no attempts left) in a run whose version declares
`compensate:` or `finally:` does what a settle's failure does: the compensations run, then the
finally steps, and the run ends failed saying which step and why. Before, the reclaim's
statement failed such a run at once, uncompensated and without its finally steps."""

from __future__ import annotations

from typing import Any

from shared.core.db import Database
from shared.steps import advance
from shared.sweep.loop import run_sweep
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import publish_version, run_row, start_run, steps_of
from tests.test_compensate import Engine
from tests.test_finally import FINAL, _definition, _finally_ran_once


def _died_holding(db: Database, step_id: str, *, marked: bool, attempt: int = 1) -> None:
    """What a process that died mid-step leaves: the step running under a lease that has
    expired (marked: its at-most-once side effect may have started)."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'running', attempt = :a,"
            " lease_id = gen_random_uuid(), lease_expires_at = now() - interval '5 seconds',"
            " started_at = now() - interval '11 min',"
            " side_effect_started_at = CASE WHEN :m THEN now() END WHERE id = :i",
            i=step_id,
            a=attempt,
            m=marked,
        )


def _sweep(db: Database, engine: Engine) -> int:
    """One sweep pass, as the sweep function runs it: in a process that has never loaded the
    run's version (its parsed-graph cache is cold)."""
    advance._graphs.clear()
    return run_sweep(db, 0, duties=[], dispatch=engine.dispatch).reclaimed_failed


def _until(engine: Engine, step_key: str, db: Database, run_id: str) -> str:
    """Advance the run's messages until `step_key`'s row is dispatched; that row's id, left
    undelivered (its process is the one that dies)."""
    while engine.queue:
        step_id = engine.queue.popleft()
        if _key_of(db, step_id) == step_key:
            return step_id
        engine.advance(step_id)
    raise AssertionError(f"{step_key} was never dispatched in run {run_id}")


def _key_of(db: Database, step_id: str) -> str:
    with db.transaction() as tx:
        return str(tx.scalar("SELECT step_key FROM workflow_steps WHERE id = :i", i=step_id))


def _started(
    db: Database, steps: list[dict[str, Any]], final: list[dict[str, Any]] = FINAL
) -> tuple[Recorder, Engine, str]:
    """A run of a version with `steps` and `finally: final`, its first message queued."""
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    run_id, first = start_run(db, publish_version(db, _definition(steps, final)))
    engine.queue.extend(first)
    return recorder, engine, run_id


A_THEN_B = [{"id": "a", "type": "test.noop", "next": "b"}, {"id": "b", "type": "test.noop"}]


def _undo(step_id: str) -> dict[str, Any]:
    return {
        "id": step_id,
        "type": "test.noop",
        "compensate": {"type": "test.noop"},
    }


def test_a_step_reclaimed_outcome_unknown_compensates_then_runs_finally(db: Database) -> None:
    recorder, engine, run_id = _started(
        db, [{**_undo("reserve"), "next": "charge"}, {"id": "charge", "type": "test.noop"}]
    )
    _died_holding(db, _until(engine, "charge", db, run_id), marked=True)

    assert _sweep(db, engine) == 1
    run = run_row(db, run_id)
    assert run["status"] == "running" and run["phase"] == "compensating"
    engine.drain([])

    steps = _finally_ran_once(db, run_id, recorder)
    assert steps["charge"]["outcome_code"] == "OUTCOME_UNKNOWN"
    assert steps["compensate:reserve"]["status"] == "succeeded"
    assert recorder.count("compensate:reserve") == 1
    assert steps["compensate:reserve"]["finished_at"] <= steps["finally:summary"]["created_at"]
    run = run_row(db, run_id)
    assert run["status"] == "failed" and run["final_status"] == "failed"
    assert "step charge failed (OUTCOME_UNKNOWN)" in run["error"]
    # A second sweep finds nothing, and every message delivered again runs nothing twice.
    assert _sweep(db, engine) == 0
    for step_id in list(engine.published):
        assert not engine.advance(step_id).claimed
    _finally_ran_once(db, run_id, recorder)


def test_a_step_out_of_attempts_runs_finally_when_there_is_nothing_to_undo(
    db: Database,
) -> None:
    recorder, engine, run_id = _started(db, A_THEN_B)
    # Its process died on the last attempt the block allows (not at-most-once: unmarked).
    _died_holding(db, _until(engine, "b", db, run_id), marked=False, attempt=3)

    assert _sweep(db, engine) == 1
    assert run_row(db, run_id)["phase"] == "finally"
    engine.drain([])
    steps = _finally_ran_once(db, run_id, recorder)
    assert steps["b"]["outcome_code"] == "LEASE_EXPIRED"
    run = run_row(db, run_id)
    assert run["status"] == "failed" and run["final_status"] == "failed"
    assert "step b failed (LEASE_EXPIRED)" in run["error"]


def test_a_compensation_out_of_attempts_is_recorded_and_the_others_still_run(
    db: Database,
) -> None:
    recorder, engine, run_id = _started(
        db,
        [
            {**_undo("first"), "next": "second"},
            {**_undo("second"), "next": "fail"},
            {"id": "fail", "type": "test.fail_permanent"},
        ],
    )
    # The newest undo's process keeps dying: its last attempt's lease expires.
    _died_holding(db, _until(engine, "compensate:second", db, run_id), marked=False, attempt=3)

    assert _sweep(db, engine) == 1
    engine.drain([])
    steps = _finally_ran_once(db, run_id, recorder)
    assert steps["compensate:second"]["outcome_code"] == "LEASE_EXPIRED"
    assert steps["compensate:first"]["status"] == "succeeded"
    run = run_row(db, run_id)
    assert run["status"] == "failed" and "step fail failed" in run["error"]


def test_a_finally_step_reclaimed_failed_ends_the_run_failed_saying_which(db: Database) -> None:
    _, engine, run_id = _started(db, [{"id": "a", "type": "test.noop"}])
    _died_holding(db, _until(engine, "finally:summary", db, run_id), marked=True)

    assert _sweep(db, engine) == 1
    engine.drain([])
    run = run_row(db, run_id)
    assert run["status"] == "failed" and run["final_status"] == "succeeded"
    assert "step finally:summary failed (OUTCOME_UNKNOWN)" in run["error"]
    # A failed finally step starts nothing after it, as when its settle failed it.
    assert "finally:notify_rep" not in steps_of(db, run_id)


def test_a_run_without_compensate_or_finally_still_fails_in_the_reclaim_statement(
    db: Database,
) -> None:
    from tests.steps_support import definition

    engine = Engine(db, block_lookup(Recorder()))
    run_id, first = start_run(db, publish_version(db, definition(A_THEN_B)))
    engine.queue.extend(first)
    _died_holding(db, _until(engine, "b", db, run_id), marked=True)
    assert _sweep(db, engine) == 1
    run = run_row(db, run_id)
    assert run["status"] == "failed" and run["phase"] == "main"
    assert run["error"] == "step b failed: OUTCOME_UNKNOWN"
