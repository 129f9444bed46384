"""The lease history (every attempt of a step and how its lease ended) against real Postgres:
written by the claim, settle and reclaim statements themselves, shown by the ops run detail,
trimmed by a sweep duty for runs finished long ago."""

from __future__ import annotations

from typing import Any

import pytest

from shared.blocks.base import BlockContext, BlockFailure, BlockResult
from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.core.errors import PermanentError
from shared.steps.advance import advance_step
from shared.steps.claim import LeaseConfig, claim_step
from shared.steps.outcomes import Settlement
from shared.steps.repairs import trim_lease_history
from shared.steps.settle import settle_step
from shared.steps.states import StepStatus
from shared.sweep.catalog import default_duties
from shared.sweep.loop import run_sweep
from tests.ops_support import (
    bearer,
    mint,
    seed_connection,
    seed_tenant,
)
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.steps_support import chain, definition, publish_version, start_run, steps_of

LEASE = LeaseConfig(lease_seconds=60, heartbeat_seconds=30)
SWEEP = SweepConfig(batch=50, redispatch_after_seconds=120)


def leases_of(db: Database, step_id: str) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT l.*, CAST(l.lease_id AS text) AS lease_id FROM workflow_step_leases l"
            " WHERE l.step_id = :s ORDER BY l.claimed_at, l.lease_id",
            s=step_id,
        )


def flaky_lookup() -> Any:
    """test.flaky: a transient 503 on its first attempt, success after."""

    def flaky(ctx: BlockContext, config: Any) -> BlockResult:
        if ctx.attempt == 1:
            raise BlockFailure(
                "upstream said 503", error_class="transient", outcome_code="HTTP_503"
            )
        return BlockResult(output={"attempt": ctx.attempt})

    return block_lookup(Recorder(), **{"test.flaky": spec("test.flaky", flaky)})


def retried_run(db: Database) -> tuple[str, str]:
    """A one-step run whose step failed transiently once, then succeeded: (run id, step id)."""
    lookup = flaky_lookup()
    version = publish_version(db, definition(chain(1, "test.flaky")))
    run_id, (step_id,) = start_run(db, version)
    first = advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    assert first.status == "waiting_for_retry"
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_steps SET wake_at = now() WHERE id = :s", s=step_id)
    assert run_sweep(db, 0, config=SWEEP, dispatch=lambda _: None, duties=[]).woken == 1
    second = advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    assert second.status == "succeeded" and second.run_status == "succeeded"
    return run_id, step_id


def expire_lease(db: Database, step_id: str) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = :s",
            s=step_id,
        )


def test_a_retried_step_keeps_one_lease_row_per_attempt_with_how_each_ended(
    db: Database,
) -> None:
    run_id, step_id = retried_run(db)
    first, second = leases_of(db, step_id)
    assert (first["attempt"], first["end_kind"], first["end_status"]) == (
        1,
        "settled",
        "waiting_for_retry",
    )
    assert (first["outcome_code"], first["error_class"], first["error"]) == (
        "HTTP_503",
        "transient",
        "upstream said 503",
    )
    assert (second["attempt"], second["end_kind"], second["end_status"]) == (
        2,
        "settled",
        "succeeded",
    )
    assert second["error"] is None and second["outcome_code"] == "OK"
    assert first["lease_id"] != second["lease_id"]
    assert first["claimed_at"] <= first["ended_at"] <= second["claimed_at"] <= second["ended_at"]
    # The step row itself kept only the last attempt's outcome.
    assert steps_of(db, run_id)["s0"]["error"] is None


