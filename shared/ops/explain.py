""" "Why didn't it run for this record?": every event seen for a record and what each workflow
decided about it, in plain words.

A decision comes from the rows admission leaves behind: a run (admitted), a refusal (refused,
with its reason), or neither yet (the event is still on its way: unpublished, or admission has
not reached it, with how often the sweep has published it again), or neither ever (the sweep
gave it up as undelivered: ops can re-queue it). Workflows bound to the event's type today
are listed even when they have not decided, so "no workflow listens to this event" and
"still waiting" are visible too. Webhooks of the record's connection that could not be
drained (dead or rejected inbox rows) are listed beside, since any of them may have
concerned the record.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from shared.core import queries
from shared.core.db import Tx
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    Decision,
    EventDecisions,
    RecordDrop,
    RecordExplanation,
    RunSummary,
    StuckInboxRow,
    WebhookRefusalCount,
)
from shared.ops.statements import (
    BINDINGS_FOR_TENANT,
    CONNECTION_TENANT,
    RECORD_CLAIMS,
    RECORD_EVENTS,
    RECORD_REFUSALS,
    RECORD_RUNS,
)

STUCK_INBOX = queries.load("inbox")["inbox_dead_list"]
STUCK_INBOX_SHOWN = 20
RECORD_DROPS = queries.load("drops")["drops_for_record"]
CONNECTION_REFUSALS = queries.load("drops")["webhook_refusals_for_connection"]
DROPS_SHOWN = 100
HELD_IN_BURSTS = queries.load("debounce")["debounce_held_for_events"]
WAITING_TO_START = queries.load("run_throttle")["run_throttle_waiting_for_events"]

MAX_EVENTS = 500

REASON_WORDS = {
    "duplicate": "This record already went through this workflow once, and the workflow runs "
    "once per record.",
    "already_running": "A run of this workflow was still in progress for this record, and the "
    "workflow does not start a second one while one is running.",
    "rule_not_matched": "The workflow's trigger rule did not match the record at that moment.",
    "insufficient_credits": "The account did not have enough credits to start the run.",
    "echo_suppressed": "This change was made by onceflow itself, so it did not trigger again.",
    "provider_suppressed": "The change was made by an author excluded from triggering workflows.",
    "missing_record_identity": "The event did not say which record it was about.",
    "workflow_paused": "The workflow was paused by its circuit breaker after several runs in a "
    "row failed; it starts no runs until someone resumes it.",
    "definition_unreadable": "The workflow's active version could not be read by this release "
    "of onceflow, so it did not start; publish and activate the workflow again.",
    "superseded": "The workflow waits for a record's changes to settle (debounce): a later "
    "change of the same burst started the run instead, and that run lists this change among "
    "the burst's events.",
    "batched": "The workflow handles its events in batches: this one was gathered into a "
    "batch whose run (named in the detail) handles it, listed among the batch's events.",
}


def explain_breaker(state: str, reason: str | None) -> str:
    if state == "open":
        return (
            f"Paused by its circuit breaker ({reason}): its events are refused "
            "(workflow_paused) until someone resumes it (POST /v1/workflows/{id}/resume)."
        )
    if state == "half_open":
        return (
            "Resumed on trial: a few runs are admitted (the events after them are refused "
            "workflow_paused until one ends); the next run that succeeds closes the "
            "breaker, the next that fails pauses the workflow again."
        )
    return "Running normally: the circuit breaker is closed."


def explain_drop(
    reason: str, fields: dict[str, Any], object_type: str, source_event_id: str | None
) -> str:
    """A pre-admission drop (shared/ingest/drops.py) in plain words, with what to do about it."""
    names = ", ".join(sorted(fields)) or "a property"
    if reason == "not_watched":
        return (
            f"The change of {names} was received, but no active workflow watches "
            f"{'that field' if len(fields) == 1 else 'those fields'} on {object_type} records "
            "(neither a trigger's `watch` list nor a wait_for that reads it), so it did not "
            "become an event. To react to it, add the field to a workflow trigger's `watch` "
            "list (or a wait's) and publish the workflow."
        )
    if reason == "unchanged":
        return (
            f"The new value of {names} was the same as the last one onceflow saw for this "
            "record, so nothing changed and no event was made (HubSpot announces no-op saves, "
            "and onceflow's own writes come back this way)."
        )
    if reason == "out_of_order":
        return (
            f"This change of {names} happened before a change onceflow had already applied to "
            "this record (it arrived late); applying it would move the record back in time, so "
            "it was dropped."
        )
    return (
        f"HubSpot announced this same change again (event {source_event_id or 'without an id'}); "
        "the first announcement already counted, so it made no second event."
    )


def explain_webhook_refusal(check: str) -> str:
    """A delivery refused at the door (shared/ingest/receive.py), in plain words."""
    if check.endswith("_mismatch"):
        return (
            "The signature did not match: check the app secret. The connection's webhook "
            "secret must be the one of the provider app that sends these webhooks."
        )
    if check == "timestamp_stale":
        return (
            "The request was signed too long ago: check the sender's clock, or whether "
            "something is replaying old requests."
        )
    if (
        check.endswith("_missing")
        or check.endswith("_malformed")
        or check == "credentials_not_basic"
    ):
        return (
            "The request carried no usable signature: is this URL configured in another app, "
            "or called by something other than the provider?"
        )
    if check.endswith("_not_enabled"):
        return (
            "The provider signed with an older signature version this connection does not "
            "accept: enable it on the connection (signature_versions) or use a v3 app."
        )
    if check == "connection_disconnected":
        return "The connection is disconnected, so its webhooks are refused: reconnect it."
    return f"Refused at the door ({check})."


def explain_reason(reason: str) -> str:
    return REASON_WORDS.get(reason, f"Refused ({reason}).")


def explain_stuck_inbox(status: str, last_error: str | None) -> str:
    if status == "dead":
        return (
            "This webhook was verified and stored, but processing it kept failing "
            f"({last_error or 'no error recorded'}); it will not be retried by itself. Fix the "
            "cause, then re-queue it (POST /v1/inbox/{id}/requeue)."
        )
    return (
        "This webhook was verified and stored, but its body could not be read as events "
        f"({last_error or 'no error recorded'}); re-queueing cannot help."
    )


def stuck_inbox_rows(rows: list[dict[str, Any]]) -> list[StuckInboxRow]:
    return [
        StuckInboxRow.model_validate(
            {**r, "explanation": explain_stuck_inbox(r["status"], r["last_error"])}
        )
        for r in rows
    ]


def explain_run(status: str, error: str | None) -> str:
    if status == "succeeded":
        return "It ran and finished successfully."
    if status == "running":
        return "It is running now."
    if status == "failed":
        return f"It ran and failed: {error}" if error else "It ran and failed."
    if status == "goal_met":
        return "It ran until an event about its record met the workflow's goal."
    return "It ran and was cancelled."


def parse_record_key(record_key: str) -> tuple[str, str, str]:
    """`<connection uuid>:<object type>:<object id>` (the object id may contain ':')."""
    parts = record_key.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise OpsError(
            422,
            "invalid_record_key",
            "record_key must look like <connection id>:<object type>:<object id>",
        )
    connection_id, object_type, object_id = parts
    try:
        connection_id = str(uuid.UUID(connection_id))
    except ValueError as exc:
        raise OpsError(
            422, "invalid_record_key", "record_key must start with a connection id (a UUID)"
        ) from exc
    return connection_id, object_type, object_id


def explain_record(tx: Tx, *, record_key: str, tenant_scope: str | None) -> RecordExplanation:
    connection_id, object_type, object_id = parse_record_key(record_key)
    tenant_id = tx.scalar(CONNECTION_TENANT, connection_id=connection_id)
    if tenant_id is None or (tenant_scope is not None and tenant_id != tenant_scope):
        raise not_found("record")
    record = {
        "tenant_id": tenant_id,
        "connection_id": connection_id,
        "object_type": object_type,
        "object_id": object_id,
    }
    events = tx.all(RECORD_EVENTS, **record, limit=MAX_EVENTS)
    event_ids = [int(e["id"]) for e in events]
    runs = tx.all(RECORD_RUNS, tenant_id=tenant_id, record_key=record_key, event_ids=event_ids)
    decided = _event_decisions(tx, tenant_id, events, runs)
    stuck = tx.all(
        STUCK_INBOX, tenant_id=tenant_id, connection_id=connection_id, limit=STUCK_INBOX_SHOWN
    )
    drops = tx.all(RECORD_DROPS, **record, limit=DROPS_SHOWN)
    refused = tx.all(CONNECTION_REFUSALS, connection_id=connection_id)
    return RecordExplanation(
        record_key=record_key,
        webhook_refusals=[
            WebhookRefusalCount.model_validate(
                {**r, "explanation": explain_webhook_refusal(r["check_name"])}
            )
            for r in refused
        ],
        events=decided,
        drops=[_drop(d, object_type) for d in drops],
        runs=[RunSummary.model_validate(r) for r in runs],
        stuck_inbox=stuck_inbox_rows(stuck),
    )


def _event_decisions(
    tx: Tx, tenant_id: str, events: list[dict[str, Any]], runs: list[dict[str, Any]]
) -> list[EventDecisions]:
    """Each event with what every workflow that decided, or is bound to decide, made of it."""
    event_ids = [int(e["id"]) for e in events]
    refusals = tx.all(RECORD_REFUSALS, tenant_id=tenant_id, event_ids=event_ids)
    claims = tx.all(RECORD_CLAIMS, tenant_id=tenant_id, event_ids=event_ids)
    held = {
        (int(h["event_id"]), h["workflow_id"]): h
        for h in tx.all(HELD_IN_BURSTS, tenant_id=tenant_id, event_ids=event_ids)
    }
    waiting = {
        (int(w["event_id"]), w["workflow_id"]): w
        for w in tx.all(WAITING_TO_START, tenant_id=tenant_id, event_ids=event_ids)
    }
    bindings = tx.all(BINDINGS_FOR_TENANT, tenant_id=tenant_id)
    runs_by_event: dict[tuple[int, str], dict[str, Any]] = {}
    for r in runs:
        if r["event_id"] is not None and r["replay_of"] is None:
            runs_by_event.setdefault((int(r["event_id"]), str(r["workflow_id"])), r)
    refusals_by_event = {(int(f["event_id"]), str(f["workflow_id"])): f for f in refusals}
    names: dict[str, str] = {}
    bound: dict[str, list[str]] = {}
    for b in bindings:
        names[str(b["workflow_id"])] = b["workflow_name"]
        bound.setdefault(b["event_type"], []).append(str(b["workflow_id"]))
    for rows in (runs, refusals, claims):
        for row in rows:
            names.setdefault(str(row["workflow_id"]), row["workflow_name"])
    out: list[EventDecisions] = []
    for e in events:
        eid = int(e["id"])
        workflow_ids = dict.fromkeys(
            [w for (ev, w) in runs_by_event if ev == eid]
            + [w for (ev, w) in refusals_by_event if ev == eid]
            + [str(c["workflow_id"]) for c in claims if int(c["event_id"]) == eid]
            + bound.get(e["event_type"], [])
        )
        decisions = [
            _held_decision(wid, names[wid], held[(eid, wid)])
            if (eid, wid) in held
            else _waiting_decision(wid, names[wid], waiting[(eid, wid)])
            if (eid, wid) in waiting
            else _decision(eid, wid, names[wid], runs_by_event, refusals_by_event, e)
            for wid in workflow_ids
        ]
        out.append(_event_view(e, decisions))
    return out


def _event_view(e: dict[str, Any], decisions: list[Decision]) -> EventDecisions:
    # The row's id is the event's; its created_at is when onceflow received it.
    return EventDecisions.model_validate(
        {**e, "event_id": e["id"], "received_at": e["created_at"], "decisions": decisions}
    )


def _drop(d: dict[str, Any], object_type: str) -> RecordDrop:
    why = explain_drop(d["reason"], d["fields"] or {}, object_type, d["source_event_id"])
    return RecordDrop.model_validate({**d, "explanation": why})


def _held_decision(workflow_id: str, name: str, held: dict[str, Any]) -> Decision:
    """A pairing held in a debounce burst (shared/admission/debounce.py) not fired yet."""
    return Decision(
        workflow_id=workflow_id,
        workflow_name=name,
        outcome="undecided",
        explanation=(
            "The workflow waits for this record's changes to settle (debounce): this event is "
            f"held in a burst of {held['event_count']} event(s), whose last is event "
            f"{held['last_event_id']}. At {held['fire_at'].isoformat()}, unless another change "
            f"comes first, that last event starts run {held['run_id']} and the others are "
            "refused `superseded`."
        ),
    )


def _waiting_decision(workflow_id: str, name: str, waiting: dict[str, Any]) -> Decision:
    """A pairing waiting in the run-start queue: behind a throttle's full window
    (shared/admission/run_throttle.py) or for a keyed-concurrency slot
    (shared/admission/concurrency.py)."""
    if waiting["gate"] == "concurrency":
        explanation = (
            f"The workflow runs at most {waiting['limit_per_window']} run(s) at once for this "
            f"event's key (concurrency), and that many were running: this event waits its "
            f"turn, with {waiting['ahead']} ahead of it. Its run starts when a run of the key "
            "ends; it is not refused."
        )
    else:
        explanation = (
            f"The workflow starts at most {waiting['limit_per_window']} run(s) per "
            f"{waiting['window_seconds']} s (throttle), and that window was full: this event "
            f"waits its turn, with {waiting['ahead']} ahead of it. Its run starts when a window "
            f"has room (the next from {waiting['due_at'].isoformat()}); it is not refused."
        )
    return Decision(
        workflow_id=workflow_id, workflow_name=name, outcome="undecided", explanation=explanation
    )


def _decision(  # noqa: PLR0917 - one call site, positional reads best
    event_id: int,
    workflow_id: str,
    name: str,
    runs: dict[tuple[int, str], dict[str, Any]],
    refusals: dict[tuple[int, str], dict[str, Any]],
    event: dict[str, Any],
) -> Decision:
    decision = partial(Decision, workflow_id=workflow_id, workflow_name=name)
    run = runs.get((event_id, workflow_id))
    if run is not None:
        return decision(
            outcome="admitted",
            run_id=run["id"],
            run_status=run["status"],
            explanation=explain_run(run["status"], run["error"]),
        )
    refusal = refusals.get((event_id, workflow_id))
    if refusal is not None:
        return decision(
            outcome="refused",
            reason=refusal["reason"],
            detail=refusal["detail"],
            explanation=explain_reason(refusal["reason"]),
        )
    if event["undelivered_at"] is not None:
        return decision(
            outcome="undelivered",
            detail=event["undelivered_reason"],
            explanation=(
                "onceflow could not get this event decided and gave up: "
                f"{event['undelivered_reason']}. Once the cause is fixed, re-queue it "
                f"(POST /v1/events/{event_id}/requeue); admission then decides as usual."
            ),
        )
    if event["published_at"] is None:
        waiting = "The event has not been published to admission yet."
        if event["redeliveries"]:
            waiting = (
                f"Admission had not decided after {event['redeliveries']} publish(es); it is "
                "queued to be published again."
            )
    else:
        waiting = "Admission has not decided about this event yet."
        if event["redeliveries"]:
            waiting += f" (published again {event['redeliveries']} time(s) so far)"
    return decision(outcome="undecided", explanation=waiting)
