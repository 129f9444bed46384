"""The `ops` function as a real functions-framework process: a token minted with the CLI,
401 on the wire without it, and a replay whose reset step reaches the real Pub/Sub
emulator's `step-ready` topic only after its row committed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from shared.core.db import Database
from shared.core.pubsub import STEP_READY
from tests.ops_support import (
    JournalRow,
    seed_run,
    seed_scene,
)
from tests.pubsub_emulator import (
    PubsubProject,
)

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


def test_cli_token_and_a_replay_dispatched_through_the_emulator(
    db: Database, database_url: str, ops_process: str, pubsub: PubsubProject
) -> None:
    _, wf, ver, event, record_key = seed_scene(
        db,
        "acme",
        [{"id": "a", "type": "http.request", "next": "b"}, {"id": "b", "type": "crm.create"}],
        "1",
    )
    run = seed_run(
        db,
        "acme",
        wf,
        ver,
        [
            JournalRow("a", "succeeded"),
            JournalRow("b", "failed", block_type="crm.create", outcome_code="OUTCOME_UNKNOWN"),
        ],
        event_id=event,
        record_key=record_key,
    )

    minted = subprocess.run(
        [
            sys.executable,
            "-m",
            "shared.ops.tokens",
            "create",
            "--tenant",
            "acme",
            "--label",
            "support",
        ],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = minted.stdout.strip()
    assert token.startswith("ofo_") and "\n" not in token
    assert "shown only this once" in minted.stderr
    unknown = subprocess.run(
        [sys.executable, "-m", "shared.ops.tokens", "create", "--tenant", "nobody"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unknown.returncode == 2 and unknown.stdout == ""

    assert httpx.get(f"{ops_process}/v1/runs", timeout=10).status_code == 401
    assert httpx.get(f"{ops_process}/openapi.json", timeout=10).json()["openapi"] == "3.1.0"
    h = {"Authorization": f"Bearer {token}"}
    dead = httpx.get(
        f"{ops_process}/v1/runs", params={"status": "failed"}, headers=h, timeout=10
    ).json()
    assert [r["id"] for r in dead["items"]] == [run]
    r = httpx.post(
        f"{ops_process}/v1/runs/{run}/replay", json={"reason": "checked"}, headers=h, timeout=30
    )
    assert r.status_code == 201, r.text
    new_run = r.json()["run"]["id"]
    with db.transaction() as tx:
        step_id = str(
            tx.scalar(
                "SELECT id FROM workflow_steps WHERE run_id = :r AND status = 'pending'", r=new_run
            )
        )
    assert pubsub.pull_ids(STEP_READY, count=1, timeout=20) == [step_id]
