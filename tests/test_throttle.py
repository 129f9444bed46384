"""Per-connection throttling in Postgres: holds across processes, parks without an attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shared import throttle
from shared.blocks.base import BlockFailure
from shared.db import Database

CLAIMER = """
import json, sys
from shared.db import get_database
from shared.throttle import claim_slot
cid, n = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()  # start together
allowed = sum(get_database().run(lambda tx: claim_slot(tx, cid)).allowed for _ in range(n))
print(json.dumps({"allowed": allowed}))
"""


def _connection(db: Database, limit: int, window: int) -> str:
    with db.transaction() as tx:
        tx.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'Acme')")
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
    env = dict(os.environ, DATABASE_URL=database_url, NO_GCE_CHECK="true")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, cid, "30"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
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
    assert sum(allowed) == 40  # 60 claims, exactly the limit allowed, split between processes
    with db.transaction() as tx:
        assert tx.scalar("SELECT sum(used) FROM throttle_windows") == 60


def test_over_the_limit_parks_until_the_window_ends_without_an_attempt(db: Database) -> None:
    cid = _connection(db, limit=2, window=60)
    throttle.claim_or_park(cid)
    throttle.claim_or_park(cid)
    with pytest.raises(BlockFailure) as err:
        throttle.claim_or_park(cid)
    failure = err.value
    assert failure.outcome_code == "THROTTLED" and failure.error_class == "transient"
    assert failure.consumes_attempt is False
    assert failure.retry_after is not None and 0 < failure.retry_after <= 60


def test_unknown_connection_is_not_throttled(db: Database) -> None:
    claim = throttle.claim_or_park("00000000-0000-0000-0000-000000000000")
    assert claim.allowed
