"""Kill the process that asked the model, after the answer came back and before the step
settled; the attempt after the sweep's reclaim reuses the journaled answer: Vertex AI is
asked once per lineage key, and the credits are charged once."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from devstack.fakevertex.server import FakeVertex
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.steps import repairs
from shared.steps.advance import advance_step
from tests.blocks_support import seed_tenant
from tests.fakevertex_support import configure_tenant, fake_vertex
from tests.steps_support import definition, publish_version, start_run, steps_of

LEASE = {"ONCEFLOW_STEP_LEASE_SECONDS": "1.5", "ONCEFLOW_STEP_HEARTBEAT_SECONDS": "0.5"}
CHILD = (
    "import sys\n"
    "from shared.core.db import get_database\n"
    "from shared.steps.advance import advance_step\n"
    "advance_step(get_database(), sys.argv[1], dispatch=lambda ids: None)\n"
)
CONFIG = {
    "prompt": "Classify: Sounds great",
    "schema": {
        "type": "object",
        "properties": {"intent": {"type": "string"}},
        "required": ["intent"],
    },
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVertex]:
    for name, value in LEASE.items():
        monkeypatch.setenv(name, value)
    with fake_vertex(monkeypatch) as server:
        server.fixtures["Sounds great"] = {"intent": "interested"}
        yield server


@pytest.mark.parametrize("point", ["after_side_effect", "before_settle_commit"])
def test_a_crash_after_the_answer_reuses_it_on_the_next_attempt(
    db: Database, database_url: str, fake: FakeVertex, point: str
) -> None:
    # The default answer cap (1024 tokens) is charged before the call: 12 credits.
    seed_tenant(db, credits=20)
    configure_tenant(db)
    version = publish_version(
        db, definition([{"id": "classify", "type": "ai.generate", "config": CONFIG}])
    )
    run_id, [step_id] = start_run(db, version)
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS=point,
        **LEASE,
    )
    child = subprocess.run(
        [sys.executable, "-c", CHILD, step_id],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 137, child.stderr[-2000:]
    assert fake.call_count() == 1
    assert steps_of(db, run_id)["classify"]["status"] == "running"
    # The lease expires; the sweep reclaims the step and the next attempt runs here.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        woken: list[str] = []
        repairs.reclaim_expired_leases(db, SweepConfig.from_env(), woken.extend, SweepReport())
        if woken or steps_of(db, run_id)["classify"]["status"] != "running":
            break
        time.sleep(0.3)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET wake_at = now() - interval '1 second'"
            " WHERE id = :s AND status = 'waiting_for_retry'",
            s=step_id,
        )
    advance_step(db, step_id, dispatch=lambda ids: None)
    step = steps_of(db, run_id)["classify"]
    assert (step["status"], step["outcome_code"]) == ("succeeded", "AI_ANSWER_REUSED")
    assert step["output"]["answer"] == {"intent": "interested"}
    assert fake.call_count() == 1
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 1
        balance = tx.scalar("SELECT credit_balance FROM tenants")
    # The reused answer reports the call that produced it: settled at what that call used.
    assert balance == 20 - (1 + math.ceil(step["output"]["usage"]["total_tokens"] * 10 / 1000))
