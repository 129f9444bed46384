"""`finally:` (issue 30, item 6): a workflow's finally steps run, through the real step engine,
once whatever the run's end — succeeded, failed (after its compensations) or cancelled — and
the run then ends as its main phase decided (or failed when a finally step failed)."""

from __future__ import annotations

import threading
from typing import Any

from shared.blocks.base import BlockContext, BlockResult
from shared.core.db import Database
from shared.ops.api.runs import run_detail
from shared.steps.advance import Advanced
from shared.steps.cancel import cancel_run
from shared.sweep.loop import run_sweep
from shared.workflows.definition import WorkflowDefinition
from tests.ops_support import Dispatched, bearer, mint
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.steps_support import TENANT, publish_version, run_row, start_run, steps_of
from tests.test_compensate import Engine
from tests.test_steps_engine import make_past


def _definition(steps: list[dict[str, Any]], final: list[dict[str, Any]]) -> WorkflowDefinition:
    return WorkflowDefinition.model_validate(
        {
            "name": "wf",
            "tenant": TENANT,
            "trigger": {"events": ["test.thing.created"]},
            "steps": steps,
            "finally": final,
        }
    )


# Two finally steps chained by `next`: a summary, then the rep's notification.
FINAL = [
    {"id": "summary", "type": "test.noop", "next": "notify_rep"},
    {"id": "notify_rep", "type": "test.noop"},
]


def _finally_ran_once(db: Database, run_id: str, recorder: Recorder) -> dict[str, Any]:
    steps = steps_of(db, run_id)
    for sid in ("summary", "notify_rep"):
        row = steps[f"finally:{sid}"]
        assert row["status"] == "succeeded", row["error"]
        assert row["idempotency_key"] == f"onceflow:{run_id}:finally:{sid}"
        assert recorder.count(f"finally:{sid}") == 1
    return steps


