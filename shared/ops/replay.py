"""Replay and retry of failed runs (DESIGN invariants 11 and 12).

Replay: a new live run linked to the failed one (`replay_of`, same `lineage_root`), pinned to
the same version, with the settled steps copied and the roots of the reset region created
again as pending, carrying the idempotency key their step key first had in the lineage. The
step engine keys side effects and charges by that key, so the provider sees the same
operation and the ledger's unique `lineage_key` turns a second charge into a no-op.

Retry: the same failed run reopened in place (the dead-letter entry leaves the list), its
root steps back to pending with a fresh attempt budget and their keys unchanged.

A cancelled run is replayed like a failed one: its skipped steps are the roots.

Both refuse, with a code and words: runs that are not failed (or, for a replay, cancelled),
runs already replayed (replay the newest run of the lineage instead), lineages older than 60
days, and truncated payloads (a replay would run on a payload that is not the one the provider
sent).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from shared.core import pubsub
from shared.core.db import Database, Tx
from shared.core.errors import ConflictError, TransientError
from shared.core.logs import get_logger
from shared.ops.errors import OpsError, not_found
from shared.ops.replay_plan import JournalStep, ReplayPlan, plan_replay
from shared.ops.statements import (
    ACTIVE_VERSION,
    EVENT_GET,
    LINEAGE_OLDEST_KEYS,
    LINEAGE_ROOT_CREATED,
    REPLAY_FORGET_AI_ANSWERS,
    REPLAY_RUN_INSERT,
    REPLAY_STEP_RESTART,
    REPLAY_STEPS_COPY,
    REPLAYS_OF,
    RETRY_RUN_REOPEN,
    RETRY_STEP_RESET,
    RUN_GET,
    RUN_LOCK,
    RUN_STEPS,
    VERSION_DEFINITION,
    WORKFLOW_VERSIONS,
)
from shared.steps.journal import idempotency_key
from shared.workflows.definition import WorkflowDefinition

REPLAY_WINDOW = timedelta(days=60)
PAYLOAD_LIMIT_TEXT = "64 KiB"

log = get_logger(__name__)

Dispatch = Callable[[Sequence[str]], None]


@dataclass(frozen=True)
class ReplayOutcome:
    run_id: str
    tenant_id: str
    plan: ReplayPlan
    restarted_step_ids: tuple[str, ...]


def _journal(tx: Tx, run_id: str) -> list[JournalStep]:
    return [
        JournalStep(
            id=str(s["id"]),
            step_key=s["step_key"],
            node_id=s["node_id"],
            block_type=s["block_type"],
            status=s["status"],
            branch_choice=s["branch_choice"],
            idempotency_key=s["idempotency_key"],
            finished_at=s["finished_at"],
        )
        for s in tx.all(RUN_STEPS, run_id=run_id)
    ]


# A cancelled run keeps its journal and may be replayed (its skipped steps start again); only
# a failed run is retried in place.
REPLAYABLE = ("failed", "cancelled")
RETRYABLE = ("failed",)


def _checked_failed_run(
    tx: Tx,
    run_id: str,
    tenant_scope: str | None,
    now: datetime,
    allowed: tuple[str, ...] = RETRYABLE,
) -> dict[str, Any]:
    """The run, locked through its lineage root, if it may be replayed or retried."""
    run = tx.one(RUN_GET, run_id=run_id, namespace="live", tenant_id=tenant_scope)
    if run is None:
        raise not_found("run")
    tx.one(RUN_LOCK, lineage_root=str(run["lineage_root"]))
    # Re-read under the lock: a concurrent replay or retry may have moved it, and retention
    # (shared/sweep/retention.py), which held the same lock, may have deleted the whole lineage.
    run = tx.one(RUN_GET, run_id=run_id, namespace="live", tenant_id=tenant_scope)
    if run is None:
        raise not_found("run")
    if run["status"] not in allowed:
        raise OpsError(
            409,
            "run_not_failed",
            f"only failed or cancelled runs can be replayed (a succeeded one too, from a "
            f"chosen step), and failed runs retried; this one is {run['status']}",
        )
    later = tx.one(REPLAYS_OF, run_id=run_id)
    if later is not None:
        raise OpsError(
            409,
            "already_replayed",
            f"this run was already replayed by run {later['id']} "
            f"({later['status']}); replay the newest run of the lineage instead",
        )
    root_created = tx.scalar(LINEAGE_ROOT_CREATED, lineage_root=str(run["lineage_root"]))
    if now - root_created > REPLAY_WINDOW:
        raise OpsError(
            409,
            "replay_window_expired",
            f"the lineage started {root_created.date().isoformat()}; replays are "
            f"allowed for {REPLAY_WINDOW.days} days",
        )
    truncated = bool(run["payload_truncated"])
    if not truncated and run["event_id"] is not None:
        event = tx.one(EVENT_GET, event_id=run["event_id"], tenant_id=run["tenant_id"])
        truncated = bool(event and event["payload_truncated"])
    if truncated:
        raise OpsError(
            409,
            "payload_truncated",
            f"the stored trigger payload was truncated at its {PAYLOAD_LIMIT_TEXT} "
            "limit; replaying it would run on data the provider never sent",
        )
    return run


def _definition(tx: Tx, version_id: str) -> WorkflowDefinition:
    return WorkflowDefinition.model_validate(tx.scalar(VERSION_DEFINITION, version_id=version_id))


def _plan(
    tx: Tx,
    run: dict[str, Any],
    *,
    definition: WorkflowDefinition | None = None,
    from_step: str | None = None,
) -> tuple[ReplayPlan, list[JournalStep]]:
    """The plan on `definition` (the run's own version's when None), from the step key
    `from_step` (a step the run reached) or, when None, from the first failure."""
    definition = definition or _definition(tx, str(run["version_id"]))
    journal = _journal(tx, str(run["id"]))
    busy = [s.step_key for s in journal if s.status == "running"]
    if busy:
        # Its executor may still be calling out; starting it again now could make the same
        # call twice at once. The sweep settles or reclaims it when its lease expires.
        raise OpsError(
            409,
            "step_still_running",
            f"step {busy[0]} of this run is still running under a lease; "
            "try again once it has settled or its lease has expired",
        )
    start = None
    if from_step is not None:
        start = next((s for s in journal if s.step_key == from_step), None)
        if start is None:
            raise OpsError(
                422,
                "step_not_in_run",
                f"step {from_step} never ran in this run; replay from a step it reached "
                f"({', '.join(s.step_key for s in journal) or 'none'})",
            )
    plan = plan_replay(definition, journal, start)
    if not plan.restart:
        raise OpsError(
            409, "nothing_to_replay", "the run has no failed or unfinished step to start again from"
        )
    return plan, journal


@contextmanager
def _one_active_run_per_record(then: str) -> Iterator[None]:
    """A replay or retry starts a live run of the workflow for the record; the unique index
    `workflow_runs_one_active_per_record` refuses it while another one runs. The refusal has
    admission's name for the same rule (`already_running`); `then` is what to do once that
    run finished."""
    try:
        yield
    except ConflictError as exc:
        raise OpsError(
            409,
            "already_running",
            f"another run of this workflow is active for this record; wait for it "
            f"to finish, then {then}",
        ) from exc


# A replay from a chosen step may also start over a run that succeeded (the person wants a
# later step done again, e.g. on the fixed version); from the first failure it needs one.
REPLAYABLE_FROM_STEP = (*REPLAYABLE, "succeeded")

OnVersion = Literal["run", "current"]


def _target_version(tx: Tx, run: dict[str, Any], on_version: OnVersion) -> tuple[str, str]:
    """The version the replay runs on, and how to name it in a refusal."""
    if on_version == "run":
        return str(run["version_id"]), f"version {run['version_number']} (the run's)"
    active = tx.scalar(ACTIVE_VERSION, workflow_id=str(run["workflow_id"]))
    if active is None:
        raise OpsError(
            409,
            "no_current_version",
            "the workflow has no active version to replay on; activate one, or replay on "
            "the run's own version",
        )
    number = next(
        v["number"]
        for v in tx.all(WORKFLOW_VERSIONS, workflow_id=str(run["workflow_id"]))
        if str(v["id"]) == str(active)
    )
    return str(active), f"version {number} (the workflow's current one)"


def _fits_version(plan: ReplayPlan, definition: WorkflowDefinition, named: str) -> None:
    """Every step the replay keeps or starts again exists in the target version: a copied step
    whose node is gone (or now another block) would feed later steps outputs the version never
    produces, and a restarted one would have nothing to run. Refused with the step named."""
    for s in (*plan.restart, *plan.copy):
        try:
            node = definition.step(s.node_id)
        except KeyError:
            raise OpsError(
                422,
                "step_not_in_version",
                f"step {s.step_key} does not exist in {named}; the replay needs it "
                + ("to start from" if s in plan.restart else "to keep its earlier result"),
            ) from None
        if s in plan.copy and node.type != s.block_type:
            raise OpsError(
                422,
                "step_changed_in_version",
                f"step {s.step_key} is a {node.type} block in {named}, but ran as "
                f"{s.block_type}; its kept result would not fit. Replay from it or earlier",
            )


def replay_run(
    db: Database,
    *,
    run_id: str,
    tenant_scope: str | None,
    dispatch: Dispatch = pubsub.publish_step_ready,
    now: datetime | None = None,
    from_step: str | None = None,
    on_version: OnVersion = "run",
    edited_input: Mapping[str, Any] | None = None,
    by: str | None = None,
    fresh_ai_answers: bool = False,
) -> ReplayOutcome:
    """A new run of the lineage: from `from_step` (a step key the run reached; the first
    failure when None), on the run's version or the workflow's current one, the chosen step
    running on `edited_input` when given. Steps before the chosen one are copied, never run
    again; the chosen step and what follows it run under the lineage's oldest keys, so the
    provider and the ledger see the same operations (no second charge).

    `fresh_ai_answers`: the steps this replay runs again ask the model afresh instead of
    reusing the answers journaled under their lineage keys (an AI step settled before the
    chosen step is copied, as every settled step is)."""
    now = now or datetime.now(UTC)
    if edited_input is not None and from_step is None:
        raise OpsError(
            422, "input_needs_step", "an edited input is for the step replayed from: name it"
        )
    allowed = REPLAYABLE_FROM_STEP if from_step is not None else REPLAYABLE
    with _one_active_run_per_record("replay"), db.transaction() as tx:
        run = _checked_failed_run(tx, run_id, tenant_scope, now, allowed)
        version_id, named = _target_version(tx, run, on_version)
        definition = _definition(tx, version_id)
        plan, _ = _plan(tx, run, definition=definition, from_step=from_step)
        _fits_version(plan, definition, named)
        lineage_root = str(run["lineage_root"])
        oldest = {
            r["step_key"]: r["idempotency_key"]
            for r in tx.all(LINEAGE_OLDEST_KEYS, lineage_root=lineage_root)
        }
        new_run_id = str(
            tx.scalar(
                REPLAY_RUN_INSERT,
                run_id=run_id,
                version_id=version_id,
                start_key=f"replay:{uuid.uuid4()}",
                replay_from=from_step,
                replay_by=by,
            )
        )
        if plan.copy:
            tx.execute(REPLAY_STEPS_COPY, new_run_id=new_run_id, step_ids=[s.id for s in plan.copy])
        keys = {
            s.step_key: oldest.get(s.step_key) or idempotency_key(lineage_root, s.step_key)
            for s in plan.reset
        }
        restarted = []
        for s in plan.restart:
            edited = edited_input is not None and s.step_key == from_step
            restarted.append(
                str(
                    tx.scalar(
                        REPLAY_STEP_RESTART,
                        new_run_id=new_run_id,
                        step_key=s.step_key,
                        node_id=s.node_id,
                        block_type=definition.step(s.node_id).type,
                        idempotency_key=keys[s.step_key],
                        input=None,
                        input_override=json.dumps(dict(edited_input or {})) if edited else None,
                        input_edited_by=by if edited else None,
                    )
                )
            )
        if fresh_ai_answers:
            tx.execute(REPLAY_FORGET_AI_ANSWERS, keys=sorted(set(keys.values())))
    dispatch_committed(dispatch, tuple(restarted))
    return ReplayOutcome(
        run_id=new_run_id,
        tenant_id=run["tenant_id"],
        plan=plan,
        restarted_step_ids=tuple(restarted),
    )


def retry_run(
    db: Database,
    *,
    run_id: str,
    tenant_scope: str | None,
    dispatch: Dispatch = pubsub.publish_step_ready,
    now: datetime | None = None,
) -> ReplayOutcome:
    now = now or datetime.now(UTC)
    with _one_active_run_per_record("retry"), db.transaction() as tx:
        run = _checked_failed_run(tx, run_id, tenant_scope, now)
        plan, _ = _plan(tx, run)
        if tx.execute(RETRY_RUN_REOPEN, run_id=run_id) != 1:
            raise OpsError(409, "run_not_failed", "the run is no longer failed")
        restarted = tuple(
            str(r["id"]) for r in tx.all(RETRY_STEP_RESET, step_ids=[s.id for s in plan.restart])
        )
    dispatch_committed(dispatch, restarted)
    return ReplayOutcome(
        run_id=run_id, tenant_id=run["tenant_id"], plan=plan, restarted_step_ids=restarted
    )


def dispatch_committed(dispatch: Dispatch, step_ids: tuple[str, ...]) -> None:
    # The rows are committed; a lost publish leaves them pending with dispatched_at NULL,
    # which the sweep re-dispatches. So a failed publish is logged, not an error.
    try:
        dispatch(step_ids)
    except TransientError as exc:
        log.warning("step-ready publish failed; the sweep will re-dispatch: %s", exc)
    except Exception as exc:  # the client library's own errors (no emulator, no credentials)
        log.warning("step-ready publish failed; the sweep will re-dispatch: %r", exc)
