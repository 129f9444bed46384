"""Crash the step engine around crm.create, crm.update and http.request; count at the fake.

Every (node, crash point) pair is one run of a three-step workflow (create a task → update a
contact → notify over HTTP). The advance of the targeted node runs in a child process armed
with that crash point (`os._exit(137)`, no cleanup); every other advance, and the recovery
after the lease expires (the sweep's reclaim), runs here. Then, at the fake CRM: no run has
more than one task (zero duplicate creates), every run ended (zero lost runs), a run that lost
a create's outcome says OUTCOME_UNKNOWN, and every repeated notify carried the same
Idempotency-Key.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from devstack.fakecrm import FakeCrm
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.steps_support import definition, publish_version, start_run

advance = pytest.importorskip("shared.steps.advance", reason="step engine not written yet")
repairs = pytest.importorskip("shared.steps.repairs", reason="step engine not written yet")
crashpoints = pytest.importorskip("shared.core.crashpoints")

NODES = ("create_task", "update_contact", "notify")
REPEATS = 1
LEASE = {"ONCEFLOW_STEP_LEASE_SECONDS": "1.5", "ONCEFLOW_STEP_HEARTBEAT_SECONDS": "0.5"}
CHILD = (
    "import sys\n"
    "from shared.core.db import get_database\n"
    "from shared.steps.advance import advance_step\n"
    "advance_step(get_database(), sys.argv[1], dispatch=lambda ids: None)\n"
)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv("ONCEFLOW_HTTP_ALLOW_LOOPBACK", "1")
    for name, value in LEASE.items():
        monkeypatch.setenv(name, value)
    with fake_crm(monkeypatch) as server:
        yield server


def _workflow(name: str, connection_id: str, contact_id: str, sink: str) -> list[dict[str, object]]:
    return [
        {
            "id": "create_task",
            "type": "crm.create",
            "config": {
                "object_type": "tasks",
                "connection_id": connection_id,
                "properties": {"hs_task_subject": name, "hs_timestamp": "2026-12-03T10:00:00Z"},
            },
            "next": "update_contact",
        },
        {
            "id": "update_contact",
            "type": "crm.update",
            "config": {
                "object_type": "contacts",
                "connection_id": connection_id,
                "object_id": contact_id,
                "properties": {"lifecyclestage": "opportunity", "hs_lead_status": name},
            },
            "next": "notify",
        },
        {"id": "notify", "type": "http.request", "config": {"url": sink, "body": {"run": name}}},
    ]


@pytest.mark.slow
def test_crash_points_around_outbound_blocks(
    db: Database, database_url: str, fake: FakeCrm
) -> None:
    seed_tenant(db, credits=10_000)
    connection_id = seed_connection(db, fake.url)
    contact = fake.create_record("contacts", {"email": "c@x.io"}, ("CRM_UI", "userId:1"))
    scenarios: dict[str, tuple[str, str]] = {}  # run id -> (node, crash point)
    names: dict[str, str] = {}
    for node in NODES:
        for point, repeat in itertools.product(crashpoints.CRASH_POINTS, range(REPEATS)):
            name = f"{node}-{point}-{repeat}".replace("_", "-")
            version = publish_version(
                db,
                definition(
                    _workflow(name, connection_id, contact.id, f"{fake.url}/_sink/{name}"),
                    name=name,
                ),
            )
            run_id, _ = start_run(db, version)
            scenarios[run_id] = (node, point)
            names[run_id] = name

    child_env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        **LEASE,
    )
    crashed: set[str] = set()
    exits: Counter[int] = Counter()
    deadline = time.monotonic() + 150
    config = SweepConfig.from_env()
    while time.monotonic() < deadline:
        with db.transaction() as tx:
            pending = tx.all(
                "SELECT id::text AS id, run_id::text AS run_id, node_id FROM workflow_steps "
                "WHERE status = 'pending' AND run_id = ANY(CAST(:runs AS uuid[]))",
                runs=list(scenarios),
            )
            running = tx.scalar(
                "SELECT count(*) FROM workflow_runs WHERE status = 'running' "
                "AND id = ANY(CAST(:runs AS uuid[]))",
                runs=list(scenarios),
            )
        if running == 0:
            break
        children = []
        for step in pending:
            node, point = scenarios[step["run_id"]]
            if step["node_id"] == node and step["run_id"] not in crashed:
                crashed.add(step["run_id"])
                env = dict(child_env, ONCEFLOW_CRASH_POINTS=point)
                children.append(
                    subprocess.Popen(
                        [sys.executable, "-c", CHILD, step["id"]],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            else:
                advance.advance_step(db, step["id"], dispatch=lambda ids: None)
        for child in children:
            exits[child.wait(timeout=60)] += 1
        repairs.reclaim_expired_leases(db, config, lambda ids: None, SweepReport())
        if not pending and not children:
            time.sleep(0.2)  # waiting for a crashed lease to expire
    assert len(crashed) == len(scenarios)
    # Every point on a node's path was hit; only the at-most-once mark is absent from the
    # update and notify paths (those children finish normally).
    assert exits == Counter({137: 13 * REPEATS, 0: 2 * REPEATS}), exits

    with db.transaction() as tx:
        runs = {
            r["id"]: r
            for r in tx.all(
                "SELECT id::text AS id, status FROM workflow_runs "
                "WHERE id = ANY(CAST(:runs AS uuid[]))",
                runs=list(scenarios),
            )
        }
        create_steps = {
            r["run_id"]: r
            for r in tx.all(
                "SELECT run_id::text AS run_id, status, outcome_code FROM workflow_steps "
                "WHERE node_id = 'create_task' AND run_id = ANY(CAST(:runs AS uuid[]))",
                runs=list(scenarios),
            )
        }
    # Zero lost runs: every run reached an end.
    assert {r["status"] for r in runs.values()} <= {"succeeded", "failed"}, runs
    tasks = Counter(t["properties"]["hs_task_subject"] for t in fake.records("tasks"))
    # Zero duplicate creates.
    assert max(tasks.values()) == 1, tasks
    for run_id, run in runs.items():
        name = names[run_id]
        if run["status"] == "succeeded":
            assert tasks[name] == 1
        else:
            # Only a lost create outcome may end a run, and it says so.
            assert create_steps[run_id]["outcome_code"] == "OUTCOME_UNKNOWN", (name, run)
            assert scenarios[run_id][0] == "create_task"
    # http.request may repeat, only ever with the same Idempotency-Key per run.
    keys: dict[str, set[str]] = {}
    for request in fake.sink_requests():
        keys.setdefault(request["path"], set()).add(request["headers"]["idempotency-key"])
    assert all(len(k) == 1 for k in keys.values()), keys
    succeeded = [r for r in runs.values() if r["status"] == "succeeded"]
    # Create lost its outcome at: the mark, after the call, before the settle commit.
    assert Counter(r["status"] for r in runs.values()) == Counter(
        {"succeeded": 12 * REPEATS, "failed": 3 * REPEATS}
    )
    # Crashing after the mark and before the call leaves no task at all: at most once.
    assert sum(tasks.values()) == 14 * REPEATS
    # Notify crashed after the call twice per repeat: those requests were sent again, same key.
    assert len(fake.sink_requests()) == 14 * REPEATS
    assert len(keys) >= len(succeeded)
