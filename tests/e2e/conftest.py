"""End-to-end fixture: the whole local stack, as `make dev` runs it, for one test session.

    def test_something(stack: RunningStack) -> None:
        stack.call("webhook", path=f"/hubspot/{connection_id}", content=body, headers=...)
        stack.publish("trigger-events", {"event_id": 1})
        stack.restart("advance_step", {"ONCEFLOW_CRASH_POINTS": "after_claim"})
        with stack_db.transaction() as tx: ...

`stack` is session-scoped and started only when a selected test asks for it, so `-k` subsets
without end-to-end tests pay nothing. It runs `python -m devstack.stack up --free-ports` in a
temporary folder (real functions-framework processes, the real Pub/Sub emulator with the
subscriptions infra/ declares, the fake CRM, the local scheduler) against a fresh migrated
database on the session's PostgreSQL, and stops every process at the end of the session.
The database is shared by every end-to-end test: use your own tenant ids.

A test of what HubSpot's deliveries do lets the stack's fake CRM send them:
`tests/e2e/fake_hubspot.py` (`app_delivery`) registers the app the fake plays and switches it
to the realistic delivery mode towards the app's one URL; use your own portal ids.

`E2E_ENV` is what the functions run with on top of the stack's defaults: short loop budgets so
a scheduled call returns in seconds, and a scheduler running 20 times faster (every `* * * * *`
job fires every 3 s). Add your function's knobs here rather than restarting it per test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pg8000.dbapi
import pytest

from devstack import postgres
from devstack.stack import REPO, RunningStack
from shared.core.db import Database, connector_from_env

E2E_DATABASE = "onceflow_e2e"
E2E_ENV = {
    "DRAIN_BUDGET_SECONDS": "2",
    "PUBLISH_BUDGET_SECONDS": "2",
    "NUDGE_BUDGET_SECONDS": "2",
    "SWEEP_BUDGET_SECONDS": "2",
    # A published event still undecided after 8 s is published again (the default is 120 s);
    # a killed advance_step's steps are reclaimed and lost step-ready pushes re-sent within
    # seconds too (defaults: a 600 s lease, 120 s).
    "ONCEFLOW_REDELIVER_EVENTS_AFTER_SECONDS": "8",
    "ONCEFLOW_STEP_LEASE_SECONDS": "10",
    "ONCEFLOW_STEP_HEARTBEAT_SECONDS": "2",
    "ONCEFLOW_REDISPATCH_AFTER_SECONDS": "8",
}
E2E_SCHEDULER_SPEEDUP = "20"


@pytest.fixture(scope="session")
def stack(pg_cluster: postgres.Cluster, template_database: str) -> Iterator[RunningStack]:
    admin = pg8000.dbapi.connect(
        user="postgres", host="127.0.0.1", port=pg_cluster.port, database="postgres"
    )
    admin.autocommit = True
    admin.cursor().execute(f'DROP DATABASE IF EXISTS "{E2E_DATABASE}" WITH (FORCE)')
    admin.cursor().execute(f'CREATE DATABASE "{E2E_DATABASE}" TEMPLATE "{template_database}"')
    root = Path(tempfile.mkdtemp(prefix="onceflow-e2e-stack-"))
    env = {
        **os.environ,
        "DATABASE_URL": pg_cluster.url(E2E_DATABASE),
        "ONCEFLOW_SCHEDULER_SPEEDUP": E2E_SCHEDULER_SPEEDUP,
        "NO_GCE_CHECK": "true",
    }
    args = [sys.executable, "-m", "devstack.stack", "up", "--root", str(root), "--free-ports"]
    for key, value in E2E_ENV.items():
        args += ["--env", f"{key}={value}"]
    # A separate process, like `make dev`: the stack's processes are not pytest's children.
    started = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    try:
        if started.returncode != 0:
            pytest.fail(f"the local stack did not start:\n{started.stdout}\n{started.stderr}")
        yield RunningStack.open(root)
    finally:
        subprocess.run(
            [sys.executable, "-m", "devstack.stack", "down", "--root", str(root)],
            cwd=REPO,
            env=env,
            capture_output=True,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{E2E_DATABASE}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def stack_db(stack: RunningStack) -> Iterator[Database]:
    """A pool on the stack's database (the one its functions use)."""
    database = Database(connector_from_env({"DATABASE_URL": stack.database_url}), pool_size=4)
    try:
        yield database
    finally:
        database.close()
