"""A run parked on an approval, through the real step engine: shared by the approval tests
of each channel (tests/test_approvals_slack.py, tests/test_approvals_email.py)."""

from __future__ import annotations

from typing import Any

from shared.core.db import Database
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import definition, publish_version, start_run, steps_of
from tests.test_steps_engine import Queue


def park_approval(db: Database, approval: dict[str, Any]) -> tuple[str, int]:
    """A run whose `gate` step (config `approval`, then `apply`) waits for a decision: the
    run's id and the approval's."""
    nodes = [
        {"id": "gate", "type": "approval", "config": approval, "next": "apply"},
        {"id": "apply", "type": "test.noop"},
    ]
    run_id, ids = start_run(db, publish_version(db, definition(nodes)))
    q = Queue()
    q(ids)
    q.drain(db, block_lookup(Recorder()))
    gate = steps_of(db, run_id)["gate"]
    assert gate["status"] == "waiting_for_approval"
    return run_id, int(gate["park_id"])
