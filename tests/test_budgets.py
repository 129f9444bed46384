"""Spend budgets: reservations written before the send, checked under the budget's lock, settled
by outcome, and reconciled once after a crash (invariant 16)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm
from shared.blocks import http as http_block
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.gates import budgets
from shared.gates.kind import WorkflowGates
from shared.ops import replay
from shared.providers.hubspot import versions
from shared.steps.advance import advance_step
from shared.steps.gated import open_gates, settle_gates
from shared.steps.repairs import wake_due_steps
from shared.steps.states import StepStatus
from shared.workflows.definition import Budget, WorkflowDefinition
from tests.admission_support import at_barrier
from tests.blocks_support import StepRunner, fake_crm, http_target, seed_connection, seed_tenant
from tests.ops_support import (
    bearer,
    mint,
)
from tests.steps_support import TENANT, definition, publish_version, start_run, steps_of

CAP = Budget(credits=20, per="1d")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with http_target(monkeypatch) as crm:
        yield crm


def _reservations(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT idempotency_key, status, amount, settled_by"
            " FROM budget_reservations ORDER BY id"
        )


def test_fifty_racing_reservations_against_a_cap_of_twenty_admit_exactly_twenty(
    db: Database, database_url: str
) -> None:
    seed_tenant(db)

    def reserve(i: int) -> Callable[[Database], str]:
        def job(own: Database) -> str:
            return own.run(
                lambda tx: (
                    budgets.reserve(
                        tx,
                        budget_key="workflow:race",
                        budget=CAP,
                        amount=1,
                        idempotency_key=f"key-{i}",
                        tenant_id=TENANT,
                        run_id=None,
                        step_id=None,
                    ).status
                )
            )

        return job

    results = at_barrier(database_url, [reserve(i) for i in range(50)])
    assert results.count("reserved") == 20 and results.count("exceeded") == 30
    assert len(_reservations(db)) == 20


def _budget_workflow(url: str) -> WorkflowDefinition:
    return WorkflowDefinition.model_validate(
        {
            "name": "capped",
            "tenant": TENANT,
            "trigger": {"events": ["test.thing.created"]},
            "steps": [{"id": "call", "type": "http.request", "config": {"url": url}}],
            "budget": {"credits": 20, "per": "1d"},
        }
    )


def test_over_the_cap_a_step_fails_budget_exceeded_and_nothing_is_sent(
    db: Database, fake: FakeCrm, client: Any
) -> None:
    seed_tenant(db, credits=1000)
    version = publish_version(db, _budget_workflow(f"{fake.url}/_sink/pay"))
    runs = [start_run(db, version) for _ in range(50)]
    barrier = threading.Barrier(50)
    errors: list[BaseException] = []

    def one(step_id: str) -> None:
        try:
            barrier.wait(timeout=60)
            advance_step(db, step_id, dispatch=lambda ids: None)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(ids[0],)) for _, ids in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    steps = [steps_of(db, run_id)["call"] for run_id, _ in runs]
    assert [s["status"] for s in steps].count("succeeded") == 20
    refused = [s for s in steps if s["status"] == "failed"]
    assert len(refused) == 30
    assert {s["outcome_code"] for s in refused} == {"BUDGET_EXCEEDED"}
    assert len(fake.sink_requests()) == 20  # nothing sent for the 30
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 20  # nor charged
        assert tx.scalar("SELECT credit_balance FROM tenants WHERE id = :t", t=TENANT) == 980
    assert {r["status"] for r in _reservations(db)} == {"spent"}
    assert len(_reservations(db)) == 20
    # Ops shows it (the workflow's active version declares the budget).
    with db.transaction() as tx:
        workflow_id = str(
            tx.scalar("SELECT workflow_id FROM workflow_versions WHERE id = :v", v=version)
        )
        tx.execute(
            "INSERT INTO workflow_activations (workflow_id, version_id) VALUES (:w, :v)",
            w=workflow_id,
            v=version,
        )
    got = client.get(f"/v1/workflows/{workflow_id}/budget", headers=bearer(mint(db, None)))
    assert got.status_code == 200, got.get_json()
    assert got.get_json() == {
        "workflow_id": workflow_id,
        "credits": 20,
        "per": "1d",
        "reserved": 0,
        "spent": 20,
        "released": 0,
    }


def test_settled_by_outcome_spent_released_or_left_reserved(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db, credits=100)
    workflow = WorkflowGates("00000000-0000-0000-0000-0000000000aa", budget=CAP)

    sent = StepRunner(db, "http.request")
    sent.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/a"}, workflow=workflow)

    fake.add_fault(action="rate_limit", path="/_sink")
    refused = StepRunner(db, "http.request")  # 429: provably not applied
    with pytest.raises(Exception, match="429"):
        refused.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/b"}, workflow=workflow)

    fake.add_fault(action="error_500", path="/_sink")
    unknown = StepRunner(db, "http.request")  # 5xx: may have been applied
    with pytest.raises(Exception, match="500"):
        unknown.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/c"}, workflow=workflow)

    status = {r["idempotency_key"]: r["status"] for r in _reservations(db)}
    assert status == {
        sent.idempotency_key: "spent",
        refused.idempotency_key: "released",
        unknown.idempotency_key: "reserved",
    }
    # The retry of the 429 reserves its row again; the retry of the unknown one reuses its own.
    refused.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/b"}, workflow=workflow)
    unknown.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/c"}, workflow=workflow)
    assert {r["status"] for r in _reservations(db)} == {"spent"}
    assert len(_reservations(db)) == 3
    with db.transaction() as tx:
        assert budgets.summary(tx, workflow.workflow_id, CAP) == {
            "reserved": 0,
            "spent": 3,
            "released": 0,
        }


def test_a_crash_between_reserve_and_settle_is_reconciled_once(
    db: Database, database_url: str, fake: FakeCrm
) -> None:
    seed_tenant(db, credits=100)
    workflow = WorkflowGates("00000000-0000-0000-0000-0000000000bb", budget=CAP)
    step = StepRunner(db, "http.request")
    config = http_block.HttpConfig(url=f"{fake.url}/_sink/x")
    ctx = step.context()
    passed = open_gates(http_block.REQUEST, ctx, config, workflow, db=db)
    # ... the process dies here (after the reservation, before any settle). Its re-run
    # reserves the same row, never a second one.
    again = open_gates(http_block.REQUEST, ctx, config, workflow, db=db)
    assert passed.reserved and again.reserved
    assert [r["status"] for r in _reservations(db)] == ["reserved"]
    # The step ended without reporting (the sweep failed it after its last lease expired).
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'failed', finished_at = now(),"
            " outcome_code = 'LEASE_EXPIRED' WHERE id = CAST(:s AS uuid)",
            s=step.step_id,
        )
    # Two sweeps reconcile at once: the row is settled once.
    settled = at_barrier(
        database_url,
        [lambda own: budgets.reconcile(own, older_than_seconds=0)["settled"] for _ in range(2)],
    )
    assert sorted(settled) == [0, 1]
    [row] = _reservations(db)
    assert row["status"] == "spent" and row["settled_by"] == "reconcile"
    # A late settle of the dead attempt changes nothing either.
    settle_gates(ctx, passed, RuntimeError("late"), StepStatus.FAILED, db=db)
    assert [r["status"] for r in _reservations(db)] == ["spent"]


def test_a_rehearsal_reserves_nothing(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db)
    workflow = WorkflowGates("00000000-0000-0000-0000-0000000000cc", budget=CAP)
    StepRunner(db, "http.request").run(
        http_block.REQUEST, {"url": f"{fake.url}/_sink/x"}, dry_run=True, workflow=workflow
    )
    assert _reservations(db) == []


def _wake_retries_and_advance(db: Database) -> None:
    """What time does: the retry wait ends and the sweep wakes the step."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET wake_at = now() - interval '1 second' "
            "WHERE status = 'waiting_for_retry'"
        )
    woken: list[str] = []
    wake_due_steps(db, SweepConfig(), woken.extend, SweepReport())
    for step_id in woken:
        advance_step(db, step_id, dispatch=lambda ids: None)


