"""Gates run by the step executor, not by blocks: workflow and host rate limits through
`advance_step` racing at a barrier, refunds of calls that provably never applied (once), and
the registry refusing a spec that would skip a gate."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from devstack.fakecrm import FakeCrm
from shared.blocks import http as http_block
from shared.blocks.base import BlockContext, BlockResult, BlockSpec, Gate, RetryPolicy
from shared.blocks.registry import RegistryError, check_spec
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.gates import credits
from shared.gates.catalog import GATES
from shared.gates.limit_queue import grant_due_limits
from shared.ops import replay
from shared.ops.api.runs import run_detail
from shared.steps.advance import advance_step
from shared.steps.repairs import reclaim_expired_leases, wake_due_steps
from shared.workflows.definition import WorkflowDefinition
from tests.blocks_support import StepRunner, http_target, seed_tenant
from tests.steps_support import TENANT, publish_version, start_run, steps_of


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with http_target(monkeypatch) as crm:
        yield crm


def _http_workflow(url: str, **limits: Any) -> WorkflowDefinition:
    return WorkflowDefinition.model_validate(
        {
            "name": "notify",
            "tenant": TENANT,
            "trigger": {"events": ["test.thing.created"]},
            "steps": [{"id": "call", "type": "http.request", "config": {"url": url}}],
            **limits,
        }
    )


def _advance_together(db: Database, step_ids: list[str]) -> None:
    barrier = threading.Barrier(len(step_ids))
    errors: list[BaseException] = []

    def one(step_id: str) -> None:
        try:
            barrier.wait()
            advance_step(db, step_id, dispatch=lambda ids: None)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in step_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _steps(db: Database, run_ids: list[str]) -> list[dict[str, Any]]:
    return [steps_of(db, r)["call"] for r in run_ids]


def _window_ends_and_parked_steps_wake(db: Database) -> list[str]:
    """What time does in production, done by hand: the window ends (its row is gone, as after
    the boundary), the sweep wakes the parked steps whose retry time came, and serves each
    limit's line (shared/gates/limit_queue.py): the steps waiting in one are granted the new
    window's slots, in their order."""
    with db.transaction() as tx:
        tx.execute("DELETE FROM throttle_windows")
        tx.execute(
            "UPDATE workflow_steps SET wake_at = now() - interval '1 second' "
            "WHERE status = 'waiting_for_retry' AND limit_wait IS NULL"
        )
        tx.execute("UPDATE limit_queues SET due_at = now() - interval '1 second'")
    woken: list[str] = []
    wake_due_steps(db, SweepConfig(), woken.extend, SweepReport())
    grant_due_limits(db, SweepConfig(), woken.extend, SweepReport())
    return woken


def test_workflow_rate_limit_admits_max_per_window_and_parks_the_rest_until_later(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db, credits=100)
    version = publish_version(
        db, _http_workflow(f"{fake.url}/_sink/hook", rate_limit={"max": 3, "per": "1h"})
    )
    runs = [start_run(db, version) for _ in range(8)]
    run_ids = [r for r, _ in runs]
    _advance_together(db, [ids[0] for _, ids in runs])

    steps = _steps(db, run_ids)
    assert sorted(s["status"] for s in steps).count("succeeded") == 3
    parked = [s for s in steps if s["status"] == "waiting_for_retry"]
    assert len(parked) == 5
    for s in parked:
        assert s["outcome_code"] == "THROTTLED" and s["attempt"] == 0  # no attempt used
        assert s["error"].startswith("throttled until ") and "by workflow limit" in s["error"]
    assert len(fake.sink_requests()) == 3
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 3  # throttled: no charge

    # The next windows run the rest, max at a time.
    for expected_done in (6, 8):
        _advance_together(db, _window_ends_and_parked_steps_wake(db))
        done = [s for s in _steps(db, run_ids) if s["status"] == "succeeded"]
        assert len(done) == expected_done
    assert len(fake.sink_requests()) == 8


def test_host_rate_limit_counts_calls_to_one_host(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db, credits=100)
    version = publish_version(
        db, _http_workflow(f"{fake.url}/_sink/hook", host_rate_limit={"max": 2, "per": "1h"})
    )
    runs = [start_run(db, version) for _ in range(4)]
    _advance_together(db, [ids[0] for _, ids in runs])
    steps = _steps(db, [r for r, _ in runs])
    assert [s["status"] for s in steps].count("succeeded") == 2
    throttled = [s for s in steps if s["outcome_code"] == "THROTTLED"]
    assert len(throttled) == 2 and all("by host limit" in s["error"] for s in throttled)
    with db.transaction() as tx:
        subject = tx.scalar("SELECT subject FROM throttle_windows WHERE scope = 'host'")
    assert subject == f"{TENANT}|127.0.0.1"


