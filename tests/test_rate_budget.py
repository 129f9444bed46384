"""A portal's shared rate budget (issue 29, item 5; shared/port/budget.py): the vendor's
rate-limit headers narrow the connection's window for every workflow on it, a 429 shrinks the
window and a quiet period restores it, and a spent daily budget parks the connection's steps
with a reason the limits view shows. Real paths: steps through `advance_step`, the fake HubSpot
counting the portal's budget down across apps (a second private app on the portal spends it
too), the budget in Postgres. Each step runs on a fresh port (`forget_ports`, as another
instance would): what holds the steps back is the Postgres row, not a port's memory."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from devstack import seed
from devstack.fakecrm import FakeCrm, FakeCrmConfig
from devstack.fakepipedrive import FakePipedrive, FakePipedriveConfig
from shared.blocks import registry
from shared.blocks.base import BlockContext, BlockFailure, Target
from shared.core.db import Database, Tx
from shared.gates import limit_queue, throttle
from shared.gates.kind import Attempt, WorkflowGates
from shared.port import budget
from shared.port.interface import RateLimitState
from shared.providers import connect
from shared.providers.hubspot import versions
from shared.providers.hubspot.port import read_rate_limit as hubspot_limits
from shared.providers.pipedrive.port import read_rate_limit as pipedrive_limits
from shared.steps.advance import advance_step
from tests.admission_support import at_barrier
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.ops_support import bearer, mint
from tests.steps_support import TENANT, definition, publish_version, start_run


@pytest.fixture
def small_portal(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    # 4 calls a minute: small enough to spend in a test.
    config = FakeCrmConfig(rate_limit_max=4, rate_limit_interval_ms=60_000, daily_limit=100)
    with fake_crm(monkeypatch, config) as server:
        yield server


def _other_app_calls(fake: FakeCrm, n: int) -> None:
    """Another integration on the same portal (its own private-app token) spends the budget."""
    for _ in range(n):
        httpx.get(
            fake.url + versions.crm_objects("contacts", "999999"),
            headers={"Authorization": "Bearer another-integration"},
            timeout=5,
        )


def _create_task_step(db: Database, connection_id: str, workflow: str) -> str:
    version = publish_version(
        db,
        definition(
            [
                {
                    "id": "create_task",
                    "type": "crm.create",
                    "config": {
                        "object_type": "tasks",
                        "connection_id": connection_id,
                        "properties": {"hs_task_subject": "Call Ada", "hs_timestamp": "0"},
                    },
                }
            ],
            name=workflow,
        ),
    )
    _, [step_id] = start_run(db, version)
    return step_id


def _advance(db: Database, step_id: str) -> dict[str, Any]:
    connect.forget_ports()  # a fresh instance: only Postgres remembers the budget
    advance_step(db, step_id, dispatch=lambda ids: None)
    with db.transaction() as tx:
        row = tx.one(
            "SELECT status, outcome_code, error, wake_at FROM workflow_steps WHERE id = :s",
            s=step_id,
        )
    assert row is not None
    return dict(row)


def _connection_attempt(connection_id: str, step_id: str) -> Attempt:
    spec = registry.get("end")
    ctx = BlockContext(
        tenant_id=TENANT,
        run_id="",
        step_id=step_id,
        step_key="start",
        attempt=1,
        idempotency_key=f"k:{step_id}",
        scope={},
    )
    target = Target(connection_id=connection_id)
    return Attempt(spec, ctx, spec.config_model.model_construct(), WorkflowGates("wf"), target)


def _connection_gate(tx: Tx, connection_id: str, step_id: str) -> BlockFailure | None:
    """The connection-limit gate's one statement for a step (the real `open`)."""
    return limit_queue.open_in_turn(
        tx, _connection_attempt(connection_id, step_id), scope="connection", subject=connection_id
    )


def _statuses(fake: FakeCrm) -> list[Any]:
    with fake.store.lock:
        return [r.get("status") for r in fake.store.requests]