def test_a_replay_that_sends_again_reserves_against_the_cap(db: Database, fake: FakeCrm) -> None:
    """Issue 23 item 7: a replay used to find its lineage's old reservation (`spent`, or left
    `reserved` by an unknown outcome) and send as `already_reserved` with the cap full."""
    seed_tenant(db, credits=100)
    fake.add_fault(action="error_500", path="/_sink", times=3)  # fate unknown, three times
    wf = _budget_workflow(f"{fake.url}/_sink/pay").model_copy(
        update={"budget": Budget(credits=1, per="1d")}
    )
    version = publish_version(db, wf)
    run_id, [step_id] = start_run(db, version)
    advance_step(db, step_id, dispatch=lambda ids: None)
    for _ in range(2):
        _wake_retries_and_advance(db)
    assert steps_of(db, run_id)["call"]["outcome_code"] == "HTTP_500"
    assert steps_of(db, run_id)["call"]["status"] == "failed"
    # The three attempts of one step hold one reservation, still open (fate unknown).
    assert [r["status"] for r in _reservations(db)] == ["reserved"]

    sent: list[str] = []
    outcome = replay.replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=sent.extend)
    advance_step(db, sent[0], dispatch=lambda ids: None)
    step = steps_of(db, outcome.run_id)["call"]
    assert (step["status"], step["outcome_code"]) == ("failed", "BUDGET_EXCEEDED")
    assert fake.sink_requests() == []  # the replay sent nothing
    # Settled by the reconcile duty, the first step's reservation counts as spent; a second
    # replay is refused as well.
    budgets.reconcile(db, older_than_seconds=0)
    sent.clear()
    again = replay.replay_run(db, run_id=outcome.run_id, tenant_scope=TENANT, dispatch=sent.extend)
    advance_step(db, sent[0], dispatch=lambda ids: None)
    assert steps_of(db, again.run_id)["call"]["outcome_code"] == "BUDGET_EXCEEDED"
    assert fake.sink_requests() == []
    assert [r["status"] for r in _reservations(db)] == ["spent"]