def test_a_rehearsal_takes_no_slot_and_no_credit(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db, credits=100)
    version = publish_version(
        db, _http_workflow(f"{fake.url}/_sink/hook", rate_limit={"max": 1, "per": "1h"})
    )
    run_id, [step_id] = start_run(db, version, namespace="rehearsal")
    advance_step(db, step_id, dispatch=lambda ids: None, namespace="rehearsal")
    assert steps_of(db, run_id)["call"]["status"] == "succeeded"
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM throttle_windows") == 0
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 0
    assert fake.sink_requests() == []


def _balance(db: Database) -> int:
    with db.transaction() as tx:
        return int(tx.scalar("SELECT credit_balance FROM tenants WHERE id = :t", t=TENANT))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_that_fails_for_good_is_refunded_once(
    db: Database, fake: FakeCrm
) -> None:
    seed_tenant(db, credits=10)
    version = publish_version(db, _http_workflow(f"http://127.0.0.1:{_closed_port()}/hook"))
    run_id, [step_id] = start_run(db, version)
    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["call"]
    assert step["status"] == "waiting_for_retry"
    assert step["outcome_code"] == "HTTP_CONNECTION_ERROR"
    assert _balance(db) == 9  # charged; the retry uses the same charge
    for _ in range(2):
        for woken in _window_ends_and_parked_steps_wake(db):
            advance_step(db, woken, dispatch=lambda ids: None)
    assert steps_of(db, run_id)["call"]["status"] == "failed"
    assert _balance(db) == 10  # refunded
    with db.transaction() as tx:
        rows = tx.all("SELECT amount, reason FROM credit_refunds")
    assert [(r["amount"], r["reason"]) for r in rows] == [(1, "not applied: HTTP_CONNECTION_ERROR")]
    # The run detail shows the charge with its refund.
    [charge] = run_detail(db, run_id, None).charges
    assert charge.amount == 1 and charge.refunded == 1
    assert charge.refund_reason == "not applied: HTTP_CONNECTION_ERROR"


