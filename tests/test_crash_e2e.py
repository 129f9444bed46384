"""End to end: real `advance_step` processes behind the Pub/Sub emulator, killed at every
crash point of the step path, for a multi-step workflow whose actions are `http.request`
calls to a receiver that dedupes on `Idempotency-Key`.

After restarts and sweeps: every run succeeded (nothing lost), every step's call reached the
receiver, a repeated call always carried the same key as the first (the receiver applies each
side effect once), and no step ran under two keys.

`after_side_effect_mark` is reached only by at-most-once blocks (the marker is a no-op for
idempotent ones); its end-to-end kill is in the blocks issue's crm.create crash test, which
uses the same harness pattern.
"""

from __future__ import annotations

from collections import Counter

import pytest

from shared.core.db import Database
from tests.e2e.crash_harness import EXIT_CODE, CrashHarness, Receiver
from tests.pubsub_emulator import (
    Emulator,
)
from tests.steps_support import definition, publish_version, start_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

POINTS = ("after_claim", "after_side_effect", "before_settle_commit", "after_commit_before_publish")
RUNS_PER_POINT = 3
# A step gets its block's attempts (3 for http.request), lost leases included: two kills can
# take two attempts of one step, and the third must then succeed.
KILLS_PER_POINT = 2


def workflow(receiver: Receiver) -> list[dict[str, object]]:
    return [
        {
            "id": "notify_a",
            "type": "http.request",
            "next": "notify_b",
            "config": {"url": receiver.url("/a"), "body": {"run": "${{ run.id }}"}},
        },
        {
            "id": "notify_b",
            "type": "http.request",
            "next": "done",
            "config": {
                "url": receiver.url("/b"),
                "body": {"run": "${{ run.id }}", "a": "${{ steps.notify_a.output }}"},
            },
        },
        {"id": "done", "type": "end"},
    ]


def test_every_crash_point_recovers_without_duplicate_effects_or_lost_runs(
    db: Database, database_url: str, pubsub_emulator: Emulator
) -> None:
    with (
        Receiver() as receiver,
        CrashHarness(
            database_url,
            pubsub_emulator.host,
            db=db,
            extra_env={"ONCEFLOW_HTTP_ALLOW_LOOPBACK": "1"},
            lease_seconds=2.0,
            heartbeat_seconds=0.5,
            redispatch_after_seconds=1.0,
        ) as harness,
    ):
        version = publish_version(db, definition(workflow(receiver), name="crashy"))
        with db.transaction() as tx:
            tx.execute("UPDATE tenants SET credit_balance = 100000")
        all_runs: list[str] = []
        kills: dict[str, int] = {}
        for point in POINTS:
            runs: list[str] = []
            for _ in range(RUNS_PER_POINT):
                run_id, first = start_run(db, version)
                runs.append(run_id)
                harness.publish_steps(first)

            def ended(runs: list[str] = runs) -> bool:
                with db.transaction() as tx:
                    return not tx.scalar(
                        "SELECT count(*) FROM workflow_runs WHERE id = ANY(CAST(:r AS uuid[]))"
                        " AND status = 'running'",
                        r=runs,
                    )

            stats = harness.drive(ended, crash_point=point, kills=KILLS_PER_POINT, timeout=120)
            kills[point] = stats.kills
            assert stats.kills >= 1, f"{point} never fired"
            assert all(code in (EXIT_CODE, -9) for code in stats.exit_codes)
            all_runs += runs
        harness.stop()

        with db.transaction() as tx:
            runs_by_status = Counter(
                r["status"]
                for r in tx.all(
                    "SELECT status FROM workflow_runs WHERE id = ANY(CAST(:r AS uuid[]))",
                    r=all_runs,
                )
            )
            steps = tx.all(
                "SELECT run_id, step_key, status, attempt, idempotency_key, outcome_code"
                " FROM workflow_steps"
                " WHERE run_id = ANY(CAST(:r AS uuid[]))",
                r=all_runs,
            )
        # Nothing lost: every run of every point finished, and succeeded.
        failed = [
            (s["step_key"], s["attempt"], s["outcome_code"])
            for s in steps
            if s["status"] != "succeeded"
        ]
        assert runs_by_status == {"succeeded": len(all_runs)}, (runs_by_status, failed)
        assert len(steps) == 3 * len(all_runs)
        assert all(s["status"] == "succeeded" for s in steps)
        # Some steps really were interrupted and retried.
        assert sum(s["attempt"] > 1 for s in steps) >= 1
        # Every call's effect arrived, under the step's journaled key, and a repeated call
        # reused it: an idempotent receiver applies each step exactly once.
        keys = receiver.keys()
        journaled = {s["idempotency_key"] for s in steps if s["step_key"] != "done"}
        assert None not in keys
        assert set(keys) == journaled
        assert len(journaled) == 2 * len(all_runs)
        applied = {k for k in keys}  # what a receiver deduping on the key applies
        assert len(applied) == len(journaled)
        repeats = len(keys) - len(applied)
        print(
            f"kills per point {kills}; requests {len(keys)}, repeated with the same key {repeats}"
        )