def test_two_workflows_on_one_connection_park_when_the_portal_has_nothing_left(
    db: Database, small_portal: FakeCrm
) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, small_portal.url)
    _other_app_calls(small_portal, 2)  # the portal's window: 2 of 4 left
    a1, b1, a2, b2 = (
        _create_task_step(db, connection_id, name) for name in ("wf-a", "wf-b", "wf-a", "wf-b")
    )
    assert _advance(db, a1)["status"] == "succeeded"  # the headers say 1 left
    assert _advance(db, b1)["status"] == "succeeded"  # takes the last one: 0 left
    for step_id in (a2, b2):
        parked = _advance(db, step_id)
        assert parked["status"] == "waiting_for_retry"
        assert parked["outcome_code"] == "THROTTLED"
        assert f"by connection limit ({connection_id}:" in parked["error"]
        assert "the portal's rate window is spent" in parked["error"]
        # Until the window the headers spoke of ends (a whole minute from the last answer).
        assert parked["wake_at"] > datetime.now(UTC) + timedelta(seconds=50)
    statuses = _statuses(small_portal)
    assert 429 not in statuses  # parked instead of spending a call on a certain 429
    assert len(statuses) == 4  # the other app's 2 and the two creates
    assert len(small_portal.records("tasks")) == 2


def test_a_429_shrinks_the_window_and_a_quiet_period_restores_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fake_crm(monkeypatch) as fake:
        seed_tenant(db)
        connection_id = seed_connection(db, fake.url)
        with db.transaction() as tx:
            tx.execute(
                "UPDATE connections SET rate_limit_per_window = 8, rate_limit_window_seconds = 1"
            )
        fake.add_fault(action="rate_limit", retry_after=1)
        hit = _advance(db, _create_task_step(db, connection_id, "wf-a"))
        assert hit["outcome_code"] == "PROVIDER_RATE_LIMITED"

        def window() -> int:
            with db.transaction() as tx:
                limit = throttle.connection_limit(tx, connection_id)
            assert limit is not None
            return limit.max

        assert window() == 4  # halved by the 429
        shrunk_at = time.monotonic()
        # Quiet for QUIET_WINDOWS (3) of the connection's 1-second windows: restored.
        while window() != 8 and time.monotonic() - shrunk_at < 6:
            time.sleep(0.2)
        assert window() == 8
        assert time.monotonic() - shrunk_at >= 2.5  # not before the quiet period passed


def test_a_spent_daily_budget_parks_until_the_next_hour_with_its_reason_in_the_limits_view(
    db: Database, monkeypatch: pytest.MonkeyPatch, client: Any
) -> None:
    with fake_crm(monkeypatch, FakeCrmConfig(daily_limit=3)) as small_portal:
        _spent_daily_budget(db, small_portal, client)


def _spent_daily_budget(db: Database, small_portal: FakeCrm, client: Any) -> None:
    seed_tenant(db)
    connection_id = seed_connection(db, small_portal.url)
    _other_app_calls(small_portal, 2)  # the portal's day: 1 of 3 left
    first, second = (_create_task_step(db, connection_id, n) for n in ("wf-a", "wf-b"))
    assert _advance(db, first)["status"] == "succeeded"  # Daily-Remaining: 0
    parked = _advance(db, second)
    assert parked["outcome_code"] == "THROTTLED"
    assert "the portal's daily API budget is spent" in parked["error"]
    now = datetime.now(UTC)
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    assert abs((parked["wake_at"] - next_hour).total_seconds()) < 2
    assert 429 not in _statuses(small_portal)

    got = client.get("/v1/limits", headers=bearer(mint(db, tenant=TENANT)))
    assert got.status_code == 200, got.get_json()
    (view,) = [i for i in got.get_json()["items"] if i["subject"] == connection_id]
    assert view["kind"] == "connection" and view["waiting"] == 1
    assert "the portal's daily API budget is spent" in view["reason"]


def test_each_vendor_reads_its_headers_into_the_neutral_budget() -> None:
    private = httpx.Headers(
        {
            "X-HubSpot-RateLimit-Max": "190",
            "X-HubSpot-RateLimit-Remaining": "0",
            "X-HubSpot-RateLimit-Interval-Milliseconds": "10000",
            "X-HubSpot-RateLimit-Daily": "1000000",
            "X-HubSpot-RateLimit-Daily-Remaining": "12",
        }
    )
    state, spent = hubspot_limits(private)
    assert (state.remaining, state.reset_seconds, state.daily_remaining, spent) == (
        0,
        10.0,
        12,
        10.0,
    )
    # An OAuth call's answer has no daily headers: the daily budget is left unsaid.
    oauth = httpx.Headers({k: v for k, v in private.items() if "daily" not in k.lower()})
    assert hubspot_limits(oauth)[0].daily_remaining is None
    pipedrive = httpx.Headers(
        {
            "x-ratelimit-limit": "80",
            "x-ratelimit-remaining": "3",
            "x-ratelimit-reset": "1",
            "x-daily-requests-left": "7",
        }
    )
    state, spent = pipedrive_limits(pipedrive)
    assert (state.remaining, state.reset_seconds, state.daily_remaining, spent) == (
        3,
        1.0,
        7,
        None,
    )