def test_a_refund_is_never_paid_twice_under_racing_settles(db: Database, fake: FakeCrm) -> None:
    """A redelivered or replayed settle of the same charge, eight at once: one refund row,
    one credit back."""
    seed_tenant(db, credits=5)
    step = StepRunner(db, "http.request")
    step.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    assert _balance(db) == 4
    barrier = threading.Barrier(8)
    paid: list[int] = []

    def settle() -> None:
        barrier.wait()
        paid.append(
            db.run(
                lambda tx: credits.refund(
                    tx, lineage_key=step.idempotency_key, reason="test", step_id=step.step_id
                )
            )
        )

    threads = [threading.Thread(target=settle) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(paid) == [0] * 7 + [1]
    assert _balance(db) == 5


def test_a_refusal_before_the_request_left_is_refunded_and_an_unknown_outcome_never(
    db: Database, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GONE_SECRET", raising=False)
    seed_tenant(db, credits=10, signing_secret_env="GONE_SECRET")
    refused = StepRunner(db, "http.request")
    with pytest.raises(Exception, match="GONE_SECRET"):
        refused.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    assert _balance(db) == 10 and fake.sink_requests() == []

    seed_tenant(db, credits=10)
    fake.add_fault(action="error_500", path="/_sink")
    unknown = StepRunner(db, "http.request")
    with pytest.raises(Exception, match="500"):
        unknown.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    # The 500 may have been applied: later proof that an attempt never left refunds nothing.
    with db.transaction() as tx:
        assert (
            credits.refund(tx, lineage_key=unknown.idempotency_key, reason="test", step_id=None)
            == 0
        )
    assert _balance(db) == 9


def test_a_forbidden_destination_is_refused_before_any_gate(db: Database) -> None:
    seed_tenant(db, credits=10)
    step = StepRunner(db, "http.request")
    with pytest.raises(Exception) as err:
        step.run(http_block.REQUEST, {"url": "http://169.254.169.254/latest"})
    assert getattr(err.value, "outcome_code", None) == "SSRF_BLOCKED"
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 0
        assert tx.scalar("SELECT count(*) FROM throttle_windows") == 0


def _noop(ctx: BlockContext, config: BaseModel) -> BlockResult:
    return BlockResult()


def test_the_registry_refuses_a_priced_block_without_the_charge_gate() -> None:
    base = BlockSpec(
        type_name="x.priced",
        config_model=BaseModel,
        kind="action",
        side_effect="idempotent",
        price=1,
        retry=RetryPolicy(),
        execute=_noop,
    )
    with pytest.raises(RegistryError, match="charge gate"):
        check_spec(base)
    with pytest.raises(RegistryError, match="no target"):
        check_spec(
            BlockSpec(**{**base.__dict__, "gates": frozenset({Gate.CHARGE, Gate.CONNECTION_LIMIT})})
        )
    check_spec(BlockSpec(**{**base.__dict__, "gates": frozenset({Gate.CHARGE})}))


def _drive_until_settled_for_good(db: Database, step_id: str) -> None:
    """Advance a step, waking its retries as time would, until it no longer waits to retry."""
    advance_step(db, step_id, dispatch=lambda ids: None)
    while True:
        woken = _window_ends_and_parked_steps_wake(db)
        if not woken:
            return
        for s in woken:
            advance_step(db, s, dispatch=lambda ids: None)


def _unrefunded_charges(db: Database) -> int:
    with db.transaction() as tx:
        return int(
            tx.scalar(
                "SELECT count(*) FROM credit_ledger l"
                " WHERE NOT EXISTS (SELECT 1 FROM credit_refunds r WHERE r.charge_id = l.id)"
            )
        )


def test_a_replay_that_sends_after_a_refund_is_charged_again_once(
    db: Database, fake: FakeCrm
) -> None:
    """Issue 23 item 4: the refund used to leave the lineage's ledger row in place, so the
    replay that then sent was `already_charged` and every later replay was free."""
    seed_tenant(db, credits=10)
    fake.add_fault(action="rate_limit", path="/_sink", times=3)  # 429 x3: never applied
    version = publish_version(db, _http_workflow(f"{fake.url}/_sink/hook"))
    run_id, [step_id] = start_run(db, version)
    _drive_until_settled_for_good(db, step_id)
    assert steps_of(db, run_id)["call"]["status"] == "failed"
    assert _balance(db) == 10  # charged once, refunded once

    sent: list[str] = []
    outcome = replay.replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=sent.extend)
    _drive_until_settled_for_good(db, sent[0])
    assert steps_of(db, outcome.run_id)["call"]["status"] == "succeeded"
    assert len(fake.sink_requests()) == 1
    # The replay applied: it pays, once, and the refund of the first charge stands.
    assert _balance(db) == 9
    assert _unrefunded_charges(db) == 1
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_refunds") == 1
    charges = run_detail(db, outcome.run_id, None).charges
    assert sorted((c.amount, c.refunded or 0) for c in charges) == [(1, 0), (1, 1)]


def _capped_workflow(url: str, credits: int) -> WorkflowDefinition:
    return _http_workflow(url, budget={"credits": credits, "per": "1d"})


def test_a_charge_is_refunded_when_a_later_gate_refuses_the_attempt_that_ends_the_step(
    db: Database, fake: FakeCrm
) -> None:
    """Issue 23 item 15: attempt 1 is charged and answered 429; another run takes the last of
    the budget; attempt 2 is refused by the budget gate (before the charge gate), so the step
    fails for good with nothing applied. Attempt 1's charge used to be kept."""
    seed_tenant(db, credits=10)
    fake.add_fault(action="rate_limit", path="/_sink", times=1)
    version = publish_version(db, _capped_workflow(f"{fake.url}/_sink/hook", 1))
    run_a, [step_a] = start_run(db, version)
    run_b, [step_b] = start_run(db, version)
    advance_step(db, step_a, dispatch=lambda ids: None)
    assert steps_of(db, run_a)["call"]["status"] == "waiting_for_retry"
    assert _balance(db) == 9
    advance_step(db, step_b, dispatch=lambda ids: None)  # B sends and spends the budget
    assert steps_of(db, run_b)["call"]["status"] == "succeeded"
    for woken in _window_ends_and_parked_steps_wake(db):
        advance_step(db, woken, dispatch=lambda ids: None)
    a = steps_of(db, run_a)["call"]
    assert (a["status"], a["outcome_code"]) == ("failed", "BUDGET_EXCEEDED")
    assert len(fake.sink_requests()) == 1  # only B's request applied
    assert _balance(db) == 9  # B's charge; A's was refunded
    assert _unrefunded_charges(db) == 1


def test_racing_for_the_last_of_a_budget_a_refused_retry_keeps_no_charge(
    db: Database, fake: FakeCrm
) -> None:
    """Item 15 as a race: a retry of a charged attempt and a fresh run go for the last credit
    of the budget at a barrier. Whichever loses, the tenant pays for exactly the one request
    that applied, and each charge that stands belongs to a step that succeeded."""
    seed_tenant(db, credits=100)
    for round_ in range(4):
        fake.add_fault(action="rate_limit", path=f"/_sink/r{round_}", times=1)
        version = publish_version(
            db,
            _capped_workflow(f"{fake.url}/_sink/r{round_}", 1).model_copy(
                update={"name": f"capped-{round_}"}
            ),
        )
        run_a, [step_a] = start_run(db, version)
        advance_step(db, step_a, dispatch=lambda ids: None)  # charged, 429, retry
        run_b, [step_b] = start_run(db, version)
        woken = _window_ends_and_parked_steps_wake(db)
        assert woken == [step_a]
        _advance_together(db, [step_a, step_b])
        statuses = sorted(steps_of(db, r)["call"]["status"] for r in (run_a, run_b))
        assert statuses == ["failed", "succeeded"]
        assert len(fake.sink_requests()) == round_ + 1
        assert _balance(db) == 100 - (round_ + 1)
        assert _unrefunded_charges(db) == round_ + 1


CRASH_CHILD = (
    "import sys\n"
    "from shared.core.db import get_database\n"
    "from shared.steps.advance import advance_step\n"
    "advance_step(get_database(), sys.argv[1], dispatch=lambda ids: None)\n"
)


def test_a_charge_whose_attempt_died_after_sending_is_not_refunded_by_a_later_refusal(
    db: Database, database_url: str, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refund now pays back a charge whatever attempt of the step made it (item 15), so it
    must know which attempts may have applied: attempt 1 is killed (a real process, exit 137)
    after its request reached the receiver; the sweep reclaims it; attempt 2 is refused before
    its request leaves (the tenant's signing secret is gone) and the step fails for good. The
    request of attempt 1 was delivered, so its charge stands."""
    lease = {"ONCEFLOW_STEP_LEASE_SECONDS": "1.5", "ONCEFLOW_STEP_HEARTBEAT_SECONDS": "0.5"}
    for name, value in lease.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TENANT_SIGNING_SECRET", raising=False)
    seed_tenant(db, credits=10, signing_secret_env="TENANT_SIGNING_SECRET")
    version = publish_version(db, _http_workflow(f"{fake.url}/_sink/hook"))
    run_id, [step_id] = start_run(db, version)
    child = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, step_id],
        env=dict(
            os.environ,
            DATABASE_URL=database_url,
            NO_GCE_CHECK="true",
            ONCEFLOW_HTTP_ALLOW_LOOPBACK="1",
            ONCEFLOW_ENABLE_CRASH_POINTS="1",
            ONCEFLOW_CRASH_POINTS="after_side_effect",
            TENANT_SIGNING_SECRET="s3cret",
            **lease,
        ),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 137, child.stderr
    assert len(fake.sink_requests()) == 1 and _balance(db) == 9  # sent and charged
    woken: list[str] = []
    deadline = time.monotonic() + 30
    while not woken and time.monotonic() < deadline:
        time.sleep(0.3)
        reclaim_expired_leases(db, SweepConfig(), woken.extend, SweepReport())
    assert woken == [step_id]
    advance_step(db, step_id, dispatch=lambda ids: None)  # refused: no signing secret
    step = steps_of(db, run_id)["call"]
    assert step["status"] == "failed" and len(fake.sink_requests()) == 1
    assert _balance(db) == 9  # the delivered request's charge is kept
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_refunds") == 0


def test_every_gate_a_block_can_declare_is_one_module_of_the_catalog() -> None:
    """A new gate is one module and one line in `GATES`; a name blocks can declare without a
    module behind it would be a gate nobody runs."""
    assert sorted(k.gate for k in GATES) == sorted(Gate)
    assert len({k.gate for k in GATES}) == len(GATES)
