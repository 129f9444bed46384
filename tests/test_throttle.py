"""Rate limits in Postgres (per connection, workflow, host): hold across processes, park
without an attempt, and say which limit and until when."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from devstack import seed
from shared.blocks.base import BlockFailure
from shared.core.db import Database
from shared.gates import throttle

CLAIMER = """
import json, sys
from shared.core.db import get_database
from shared.gates.throttle import Limit, claim, claim_slot
scope, subject, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
limit = Limit(scope, subject, int(sys.argv[4]), int(sys.argv[5])) if scope != "connection" else None
def one(tx):
    return claim_slot(tx, subject) if limit is None else claim(tx, limit)
sys.stdin.readline()  # start together
allowed = sum(get_database().run(one).allowed for _ in range(n))
print(json.dumps({"allowed": allowed}))
"""


def _hammer(database_url: str, args: list[str], processes: int) -> list[int]:
    """Start `processes` claimers, release them together, return what each was allowed."""
    env = dict(os.environ, DATABASE_URL=database_url, NO_GCE_CHECK="true")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(processes)
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.close()
    allowed = []
    for p in procs:
        assert p.stdout is not None
        out = p.stdout.read()
        p.stdout.close()
        assert p.wait(timeout=60) == 0
        allowed.append(json.loads(out)["allowed"])
    return allowed


def _connection(db: Database, limit: int, window: int) -> str:
    with db.transaction() as tx:
        seed.tenant(tx, "acme", name="Acme")
        return str(
            tx.scalar(
                "INSERT INTO connections (tenant_id, provider, webhook_secret_env, "
                "rate_limit_per_window, rate_limit_window_seconds) VALUES "
                "('acme', 'hubspot', 'S', :l, :w) RETURNING id::text",
                l=limit,
                w=window,
            )
        )


def test_limit_holds_across_two_processes(db: Database, database_url: str) -> None:
    cid = _connection(db, limit=40, window=3600)
    allowed = _hammer(database_url, ["connection", cid, "30", "0", "0"], 2)
    assert sum(allowed) == 40  # 60 claims, exactly the limit allowed, split between processes
    with db.transaction() as tx:
        assert tx.scalar("SELECT sum(used) FROM throttle_windows") == 60


def test_workflow_limit_of_40_per_minute_holds_across_three_processes(
    db: Database, database_url: str
) -> None:
    # An hour-long window: the three processes can't straddle a window boundary.
    allowed = _hammer(database_url, ["workflow", "wf-1", "25", "40", "3600"], 3)
    assert sum(allowed) == 40  # 75 claims at once, never more than max admitted
    with db.transaction() as tx:
        rows = tx.all("SELECT scope, subject, used FROM throttle_windows")
    assert [(r["scope"], r["subject"], r["used"]) for r in rows] == [("workflow", "wf-1", 75)]


def test_over_the_limit_parks_until_the_window_ends_without_an_attempt(db: Database) -> None:
    cid = _connection(db, limit=2, window=60)
    limit = db.run(lambda tx: throttle.connection_limit(tx, cid))
    assert limit is not None
    throttle.claim_or_park(db, limit)
    throttle.claim_or_park(db, limit)
    with pytest.raises(BlockFailure) as err:
        throttle.claim_or_park(db, limit)
    failure = err.value
    assert failure.outcome_code == "THROTTLED" and failure.error_class == "transient"
    assert failure.consumes_attempt is False and failure.not_applied
    assert failure.retry_after is not None and 0 < failure.retry_after <= 60
    assert str(failure).startswith("throttled until ") and "by connection limit" in str(failure)


def test_limits_of_different_scopes_and_subjects_count_apart(db: Database) -> None:
    a = throttle.Limit("workflow", "wf-a", 1, 60)
    b = throttle.Limit("workflow", "wf-b", 1, 60)
    host = throttle.Limit("host", "acme|hooks.example.com", 1, 60)
    for limit in (a, b, host):
        throttle.claim_or_park(db, limit)
    with pytest.raises(BlockFailure) as err:
        throttle.claim_or_park(db, a)
    assert "by workflow limit (wf-a: 1 per 60s)" in str(err.value)


def test_unknown_connection_is_not_throttled(db: Database) -> None:
    claim = db.run(lambda tx: throttle.claim_slot(tx, "00000000-0000-0000-0000-000000000000"))
    assert claim.allowed