def test_racing_claims_for_the_portals_last_call_let_exactly_one_through(
    db: Database, database_url: str
) -> None:
    """Two instances' gates at a barrier for the one call the headers said is left: the row
    lock queues them, so exactly one takes it and the other is told to park."""
    seed_tenant(db)
    connection_id = seed_connection(db, "http://127.0.0.1:9")
    with db.transaction() as tx:
        budget.observe(tx, connection_id, RateLimitState(remaining=1, reset_seconds=60.0))

    def take(own: Database) -> BlockFailure | None:
        return own.run(lambda tx: _connection_gate(tx, connection_id, str(uuid.uuid4())))

    results = at_barrier(database_url, [take, take])
    assert sorted(r is None for r in results) == [False, True]
    (spent,) = [r for r in results if r is not None]
    assert "the portal's rate window is spent" in str(spent)
    assert spent.retry_after is not None and spent.retry_after > 50


def test_pipedrive_steps_park_when_the_companys_daily_budget_is_spent_by_every_token(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipedrive: the daily token budget is the company's, spent by its other tokens too; the
    answers say what is left (`x-daily-ratelimit-token-remaining`, sent here:
    `token_budget_headers`), and two workflows on the connection park at 0 instead of 429."""
    monkeypatch.setenv("PIPEDRIVE_TOKEN", "pd-api-token")
    config = FakePipedriveConfig(
        api_tokens={"pd-api-token": 7, "another-integration": 7},
        token_budget_headers=True,
        daily_budget=15,
        create_cost=5,
    )
    connect.forget_ports()
    fake = FakePipedrive(config).start()
    try:
        seed_tenant(db)
        with db.transaction() as tx:
            connection_id = seed.connection(
                tx,
                TENANT,
                provider="pipedrive",
                webhook_secret_env="PIPEDRIVE_CREDENTIALS",
                api_credentials_env="PIPEDRIVE_TOKEN",
                api_base_url=fake.url,
            )

        def deal_step(workflow: str) -> str:
            create = {"object_type": "deals", "properties": {"title": "Ada"}}
            steps = [
                {
                    "id": "create_deal",
                    "type": "crm.create",
                    "config": {**create, "connection_id": connection_id},
                }
            ]
            return start_run(db, publish_version(db, definition(steps, name=workflow)))[1][0]

        # The company's other integration creates a deal: 5 of 15 spent.
        other = httpx.post(
            fake.url + "/api/v2/deals",
            json={"title": "theirs"},
            headers={"x-api-token": "another-integration"},
            timeout=5,
        )
        assert other.headers["x-daily-ratelimit-token-remaining"] == "10"
        a1, b1, a2, b2 = (deal_step(n) for n in ("wf-a", "wf-b", "wf-a", "wf-b"))
        assert _advance(db, a1)["status"] == "succeeded"  # 5 left
        assert _advance(db, b1)["status"] == "succeeded"  # 0 left
        for step_id in (a2, b2):
            parked = _advance(db, step_id)
            assert parked["outcome_code"] == "THROTTLED"
            assert "the portal's daily API budget is spent" in parked["error"]
        assert not [r for r in fake.requests if r.get("status") == 429]
        assert len(fake.stored("deal")) == 3  # theirs and the two creates
    finally:
        fake.stop()
        connect.forget_ports()


def test_an_answer_with_plenty_left_writes_no_budget_row(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most calls leave the portal far from its limits: they cost no write (budget.worth_noting)."""
    with fake_crm(monkeypatch) as fake:  # 190 per 10 s, a million a day
        seed_tenant(db)
        connection_id = seed_connection(db, fake.url)
        assert _advance(db, _create_task_step(db, connection_id, "wf-a"))["status"] == "succeeded"
        with db.transaction() as tx:
            assert tx.scalar("SELECT count(*) FROM connection_rate_budgets") == 0


def _limited_connection(db: Database, max_: int) -> str:
    """A connection of `max_` calls an hour (no answer has narrowed it yet)."""
    seed_tenant(db)
    connection_id = seed_connection(db, "http://127.0.0.1:9")
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET rate_limit_per_window = :m, rate_limit_window_seconds = 3600",
            m=max_,
        )
    return connection_id


def _running(db: Database, connection_id: str, n: int) -> list[str]:
    """`n` steps on the connection, each claimed (running under a lease) as the executor does."""
    ids = [_create_task_step(db, connection_id, "wf-a") for _ in range(n)]
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'running', lease_id = gen_random_uuid(),"
            " lease_expires_at = now() + interval '1 hour', attempt = 1"
            " WHERE id = ANY(CAST(:ids AS uuid[]))",
            ids=ids,
        )
    return ids