def test_finally_runs_once_after_a_success_even_when_every_message_is_delivered_again(
    db: Database,
) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        _definition(
            [{"id": "a", "type": "test.noop", "next": "b"}, {"id": "b", "type": "test.noop"}], FINAL
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    _finally_ran_once(db, run_id, recorder)
    run = run_row(db, run_id)
    assert run["status"] == "succeeded" and run["phase"] == "finally"
    assert run["final_status"] == "succeeded" and run["error"] is None
    # Pub/Sub delivers every message again: nothing runs twice.
    for step_id in list(engine.published):
        assert not engine.advance(step_id).claimed
    _finally_ran_once(db, run_id, recorder)
    detail = run_detail(db, run_id, None)
    assert detail.phase == "finally" and detail.run.status == "succeeded"
    assert [s.step_key for s in detail.steps if s.step_key.startswith("finally:")] == [
        "finally:summary",
        "finally:notify_rep",
    ]


def test_finally_runs_after_a_failure_and_its_compensations_and_the_run_stays_failed(
    db: Database,
) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        _definition(
            [
                {
                    "id": "done_first",
                    "type": "test.noop",
                    "compensate": {"type": "test.noop"},
                    "next": "fail",
                },
                {"id": "fail", "type": "test.fail_permanent"},
            ],
            FINAL,
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    steps = _finally_ran_once(db, run_id, recorder)
    # The undo ran before the finally steps.
    assert steps["compensate:done_first"]["status"] == "succeeded"
    assert steps["compensate:done_first"]["finished_at"] <= steps["finally:summary"]["created_at"]
    run = run_row(db, run_id)
    assert run["status"] == "failed" and run["final_status"] == "failed"
    assert "step fail failed" in run["error"]


def test_finally_runs_after_a_failure_without_compensations(db: Database) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db, _definition([{"id": "fail", "type": "test.fail_permanent"}], FINAL)
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    _finally_ran_once(db, run_id, recorder)
    assert run_row(db, run_id)["status"] == "failed"


def test_finally_runs_once_after_a_cancel_and_a_second_cancel_is_refused(db: Database) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        _definition(
            [
                {"id": "a", "type": "test.noop", "next": "wait"},
                {"id": "wait", "type": "delay", "config": {"minutes": 30}, "next": "never"},
                {"id": "never", "type": "test.noop"},
            ],
            FINAL,
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    assert steps_of(db, run_id)["wait"]["status"] == "waiting_for_delay"
    cancelled = cancel_run(db, run_id, by="alice", reason="deal lost", dispatch=engine.dispatch)
    assert cancelled is not None and cancelled.moved and cancelled.phase == "finally"
    assert cancelled.skipped_steps == ("wait",)
    # While its finally steps run, a cancel is refused with the reason (a 409 in the API).
    again = cancel_run(db, run_id, by="bob", reason="again")
    assert again is not None and not again.moved
    assert again.why_not is not None and "finally steps" in again.why_not
    engine.drain([])
    _finally_ran_once(db, run_id, recorder)
    assert recorder.count("never") == 0
    run = run_row(db, run_id)
    assert run["status"] == "cancelled" and run["final_status"] == "cancelled"
    assert run["cancelled_by"] == "alice"
    for step_id in list(engine.published):
        assert not engine.advance(step_id).claimed
    _finally_ran_once(db, run_id, recorder)


def test_a_wait_inside_finally_parks_and_resumes(db: Database) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        _definition(
            [{"id": "a", "type": "test.noop"}],
            [
                {
                    "id": "cool_off",
                    "type": "delay",
                    "config": {"minutes": 30},
                    "next": "notify_rep",
                },
                {"id": "notify_rep", "type": "test.noop"},
            ],
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    assert steps_of(db, run_id)["finally:cool_off"]["status"] == "waiting_for_delay"
    run = run_row(db, run_id)
    assert run["status"] == "running" and run["phase"] == "finally"
    make_past(db, run_id)
    assert run_sweep(db, 0, duties=[], dispatch=engine.dispatch).woken == 1
    engine.drain([])
    steps = steps_of(db, run_id)
    assert steps["finally:cool_off"]["status"] == "succeeded"
    assert steps["finally:notify_rep"]["status"] == "succeeded"
    assert recorder.count("finally:notify_rep") == 1
    assert run_row(db, run_id)["status"] == "succeeded"


def test_a_failed_finally_step_fails_a_run_that_succeeded_and_says_so(db: Database) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        _definition(
            [{"id": "a", "type": "test.noop"}],
            [
                {"id": "summary", "type": "test.fail_permanent", "next": "notify_rep"},
                {"id": "notify_rep", "type": "test.noop"},
            ],
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    run = run_row(db, run_id)
    assert run["status"] == "failed" and run["final_status"] == "succeeded"
    assert "step finally:summary failed" in run["error"]
    assert "finally:notify_rep" not in steps_of(db, run_id)


def test_finally_steps_read_how_the_run_ended(db: Database) -> None:
    """`run.final_status` and `run.error` in a finally step's config: succeeded with no error,
    failed with the failing step's error, cancelled with who and why."""

    def echo(ctx: BlockContext, config: Any) -> BlockResult:
        return BlockResult(output=config.model_dump())

    engine = Engine(db, block_lookup(Recorder(), **{"test.echo": spec("test.echo", echo)}))
    said = [
        {
            "id": "say",
            "type": "test.echo",
            "config": {"status": "${{ run.final_status }}", "why": "${{ run.error }}"},
        }
    ]
    ends = {
        "succeeded": [{"id": "a", "type": "test.noop"}],
        "failed": [{"id": "a", "type": "test.fail_permanent"}],
        "cancelled": [{"id": "a", "type": "delay", "config": {"minutes": 30}}],
    }
    seen: dict[str, Any] = {}
    for end, steps in ends.items():
        run_id, first = start_run(db, publish_version(db, _definition(steps, said)))
        engine.drain(first)
        if end == "cancelled":
            cancel_run(db, run_id, by="alice", reason="deal lost", dispatch=engine.dispatch)
            engine.drain([])
        assert run_row(db, run_id)["status"] == end
        seen[end] = steps_of(db, run_id)["finally:say"]["output"]
    assert seen["succeeded"] == {"status": "succeeded", "why": None}
    assert seen["failed"]["status"] == "failed"
    assert seen["failed"]["why"].startswith("step a failed (HTTP_400)")
    assert seen["cancelled"] == {"status": "cancelled", "why": "cancelled by alice: deal lost"}


def test_a_finally_step_reads_the_output_of_the_finally_step_before_it(db: Database) -> None:
    def echo(ctx: BlockContext, config: Any) -> BlockResult:
        return BlockResult(output=config.model_dump())

    engine = Engine(db, block_lookup(Recorder(), **{"test.echo": spec("test.echo", echo)}))
    final = [
        {"id": "summary", "type": "test.echo", "config": {"text": "3 tasks"}, "next": "tell"},
        {
            "id": "tell",
            "type": "test.echo",
            "config": {"heard": "${{ steps.summary.output.text }}", "a": "${{ steps.a.output }}"},
        },
    ]
    run_id, first = start_run(
        db, publish_version(db, _definition([{"id": "a", "type": "test.noop"}], final))
    )
    engine.drain(first)
    said = steps_of(db, run_id)["finally:tell"]["output"]
    assert said["heard"] == "3 tasks"
    assert said["a"] == {"step": "a", "attempt": 1}  # the main step's, by its id as before


def test_a_cancel_racing_the_last_main_settle_at_a_barrier_runs_finally_exactly_once(
    db: Database,
) -> None:
    """Either the settle decides (succeeded; the cancel is refused: the run is in its finally
    phase) or the cancel does (cancelled; the settle creates nothing): the finally steps run
    once either way, and the run ends as the winner decided."""
    barrier = threading.Barrier(2)
    recorder = Recorder()

    def last_at_the_barrier(ctx: BlockContext, config: object) -> BlockResult:
        barrier.wait()
        return BlockResult(output={"ok": True})

    engine = Engine(
        db,
        block_lookup(recorder, **{"test.race_last": spec("test.race_last", last_at_the_barrier)}),
    )
    version = publish_version(db, _definition([{"id": "last", "type": "test.race_last"}], FINAL))
    run_id, first = start_run(db, version)
    settled: list[Advanced] = []
    advancing = threading.Thread(target=lambda: settled.append(engine.advance(first[0])))
    advancing.start()
    barrier.wait()
    cancelled = cancel_run(db, run_id, by="alice", reason="stop", dispatch=engine.dispatch)
    advancing.join(30)
    assert cancelled is not None and settled
    engine.drain([])
    _finally_ran_once(db, run_id, recorder)
    run = run_row(db, run_id)
    assert steps_of(db, run_id)["last"]["status"] == "succeeded"
    if cancelled.moved:
        assert run["status"] == "cancelled" and run["final_status"] == "cancelled"
    else:
        assert "finally steps" in (cancelled.why_not or "")
        assert run["status"] == "succeeded" and run["final_status"] == "succeeded"


def test_a_replay_of_a_run_that_ran_finally_copies_no_finally_step_and_runs_them_at_its_end(
    db: Database,
) -> None:
    from shared.ops.replay import replay_run

    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        _definition(
            [
                {"id": "a", "type": "test.noop", "next": "fail"},
                {"id": "fail", "type": "test.fail_permanent"},
            ],
            FINAL,
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    assert run_row(db, run_id)["status"] == "failed"

    replayed = replay_run(db, run_id=run_id, tenant_scope=None, dispatch=engine.dispatch)
    assert [s.step_key for s in replayed.plan.copy] == ["a"]
    assert [s.step_key for s in replayed.plan.restart] == ["fail"]
    engine.drain([])
    steps = steps_of(db, replayed.run_id)
    # The replay ends like any run: its own finally steps, once, after its failure.
    assert steps["finally:summary"]["status"] == "succeeded"
    assert steps["finally:notify_rep"]["status"] == "succeeded"
    assert run_row(db, replayed.run_id)["status"] == "failed"
    assert recorder.count("finally:summary") == 2  # the run's, then the replay's


def test_the_ops_api_cancels_into_the_finally_phase_then_answers_409_with_the_reason(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        _definition(
            [
                {"id": "wait", "type": "delay", "config": {"minutes": 30}, "next": "never"},
                {"id": "never", "type": "test.noop"},
            ],
            FINAL,
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    token = mint(db, TENANT, label="carol")
    url = f"/v1/runs/{run_id}/cancel"
    done = client.post(url, json={"reason": "deal lost"}, headers=bearer(token))
    assert done.status_code == 200, done.get_json()
    body = done.get_json()
    assert body["skipped_steps"] == ["wait"]
    assert body["run"]["status"] == "running" and body["run"]["cancelled_by"] == "carol"
    # The first finally step, published after the cancel committed.
    assert dispatched.ids == [steps_of(db, run_id)["finally:summary"]["id"]]
    again = client.post(url, json={"reason": "me too"}, headers=bearer(token))
    assert again.status_code == 409 and again.get_json()["code"] == "run_not_running"
    assert "running its finally steps" in again.get_json()["message"]
    shown = client.get(f"/v1/runs/{run_id}", headers=bearer(token)).get_json()
    assert (shown["phase"], shown["final_status"]) == ("finally", "cancelled")
    engine.drain(dispatched.ids)
    _finally_ran_once(db, run_id, recorder)
    assert run_row(db, run_id)["status"] == "cancelled"