def test_a_replay_under_the_cap_reserves_its_own_row(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db, credits=100)
    fake.add_fault(action="error_500", path="/_sink", times=3)
    version = publish_version(db, _budget_workflow(f"{fake.url}/_sink/pay"))
    run_id, [step_id] = start_run(db, version)
    advance_step(db, step_id, dispatch=lambda ids: None)
    for _ in range(2):
        _wake_retries_and_advance(db)
    sent: list[str] = []
    outcome = replay.replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=sent.extend)
    advance_step(db, sent[0], dispatch=lambda ids: None)
    assert steps_of(db, outcome.run_id)["call"]["status"] == "succeeded"
    budgets.reconcile(db, older_than_seconds=0)
    # Two applications of the lineage (the first may have landed), two reservations.
    assert [r["status"] for r in _reservations(db)] == ["spent", "spent"]
    with db.transaction() as tx:
        workflow_id = str(
            tx.scalar("SELECT workflow_id FROM workflow_versions WHERE id = :v", v=version)
        )
        assert budgets.summary(tx, workflow_id, CAP)["spent"] == 2


@pytest.fixture
def crm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch) as server:
        server.config.unique_properties = {"tasks": ["onceflow_key"]}
        yield server


def _ambiguous_create(db: Database, crm: FakeCrm, *, lands: bool) -> str:
    """A capped crm.create, on a connection with a unique-value key property, whose three
    attempts all end with their fate unknown (the first one's record committed at the provider
    when `lands`); the step fails for good with its reservation left open. The run id."""
    seed_tenant(db)
    connection_id = seed_connection(db, crm.url)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET idempotency_property = 'onceflow_key'"
            " WHERE id = CAST(:c AS uuid)",
            c=connection_id,
        )
    wf = definition(
        [
            {
                "id": "create_task",
                "type": "crm.create",
                "config": {
                    "object_type": "tasks",
                    "connection_id": connection_id,
                    "properties": {
                        "hs_task_subject": "Call Ada",
                        "hs_timestamp": "2026-12-03T09:00:00Z",
                    },
                },
            }
        ]
    ).model_copy(update={"budget": Budget(credits=10, per="1d")})
    version = publish_version(db, wf)
    run_id, [step_id] = start_run(db, version)
    path = versions.crm_objects("tasks") + "$"
    crm.add_fault(action="drop_after_commit" if lands else "reset", method="POST", path=path)
    crm.add_fault(action="reset", method="POST", path=path, times=2)
    advance_step(db, step_id, dispatch=lambda ids: None)
    for _ in range(2):
        _wake_retries_and_advance(db)
    assert steps_of(db, run_id)["create_task"]["status"] == "failed"
    assert len(crm.records("tasks")) == (1 if lands else 0)
    assert [r["status"] for r in _reservations(db)] == ["reserved"]
    return run_id


def test_an_ambiguous_create_that_never_landed_is_released_by_asking_the_provider(
    db: Database, crm: FakeCrm
) -> None:
    """Issue 23 item 16: a reservation left ambiguous used to be counted spent always. Where the
    provider can be asked (a create stamped with a unique key property), the reconcile asks:
    never landed ⇒ released."""
    _ambiguous_create(db, crm, lands=False)
    assert budgets.reconcile(db, older_than_seconds=0)["settled"] == 1
    [row] = _reservations(db)
    assert (row["status"], row["settled_by"]) == ("released", "reconcile")


def test_an_ambiguous_create_that_landed_is_counted_spent_by_asking_the_provider(
    db: Database, crm: FakeCrm
) -> None:
    _ambiguous_create(db, crm, lands=True)
    assert budgets.reconcile(db, older_than_seconds=0)["settled"] == 1
    [row] = _reservations(db)
    assert (row["status"], row["settled_by"]) == ("spent", "reconcile")
    assert budgets.reconcile(db, older_than_seconds=0)["settled"] == 0  # once
