"""Undo (issue 30, item 6): a step's `compensate:` runs, through the real step engine, when its
run fails after it succeeded — once, in reverse order, under its own idempotency key — against
the fake CRM over real HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm
from shared.blocks.base import BlockContext, BlockFailure, BlockResult, BlockSpec
from shared.core.crashpoints import EXIT_CODE
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ops.api.runs import run_detail
from shared.steps import repairs
from shared.steps.advance import Advanced, advance_step
from shared.steps.cancel import cancel_run
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.steps_support import definition, publish_version, run_row, start_run, steps_of


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch) as server:
        yield server


def _create_task(connection_id: str, subject: str, nxt: str) -> dict[str, Any]:
    """A step that creates a CRM task and, as its undo, marks that very task cancelled (the
    undo reads the step's own output: the id the CRM gave)."""
    sid = subject.lower().replace(" ", "_")
    return {
        "id": sid,
        "type": "crm.create",
        "config": {
            "object_type": "tasks",
            "connection_id": connection_id,
            "properties": {"hs_task_subject": subject, "hs_timestamp": "2026-12-03T10:00:00Z"},
        },
        "compensate": {
            "type": "crm.update",
            "config": {
                "object_type": "tasks",
                "connection_id": connection_id,
                "object_id": "${{ steps." + sid + ".output.id }}",
                "properties": {"hs_task_subject": "CANCELLED: " + subject},
            },
        },
        "next": nxt,
    }


class Engine:
    """Delivers step-ready messages the way Pub/Sub would (each published id once, in order),
    and remembers every id ever published so a test can deliver one again."""

    def __init__(self, db: Database, lookup: Callable[[str], BlockSpec]) -> None:
        self.db, self.lookup = db, lookup
        self.queue: deque[str] = deque()
        self.published: list[str] = []

    def dispatch(self, ids: Sequence[str]) -> None:
        self.queue.extend(ids)
        self.published.extend(ids)

    def advance(self, step_id: str) -> Advanced:
        return advance_step(self.db, step_id, lookup=self.lookup, dispatch=self.dispatch)

    def drain(self, first: Sequence[str]) -> None:
        self.queue.extend(first)
        while self.queue:
            self.advance(self.queue.popleft())


def _patches(fake: FakeCrm) -> list[dict[str, Any]]:
    return [r for r in fake.state()["requests"] if r["method"] == "PATCH"]


def test_a_failed_run_undoes_the_task_its_first_step_created_once_even_when_redelivered(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    engine = Engine(db, block_lookup(Recorder()))
    version = publish_version(
        db,
        definition(
            [
                _create_task(connection_id, "Call Ada", "fail"),
                {"id": "fail", "type": "test.fail_permanent"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)

    steps = steps_of(db, run_id)
    assert steps["fail"]["status"] == "failed"
    undo = steps["compensate:call_ada"]
    assert undo["status"] == "succeeded", undo["error"]
    assert undo["block_type"] == "crm.update"
    # Its own idempotency key, not the step's it undoes.
    assert undo["idempotency_key"] == f"onceflow:{run_id}:compensate:call_ada"
    assert undo["idempotency_key"] != steps["call_ada"]["idempotency_key"]
    [task] = fake.records("tasks")
    assert task["properties"]["hs_task_subject"] == "CANCELLED: Call Ada"
    run = run_row(db, run_id)
    assert run["status"] == "failed" and run["phase"] == "compensating"
    assert "step fail failed (HTTP_400)" in run["error"]

    # Pub/Sub delivers the compensation's message again, and every other one too: nothing
    # runs twice, the task is corrected exactly once.
    for step_id in list(engine.published):
        assert not engine.advance(step_id).claimed
    assert len(_patches(fake)) == 1
    assert run_row(db, run_id)["status"] == "failed"

    # The run API (GET /v1/runs/{id}) shows the phase and the undo with its outcome.
    detail = run_detail(db, run_id, None)
    assert detail.phase == "compensating" and detail.run.status == "failed"
    [shown] = [s for s in detail.steps if s.step_key == "compensate:call_ada"]
    assert shown.status == "succeeded" and shown.block_type == "crm.update"
    assert shown.input is not None and shown.input["object_id"] == task["id"]


def test_compensations_run_in_reverse_order_of_success_and_a_failed_one_does_not_stop_the_rest(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        definition(
            [
                _create_task(connection_id, "First", "middle"),
                # An undo that fails permanently: recorded, and the next undo still runs.
                {
                    "id": "middle",
                    "type": "test.noop",
                    "compensate": {"type": "test.fail_permanent"},
                    "next": "second",
                },
                _create_task(connection_id, "Second", "fail"),
                {"id": "fail", "type": "test.fail_permanent"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)

    steps = steps_of(db, run_id)
    undone = sorted(
        (s for k, s in steps.items() if k.startswith("compensate:")),
        key=lambda s: s["started_at"],
    )
    assert [s["step_key"] for s in undone] == [
        "compensate:second",
        "compensate:middle",
        "compensate:first",
    ]
    assert [s["status"] for s in undone] == ["succeeded", "failed", "succeeded"]
    assert undone[1]["outcome_code"] == "HTTP_400"
    subjects = sorted(t["properties"]["hs_task_subject"] for t in fake.records("tasks"))
    assert subjects == ["CANCELLED: First", "CANCELLED: Second"]
    assert recorder.count("compensate:middle") == 1
    # The run ends failed with the original error; each undo's outcome is on its row.
    run = run_row(db, run_id)
    assert run["status"] == "failed" and "step fail failed" in run["error"]


def test_a_run_that_succeeds_runs_no_compensation(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    engine = Engine(db, block_lookup(Recorder()))
    version = publish_version(
        db,
        definition(
            [_create_task(connection_id, "Call Ada", "done"), {"id": "done", "type": "test.noop"}]
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    assert run_row(db, run_id)["status"] == "succeeded"
    assert not [k for k in steps_of(db, run_id) if k.startswith("compensate:")]
    assert _patches(fake) == []


def test_a_cancel_racing_the_failing_settle_at_a_barrier_stops_the_run_or_lets_the_undo_end(
    db: Database,
) -> None:
    """Exactly one of them decides the run: the cancel (cancelled, nothing undone: a cancel
    doesn't compensate) or the failure (compensating; the cancel is refused with the reason and
    the undo runs to the end, the run failed). Never both, never a compensation cut short."""
    barrier = threading.Barrier(2)
    recorder = Recorder()

    def fails_at_the_barrier(ctx: BlockContext, config: object) -> BlockResult:
        barrier.wait()
        raise BlockFailure("bad request", error_class="permanent", outcome_code="HTTP_400")

    engine = Engine(
        db,
        block_lookup(recorder, **{"test.race_fail": spec("test.race_fail", fails_at_the_barrier)}),
    )
    version = publish_version(
        db,
        definition(
            [
                {
                    "id": "done_first",
                    "type": "test.noop",
                    "compensate": {"type": "test.noop"},
                    "next": "fail",
                },
                {"id": "fail", "type": "test.race_fail"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    engine.advance(first[0])
    [fail_id] = list(engine.queue)
    engine.queue.clear()
    settled: list[Advanced] = []
    advancing = threading.Thread(target=lambda: settled.append(engine.advance(fail_id)))
    advancing.start()
    barrier.wait()
    cancelled = cancel_run(db, run_id, by="alice", reason="stop")
    advancing.join(30)
    assert cancelled is not None and settled
    engine.drain([])
    run, steps = run_row(db, run_id), steps_of(db, run_id)
    assert steps["fail"]["status"] == "failed"
    if cancelled.moved:
        assert run["status"] == "cancelled" and run["phase"] == "main"
        assert "compensate:done_first" not in steps
        assert recorder.count("compensate:done_first") == 0
    else:
        assert cancelled.status == "running" and cancelled.phase == "compensating"
        assert "compensations" in (cancelled.why_not or "")
        assert run["status"] == "failed"
        assert steps["compensate:done_first"]["status"] == "succeeded"
        assert recorder.count("compensate:done_first") == 1


def test_a_cancel_of_a_compensating_run_is_refused_and_the_undo_finishes(db: Database) -> None:
    recorder = Recorder()
    engine = Engine(db, block_lookup(recorder))
    version = publish_version(
        db,
        definition(
            [
                {
                    "id": "done_first",
                    "type": "test.noop",
                    "compensate": {"type": "test.noop"},
                    "next": "fail",
                },
                {"id": "fail", "type": "test.fail_permanent"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    engine.advance(first[0])
    engine.advance(engine.queue.popleft())  # fails: the compensation is created, pending
    assert run_row(db, run_id)["phase"] == "compensating"
    assert steps_of(db, run_id)["compensate:done_first"]["status"] == "pending"

    refused = cancel_run(db, run_id, by="alice", reason="stop")
    assert refused is not None and not refused.moved
    assert refused.why_not is not None and "running its compensations" in refused.why_not
    engine.drain([])
    assert run_row(db, run_id)["status"] == "failed"
    assert steps_of(db, run_id)["compensate:done_first"]["status"] == "succeeded"
    assert recorder.count("compensate:done_first") == 1


CHILD = (
    "import sys\n"
    "from shared.core.db import get_database\n"
    "from shared.steps.advance import advance_step\n"
    "advance_step(get_database(), sys.argv[1], dispatch=lambda ids: None)\n"
)
LEASE = {"ONCEFLOW_STEP_LEASE_SECONDS": "1.5", "ONCEFLOW_STEP_HEARTBEAT_SECONDS": "0.5"}


def test_a_compensation_killed_after_its_call_is_reclaimed_and_settles_once(
    db: Database, database_url: str, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process running the undo dies after the CRM applied it and before the settle
    committed (crash point before_settle_commit, exit 137): the sweep reclaims the expired
    lease, the undo runs again under the same idempotency key (crm.update is idempotent: the
    same write, the same result), and its row settles once; the run then ends failed."""
    for name, value in LEASE.items():
        monkeypatch.setenv(name, value)
    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    engine = Engine(db, block_lookup(Recorder()))
    version = publish_version(
        db,
        definition(
            [
                _create_task(connection_id, "Call Ada", "fail"),
                {
                    # A catalog block that fails for good: the record does not exist (404).
                    "id": "fail",
                    "type": "crm.update",
                    "config": {
                        "object_type": "tasks",
                        "connection_id": connection_id,
                        "object_id": "404404404",
                        "properties": {"hs_task_subject": "x"},
                    },
                },
            ]
        ),
    )
    run_id, first = start_run(db, version)
    engine.advance(first[0])
    engine.advance(engine.queue.popleft())
    assert steps_of(db, run_id)["fail"]["status"] == "failed"
    [undo_id] = list(engine.queue)
    engine.queue.clear()

    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS="before_settle_commit",
        **LEASE,
    )
    child = subprocess.run(
        [sys.executable, "-c", CHILD, undo_id],
        check=False,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == EXIT_CODE, child.stderr[-2000:]
    assert steps_of(db, run_id)["compensate:call_ada"]["status"] == "running"
    assert len(_patches(fake)) == 2  # the failing update, and the undo that landed

    config = SweepConfig.from_env()
    deadline = time.monotonic() + 20
    while steps_of(db, run_id)["compensate:call_ada"]["status"] == "running":
        assert time.monotonic() < deadline, "the expired lease was never reclaimed"
        time.sleep(0.3)
        repairs.reclaim_expired_leases(db, config, engine.dispatch, SweepReport())
    engine.drain([])
    engine.advance(undo_id)  # and Pub/Sub's late redelivery of the first message

    undo = steps_of(db, run_id)["compensate:call_ada"]
    assert undo["status"] == "succeeded" and undo["attempt"] == 2
    [task] = fake.records("tasks")
    assert task["properties"]["hs_task_subject"] == "CANCELLED: Call Ada"
    undo_calls = [p for p in _patches(fake) if task["id"] in p["path"]]
    assert len(undo_calls) == 2  # sent again after the crash: at least once, idempotent
    assert run_row(db, run_id)["status"] == "failed"


def test_a_replay_of_a_compensated_run_does_the_undone_step_again_and_copies_no_undo(
    db: Database, fake: FakeCrm
) -> None:
    from shared.ops.replay import replay_run

    seed_tenant(db)
    connection_id = seed_connection(db, fake.url)
    engine = Engine(db, block_lookup(Recorder()))
    version = publish_version(
        db,
        definition(
            [
                _create_task(connection_id, "Call Ada", "fail"),
                {"id": "fail", "type": "test.fail_permanent"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    engine.drain(first)
    assert run_row(db, run_id)["status"] == "failed"

    replayed = replay_run(db, run_id=run_id, tenant_scope=None, dispatch=engine.dispatch)
    assert [s.step_key for s in replayed.plan.restart] == ["call_ada"]
    assert replayed.plan.copy == ()
    engine.drain([])
    steps = steps_of(db, replayed.run_id)
    # The task was created again (its first one was undone), the failure undid it again.
    assert steps["call_ada"]["status"] == "succeeded"
    assert steps["compensate:call_ada"]["status"] == "succeeded"
    assert steps["compensate:call_ada"]["idempotency_key"] == (
        f"onceflow:{run_id}:compensate:call_ada"
    )
    subjects = [t["properties"]["hs_task_subject"] for t in fake.records("tasks")]
    assert subjects == ["CANCELLED: Call Ada", "CANCELLED: Call Ada"]
    assert run_row(db, replayed.run_id)["status"] == "failed"
