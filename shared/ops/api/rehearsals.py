"""Rehearsals: `/v1/rehearsals` — a dry run of a workflow version (shared/ops/rehearsal.py)."""

from __future__ import annotations

from shared.ops import rehearsal
from shared.ops.api.http import Call
from shared.ops.api.workflows import owned_workflow
from shared.ops.models import RehearsalRequest, RehearsalResult


def rehearse(call: Call) -> RehearsalResult:
    body: RehearsalRequest = call.body
    owned_workflow(call, str(body.workflow_id))
    start = rehearsal.start_rehearsal(call.db, body, call.scope)
    rehearsal.drive_rehearsal(call.db, start.run_id)
    return rehearsal.rehearsal_result(call.db, start.run_id)