def test_the_claim_opens_the_row_under_the_step_lease(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (step_id,) = start_run(db, version)
    step = claim_step(db, step_id, LEASE)
    assert step is not None
    (row,) = leases_of(db, step_id)
    assert row["lease_id"] == step.lease_id and row["attempt"] == 1
    assert row["end_kind"] is None and row["ended_at"] is None and row["end_status"] is None
    # A claim that finds nothing to claim writes no history.
    assert claim_step(db, step_id, LEASE) is None
    assert len(leases_of(db, step_id)) == 1


def test_a_lease_reclaimed_by_the_sweep_shows_reclaimed(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (step_id,) = start_run(db, version)
    assert claim_step(db, step_id, LEASE) is not None
    expire_lease(db, step_id)
    assert run_sweep(db, 0, config=SWEEP, dispatch=lambda _: None, duties=[]).reclaimed == 1
    (row,) = leases_of(db, step_id)
    assert (row["end_kind"], row["end_status"], row["outcome_code"]) == (
        "reclaimed",
        "pending",
        None,
    )
    assert row["ended_at"] is not None and row["error"] is None


def test_a_step_whose_process_keeps_dying_gets_its_blocks_attempts_and_no_more(
    db: Database,
) -> None:
    """One number: the block's max_attempts (3 for an action block, as its retry policy says)
    caps lost leases too. The first release gave crashes their own cap of 5."""
    from shared.blocks.base import RetryPolicy

    budget = RetryPolicy().max_attempts
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    for attempt in range(1, budget + 1):
        claimed = claim_step(db, step_id, LEASE)
        assert claimed is not None and claimed.attempt == attempt
        expire_lease(db, step_id)
        report = run_sweep(db, 0, config=SWEEP, dispatch=lambda _: None, duties=[])
        assert (report.reclaimed, report.reclaimed_failed) == (
            (0, 1) if attempt == budget else (1, 0)
        )
    assert claim_step(db, step_id, LEASE) is None
    row = leases_of(db, step_id)[-1]
    assert (row["end_kind"], row["end_status"], row["outcome_code"], row["error_class"]) == (
        "reclaimed",
        "failed",
        "LEASE_EXPIRED",
        "permanent",
    )
    assert row["error"] == steps_of(db, run_id)["s0"]["error"]


def test_a_stale_settle_fenced_out_closes_neither_its_row_nor_the_successors(
    db: Database,
) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (step_id,) = start_run(db, version)
    stale = claim_step(db, step_id, LEASE)
    assert stale is not None
    expire_lease(db, step_id)
    run_sweep(db, 0, config=SWEEP, dispatch=lambda _: None, duties=[])
    successor = claim_step(db, step_id, LEASE)
    assert successor is not None and successor.attempt == 2
    done = Settlement(status=StepStatus.SUCCEEDED, attempt=stale.attempt, outcome_code="OK")
    assert settle_step(db, stale, done, []).fenced_out
    old, new = leases_of(db, step_id)
    assert (old["lease_id"], old["end_kind"], old["end_status"]) == (
        stale.lease_id,
        "reclaimed",
        "pending",
    )
    assert new["lease_id"] == successor.lease_id and new["ended_at"] is None
    # The successor's own settle closes its row.
    done = Settlement(status=StepStatus.SUCCEEDED, attempt=successor.attempt, outcome_code="OK")
    assert not settle_step(db, successor, done, []).fenced_out
    assert leases_of(db, step_id)[1]["end_kind"] == "settled"


def test_an_ops_retry_starts_the_attempt_count_again_and_keeps_the_earlier_leases(
    db: Database,
) -> None:
    from shared.ops.replay import retry_run

    rec = Recorder()
    version = publish_version(db, definition(chain(1, "test.fail_permanent")))
    run_id, (step_id,) = start_run(db, version)
    advance_step(db, step_id, lookup=block_lookup(rec), dispatch=lambda _: None, config=LEASE)
    retry_run(db, run_id=run_id, tenant_scope=None, dispatch=lambda _: None)
    advance_step(db, step_id, lookup=block_lookup(rec), dispatch=lambda _: None, config=LEASE)
    rows = leases_of(db, step_id)
    assert [(r["attempt"], r["end_status"], r["outcome_code"]) for r in rows] == [
        (1, "failed", "HTTP_400"),
        (1, "failed", "HTTP_400"),
    ]
    assert rows[0]["lease_id"] != rows[1]["lease_id"]


def test_a_step_is_two_round_trips_with_its_history(db: Database) -> None:
    """The claim (with its history row) is one statement committed in its own round trip; the
    settle (with the next step's row and the history row closed) another: no BEGIN, no COMMIT
    of their own (issue 19)."""
    lookup = block_lookup(Recorder())
    version = publish_version(db, definition(chain(3, "test.noop")))
    _, (first,) = start_run(db, version)
    sent: list[str] = []
    advance_step(db, first, lookup=lookup, dispatch=sent.extend, config=LEASE)  # loads the graph
    (step_id,) = sent
    db.round_trips.reset()
    advance_step(db, step_id, lookup=lookup, dispatch=sent.extend, config=LEASE)
    assert db.round_trips.count == 2
    assert len(sent) == 2  # the next step was created and dispatched
    assert len(leases_of(db, step_id)) == 1 and leases_of(db, step_id)[0]["ended_at"]


def test_a_settle_beside_another_open_step_writes_nothing_in_one_statement(
    db: Database,
) -> None:
    """The one-statement settle decides the run's end from its snapshot, which is exact only
    when no other step of the run is open. Beside one, it writes nothing and the settle runs
    in a transaction (more round trips): the step settles once (not fenced out by a first,
    half-written settle), the already pending next step is dispatched, the run goes on; the
    last step, alone, then settles and finishes the run in one statement."""
    lookup = block_lookup(Recorder())
    version = publish_version(db, definition(chain(2, "test.noop")))
    run_id, (first,) = start_run(db, version)
    with db.transaction() as tx:  # s1 already exists and is pending: an open sibling of s0
        tx.execute(
            "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key)"
            " SELECT id, 's1', 's1', 'test.noop', 'onceflow:' || lineage_root || ':s1'"
            " FROM workflow_runs WHERE id = :r",
            r=run_id,
        )
    sent: list[str] = []
    db.round_trips.reset()
    first_result = advance_step(db, first, lookup=lookup, dispatch=sent.extend, config=LEASE)
    assert first_result.status == "succeeded" and first_result.run_status == "running"
    assert db.round_trips.count > 2  # claim, the refused statement, then the transaction
    assert steps_of(db, run_id)["s0"]["status"] == "succeeded"
    assert len(leases_of(db, first)) == 1 and leases_of(db, first)[0]["end_status"] == "succeeded"
    (second,) = sent
    db.round_trips.reset()
    last = advance_step(db, second, lookup=lookup, dispatch=sent.extend, config=LEASE)
    assert last.run_status == "succeeded" and db.round_trips.count == 2


def test_the_schema_ties_the_end_kind_to_ended_at_and_status(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (step_id,) = start_run(db, version)
    for bad in (
        "'settled', 'succeeded', NULL",  # ended without a time
        "NULL, NULL, now()",  # a time without an end
        "'reclaimed', 'succeeded', now()",  # the sweep never moves a step to succeeded
    ):
        with pytest.raises(PermanentError), db.transaction() as tx:
            tx.execute(
                "INSERT INTO workflow_step_leases (lease_id, step_id, attempt, end_kind,"
                f" end_status, ended_at) VALUES (gen_random_uuid(), :s, 1, {bad})",
                s=step_id,
            )
    # The history goes with its step.
    assert claim_step(db, step_id, LEASE) is not None
    with db.transaction() as tx:
        tx.execute("DELETE FROM workflow_steps WHERE id = :s", s=step_id)
        assert tx.scalar("SELECT count(*) FROM workflow_step_leases") == 0


def age_run(db: Database, run_id: str, days: int) -> None:
    """Time travel: the run, and its leases, finished `days` ago."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET finished_at = now() - make_interval(days => :d)"
            " WHERE id = :r",
            d=days,
            r=run_id,
        )
        tx.execute(
            "UPDATE workflow_step_leases SET claimed_at = now() - make_interval(days => :d),"
            " ended_at = now() - make_interval(days => :d) WHERE step_id IN"
            " (SELECT id FROM workflow_steps WHERE run_id = :r)",
            d=days,
            r=run_id,
        )


def test_retention_trims_the_history_of_runs_finished_long_ago_only(db: Database) -> None:
    old_run, old_step = retried_run(db)
    recent_run, recent_step = retried_run(db)
    age_run(db, old_run, 31)
    age_run(db, recent_run, 29)
    # A run still going keeps its history however old its leases are.
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (live_step,) = start_run(db, version)
    assert claim_step(db, live_step, LEASE) is not None
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_step_leases SET claimed_at = now() - interval '90 days'"
            " WHERE step_id = :s",
            s=live_step,
        )
    assert trim_lease_history(db, 30, batch=1) == {"deleted": 2}
    assert leases_of(db, old_step) == []
    assert len(leases_of(db, recent_step)) == 2 and len(leases_of(db, live_step)) == 1
    assert steps_of(db, old_run)["s0"]["status"] == "succeeded"  # the journal itself stays
    assert trim_lease_history(db, 30) == {"deleted": 0}


def test_the_retention_duty_reads_its_days_from_the_environment(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, step_id = retried_run(db)
    age_run(db, run_id, 8)
    monkeypatch.setenv("ONCEFLOW_LEASE_HISTORY_DAYS", "7")
    duty = next(d for d in default_duties() if d.name == "trim_lease_history")
    assert duty.run(db) == {"deleted": 2} and leases_of(db, step_id) == []
    assert SweepConfig.from_env({}).lease_history_days == 30
    for bad in ("0", "-3", "a week", "1.5"):
        with pytest.raises(ValueError, match="ONCEFLOW_LEASE_HISTORY_DAYS must be a whole"):
            SweepConfig.from_env({"ONCEFLOW_LEASE_HISTORY_DAYS": bad})


def test_run_detail_lists_each_steps_leases_and_keeps_tenants_apart(
    db: Database, client: Any
) -> None:
    run_id, step_id = retried_run(db)
    token = mint(db, "acme")
    detail = client.get(f"/v1/runs/{run_id}", headers=bearer(token)).get_json()
    (step,) = detail["steps"]
    assert [(x["attempt"], x["end_kind"], x["end_status"]) for x in step["leases"]] == [
        (1, "settled", "waiting_for_retry"),
        (2, "settled", "succeeded"),
    ]
    first = step["leases"][0]
    assert first["outcome_code"] == "HTTP_503" and first["error_class"] == "transient"
    assert first["claimed_at"] and first["ended_at"] and first["lease_id"]
    assert {x["lease_id"] for x in step["leases"]} == {
        r["lease_id"] for r in leases_of(db, step_id)
    }
    # Another tenant's token gets the same 404 as before, with nothing of the history.
    seed_tenant(db, "globex")
    other = client.get(f"/v1/runs/{run_id}", headers=bearer(mint(db, "globex")))
    assert other.status_code == 404 and first["lease_id"] not in other.get_data(as_text=True)
    # /openapi.json describes the field.
    spec_doc = client.get("/openapi.json").get_json()
    schemas = spec_doc["components"]["schemas"]
    assert schemas["StepView"]["properties"]["leases"]["items"]["$ref"].endswith("/LeaseView")
    assert set(schemas["LeaseView"]["properties"]) >= {
        "attempt",
        "lease_id",
        "claimed_at",
        "ended_at",
        "end_kind",
        "end_status",
    }


def test_the_page_shows_every_attempt_of_a_step(db: Database, client: Any) -> None:
    run_id, _ = retried_run(db)
    conn = seed_connection(db, "acme")
    record_key = f"{conn}:contacts:7"
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_runs SET record_key = :k WHERE id = :r", k=record_key, r=run_id)
    client.post("/ui/login", data={"token": mint(db, "acme")})
    html = client.get("/ui", query_string={"record_key": record_key}).get_data(as_text=True)
    assert '<ol class="attempts">' in html
    assert "#1 waiting_for_retry (HTTP_503)" in html and "#2 succeeded (OK)" in html