def _claim(tx: Tx, step_id: str) -> None:
    """The executor claims the granted (pending) step: running under a lease."""
    tx.execute(
        "UPDATE workflow_steps SET status = 'running', lease_id = gen_random_uuid(),"
        " lease_expires_at = now() + interval '1 hour' WHERE id = :s",
        s=step_id,
    )


def _park(db: Database, step_ids: list[str]) -> None:
    """What the settle writes for a THROTTLED refusal."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'waiting_for_retry', lease_id = NULL,"
            " lease_expires_at = NULL, wake_at = now() + interval '1 hour',"
            " outcome_code = 'THROTTLED' WHERE id = ANY(CAST(:ids AS uuid[]))",
            ids=step_ids,
        )


def _gate(db: Database, connection_id: str, step_id: str) -> BlockFailure | None:
    return db.run(lambda tx: _connection_gate(tx, connection_id, step_id))


def _next_window_granted(db: Database, connection_id: str) -> list[str]:
    """The hour ends (the window is moved back) and the sweep's grantor serves the line."""
    with db.transaction() as tx:
        tx.execute("UPDATE throttle_windows SET window_start = window_start - interval '2 hours'")
        return limit_queue.grant(tx, f"connection|{connection_id}").step_ids


def test_a_granted_step_still_takes_from_the_portals_budget_and_a_spent_day_refuses_it(
    db: Database,
) -> None:
    """A grant counts a slot in the connection's window, not a call of the portal's day: the
    granted step's gate takes its call from the budget, and parks with the budget's reason
    when the day was spent between the grant and the gate."""
    connection_id = _limited_connection(db, 1)
    first, second = _running(db, connection_id, 2)
    assert _gate(db, connection_id, first) is None  # the hour's one slot
    assert _gate(db, connection_id, second) is not None  # joins the line
    _park(db, [second])
    assert _next_window_granted(db, connection_id) == [second]
    with db.transaction() as tx:
        _claim(tx, second)
        budget.observe(tx, connection_id, RateLimitState(daily_remaining=0))
    refused = _gate(db, connection_id, second)
    assert refused is not None
    assert "the portal's daily API budget is spent" in str(refused)

    # With a call left, the grant goes and takes it.
    third, fourth = _running(db, connection_id, 2)
    with db.transaction() as tx:
        tx.execute("UPDATE connection_rate_budgets SET daily_remaining = 2")
        tx.execute("UPDATE throttle_windows SET window_start = window_start - interval '2 hours'")
    assert _gate(db, connection_id, third) is None  # 1 call of the day left
    assert _gate(db, connection_id, fourth) is not None  # the hour is full: joins the line
    _park(db, [fourth])
    assert _next_window_granted(db, connection_id) == [fourth]
    with db.transaction() as tx:
        _claim(tx, fourth)
    assert _gate(db, connection_id, fourth) is None
    with db.transaction() as tx:
        assert tx.scalar("SELECT daily_remaining FROM connection_rate_budgets") == 0


def test_the_grantor_grants_nothing_while_the_portals_day_is_spent(db: Database) -> None:
    connection_id = _limited_connection(db, 1)
    first, second = _running(db, connection_id, 2)
    assert _gate(db, connection_id, first) is None
    assert _gate(db, connection_id, second) is not None
    _park(db, [second])
    with db.transaction() as tx:
        budget.observe(tx, connection_id, RateLimitState(daily_remaining=0))
    assert _next_window_granted(db, connection_id) == []
    with db.transaction() as tx:
        due = tx.scalar("SELECT due_at FROM limit_queues")
        until = tx.scalar("SELECT daily_until FROM connection_rate_budgets")
    assert due == until  # the line is served again when the day's budget comes back


def test_the_grantor_serves_a_connections_line_by_its_window_shrunk_after_a_429(
    db: Database,
) -> None:
    """The line stored the window of 4 when its steps joined; a 429 halved it since: the next
    window grants 2, not 4."""
    connection_id = _limited_connection(db, 4)
    first, *waiting = _running(db, connection_id, 5)
    assert _gate(db, connection_id, first) is None
    with db.transaction() as tx:
        tx.execute("UPDATE throttle_windows SET used = 4")  # the hour is full
    for step_id in waiting:
        assert _gate(db, connection_id, step_id) is not None
    _park(db, waiting)
    with db.transaction() as tx:
        budget.shrink(tx, connection_id, retry_after=0.0)
    assert len(_next_window_granted(db, connection_id)) == 2
