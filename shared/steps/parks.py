"""Park and resume: the one mechanism behind `wait_for` (an event) and `approval` (a decision).

    block asks to park ─► park row written and COMMITTED (conditions, deadline, who decides)
                      ─► settle: step → waiting_for_event / waiting_for_approval, wake_at =
                         the deadline, the park marked parked; an event wait takes the event
                         noted on the park, or looks back for events it may have missed
    resumers, each ONE guarded UPDATE of the step row that also closes the park row:
      a matching event (admission's offer, or the parking)    steps_resume_parked
      a decision (ops approve / reject)                        steps_resume_parked
      the deadline (the sweep, through the wake-time index)    steps_wake_due
      a cancel (ops)                                           runs_cancel
    the resumed step is pending with what resumed it in its output; the executor settles it
    from that (outcomes.resumed_settlement) without running its block again.

Whoever commits first wins; the others match zero rows and read the park row to say who won
("already resumed by event 42 at …"). The park row is committed before the step parks, so
every event committed after it is offered to it by admission. An event offered while the step
is not waiting yet (between the park row's commit and the parking settle's) can't resume it:
it is noted on the park row instead (`early_event_id`, the first one), and the parking settle
marks the park parked (`parked_at`) and resumes the step with it. Note and mark are guarded
writes of the park row, so its lock orders them: a note that meets the parking's lock finds
the park parked and resumes the now waiting step itself. No event falls between the two.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.blocks.base import ParkRequest
from shared.blocks.waits import await_key
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.logs import get_logger
from shared.ingest import outbound
from shared.ingest.echo import (
    ECHO_CLOCK_SKEW_SECONDS,
    authored_elsewhere,
    is_echo,
    markers_from_json,
)
from shared.workflows.expressions import ExpressionError, evaluate_condition
from shared.workflows.scope import Occurrence, wait_scope

SQL = queries.load("steps")
OPEN = SQL["parks_open"]
GET = SQL["parks_get"]
LOOKBACK_EVENTS = SQL["parks_lookback_events"]
NOTE_EARLY_EVENT = SQL["parks_note_early_event"]
MARK_PARKED = SQL["parks_mark_parked"]
RESUME = SQL["steps_resume_parked"]
LOCK_STEP = SQL["parks_lock_waiting_step"]
VOTE = SQL["approvals_vote"]
TALLY = SQL["approvals_tally"]
QUEUE_ASKS = SQL["approvals_queue_asks"]
QUEUE_UPDATE = SQL["approvals_queue_update"]
REGISTER_CORRELATIONS = SQL["parks_register_correlations"]

# The most waits one event is offered to, and the most events one lookback reads: bounded
# work per admission and per park, whatever a tenant's workflows do.
MAX_WAITS_PER_EVENT = 1000
MAX_LOOKBACK_EVENTS = 200

log = get_logger(__name__)


@dataclass(frozen=True)
class OpenedPark:
    id: int
    kind: str
    deadline: datetime
    created_at: datetime


def open_park(
    db: Database, *, step_id: str, run_id: str, tenant_id: str, park: ParkRequest
) -> OpenedPark:
    """Write the park row and commit it, before the step parks. A step whose earlier attempt
    wrote one that is still open gets that row back: its deadline holds. A step whose earlier
    wait was resumed (and that an ops retry started again) gets a new one: it waits again."""
    with db.transaction() as tx:
        row = tx.one(
            OPEN,
            step_id=step_id,
            run_id=run_id,
            tenant_id=tenant_id,
            kind=park.kind,
            deadline=park.deadline,
            on_timeout=park.on_timeout,
            timeout_goto=park.timeout_goto,
            event_type=park.event_type,
            record_key=park.record_key,
            condition=park.condition,
            scope=None if park.scope is None else json.dumps(park.scope, default=str),
            lookback_seconds=park.lookback_seconds,
            approver_role=park.approver_role,
            approver_users=list(park.approver_users),
            summary=park.summary,
            mode=park.mode,
            awaits=None if park.mode is None else json.dumps([asdict(a) for a in park.awaits]),
            await_keys=None
            if park.mode is None
            else [await_key(tenant_id, a.event_type, a.on, a.value) for a in park.awaits],
            required=park.required,
            reject_quorum=park.reject_quorum,
            slack_channel=park.slack_channel,
            email=park.email,
            remind_at=park.remind_at,
            escalate_at=park.escalate_at,
            escalate_role=park.escalate_role,
            escalate_users=list(park.escalate_users),
        )
        assert row is not None  # an INSERT … ON CONFLICT DO UPDATE returns its row
        if park.mode is not None:
            _register_correlations(tx, tenant_id, park)
        if park.slack_channel is not None or park.email:
            # Asked through Slack or email: queued with the park, sent by the sweep.
            tx.execute(QUEUE_ASKS, park_id=row["id"])
        if park.kind == "approval":  # with its park row; keyed by it, so a retry adds none
            outbound.approval_requested(
                tx,
                tenant_id,
                row["id"],
                run_id=run_id,
                step_id=step_id,
                summary=park.summary,
                approver_role=park.approver_role,
                approver_users=list(park.approver_users),
                deadline=park.deadline,
            )
    return OpenedPark(
        id=int(row["id"]), kind=row["kind"], deadline=row["deadline"], created_at=row["created_at"]
    )


def _register_correlations(tx: Tx, tenant_id: str, park: ParkRequest) -> None:
    """A wait of several events or correlated beyond its record (shared/steps/awaits.py): the
    correlation expressions admission must compute for each awaited event type, committed
    with the park row."""
    pairs = sorted({(a.event_type, a.on) for a in park.awaits})
    tx.execute(
        REGISTER_CORRELATIONS,
        tenant_id=tenant_id,
        event_types=[t for t, _ in pairs],
        expressions=[on for _, on in pairs],
    )


@dataclass(frozen=True)
class Resumed:
    """A resume attempt's answer, whether or not it moved the step."""

    park_id: int
    moved: bool
    step_id: str | None = None
    resumed_at: datetime | None = None
    # The park row as it is now (None when it moved, or the park does not exist).
    park: Mapping[str, Any] | None = None
    # An approval's vote (decide_approval): `counted` (it counted: it resumed the step, or
    # the quorum still waits for more), `duplicate` (this approver had voted: nothing
    # changed), `late` (recorded after the approval closed: nothing changed); with the tally.
    vote: str | None = None
    approvals: int = 0
    rejections: int = 0
    required: int = 1

    @property
    def awaiting_quorum(self) -> bool:
        """The vote counted and the approval still waits for more votes."""
        return not self.moved and self.vote == "counted"

    @property
    def expired(self) -> str | None:
        """Why this came too late, in words: the wait's deadline had passed, whether or not the
        sweep has resumed it by its deadline yet (None when it moved, or was not too late)."""
        p = self.park
        if self.moved or p is None:
            return None
        if p["resumed_by"] != "deadline" and not (p["resumed_at"] is None and p["expired"]):
            return None
        what = "this approval expired" if p["kind"] == "approval" else "this wait ended"
        then = p["on_timeout"] if p["timeout_goto"] is None else f"go to {p['timeout_goto']}"
        return f"{what} at {p['deadline'].isoformat()} (then: {then})"

    @property
    def why_not(self) -> str | None:
        """Who resumed it first, in words (None when this one did)."""
        if self.moved:
            return None
        p = self.park
        if p is None:
            return "no such wait"
        if p["resumed_at"] is None and p["expired"] and p["run_status"] == "running":
            return f"{self.expired}; its deadline resumes it"
        at = p["resumed_at"].isoformat() if p["resumed_at"] else None
        said = {
            "event": f"already resumed by event {p['resumed_event_id']} at {at}",
            "decision": f"already decided by {p['decided_by']} at {at} ({p['decision']})",
            "deadline": f"already resumed by its deadline at {at}",
            "cancel": f"its run was cancelled at {at}",
            "goal": f"its run met its goal at {at}",
        }.get(p["resumed_by"])
        if said is not None:
            return said
        if p["run_status"] != "running":
            return f"its run already ended {p['run_status']}"
        if self.vote == "duplicate":
            said = "your decision was already recorded; a second one changes nothing"
        return said or f"the step is not waiting (it is {p['step_status']})"


def park_row(tx: Tx, park_id: int, tenant_scope: str | None = None) -> dict[str, Any] | None:
    return tx.one(GET, park_id=park_id, tenant_id=tenant_scope)


def resume_park(
    tx: Tx,
    park_id: int,
    *,
    by: str,
    output: Mapping[str, Any],
    event_id: int | None = None,
    decision: str | None = None,
    decided_by: str | None = None,
    comment: str | None = None,
) -> Resumed:
    """The guarded resume by an event or a decision (`steps_resume_parked`), in the caller's
    transaction. A loser reads the park row afresh (a new statement sees the winner's commit)
    to say who won."""
    resumed = {"by": by, "at": datetime.now(UTC).isoformat(), **output.get("resumed", {})}
    row = tx.one(
        RESUME,
        park_id=park_id,
        output=json.dumps({**output, "resumed": resumed}, default=str),
        resumed_by=by,
        event_id=event_id,
        decision=decision,
        decided_by=decided_by,
        comment=comment,
    )
    if row is not None:
        return Resumed(park_id, True, step_id=row["step_id"], resumed_at=row["resumed_at"])
    return Resumed(park_id, False, park=park_row(tx, park_id))


def event_output(incoming: Occurrence) -> dict[str, Any]:
    """The step's output when an event resumes it: the event as a trigger rule reads it."""
    return {
        "event": incoming.event(),
        "trigger": dict(incoming.payload),
        "record": incoming.record(),
        "resumed": {"kind": "event", "event_id": incoming.id},
    }


def wait_matches(condition: str, incoming: Occurrence, waiting: Any, park_id: int) -> bool:
    waiting = waiting or {}
    try:
        return evaluate_condition(condition, wait_scope(incoming, waiting))
    except ExpressionError as exc:
        # The wait's own condition can't be judged on this event: it does not match. The
        # deadline still ends the wait; the log says why it never matched.
        log.warning("wait %d: condition failed on event %s: %s", park_id, incoming.id, exc)
        return False


def offer_event(tx: Tx, incoming: Occurrence, open_waits: Sequence[Mapping[str, Any]]) -> list[str]:
    """Offer one admitted event to the open waits on its (tenant, type, record) — read by the
    admission's first statement through an index (`open_waits` of admission_context) — in
    the admission's transaction; the ids of the steps it resumed. Each resume is guarded, so
    a concurrent or redelivered admission of the same event resumes a wait at most once."""
    resumed: list[str] = []
    if incoming.id is None:
        return resumed
    for wait in open_waits:
        if not wait_matches(str(wait["condition"]), incoming, wait.get("scope"), int(wait["id"])):
            continue
        step_id = _resume_or_note(tx, int(wait["id"]), incoming)
        if step_id is not None:
            resumed.append(step_id)
    return resumed


def _resume_or_note(tx: Tx, park_id: int, incoming: Occurrence) -> str | None:
    """Resume the wait with the event; when its step is not waiting yet (the park row is
    committed, the settle that parks the step is not), note the event on the park row for
    that settle (`parked`) to resume it with. The id of the step resumed here, if any."""
    output = event_output(incoming)
    done = resume_park(tx, park_id, by="event", output=output, event_id=incoming.id)
    if done.moved:
        return done.step_id
    park = done.park
    if park is None or park["resumed_at"] is not None or park["run_status"] != "running":
        return None  # resumed by someone else, or the run ended: nothing to wait for
    if park["parked_at"] is None and tx.one(
        NOTE_EARLY_EVENT, park_id=park_id, event_id=incoming.id
    ):
        return None  # noted: the parking settle resumes the step with this event
    # The step parked after this transaction's resume read it (the note met the parking
    # settle's lock and then found the park parked): this statement sees the committed park.
    again = resume_park(tx, park_id, by="event", output=output, event_id=incoming.id)
    return again.step_id if again.moved else None


def parked(tx: Tx, park: OpenedPark, request: ParkRequest, *, tenant_id: str) -> str | None:
    """The step has just been parked on `park`, in the settle's transaction: the park is marked
    parked, and an event wait looks for the event that resumes it at once — the one admission
    noted on the park while the step was not waiting yet, else the first already-recorded
    event that matches it (of its type, on its record, recorded since the park row was written
    or within its lookback before, not an echo of onceflow's own write). The step id when one
    resumed it."""
    marked = tx.one(MARK_PARKED, park_id=park.id)
    if marked is None or park.kind != "event":
        return None
    if request.record_key is None or request.event_type is None or request.condition is None:
        return None
    _, object_type, object_id = _split_record_key(request.record_key)
    since = park.created_at - timedelta(seconds=request.lookback_seconds)
    for row in tx.all(
        LOOKBACK_EVENTS,
        tenant_id=tenant_id,
        object_type=object_type,
        object_id=object_id,
        event_type=request.event_type,
        since=since,
        early_event_id=marked["early_event_id"],
        echo_skew_seconds=float(ECHO_CLOCK_SKEW_SECONDS),
        limit=MAX_LOOKBACK_EVENTS,
    ):
        incoming = Occurrence.from_row(row)
        if incoming.record_key != request.record_key:
            continue  # same object on another connection
        elsewhere = authored_elsewhere(
            row["connection_provider"],
            author_source=row["author_source"],
            author_id=row["author_id"],
            connection_user_id=row["connection_user_id"],
        )
        if is_echo(
            incoming.changed_fields, markers_from_json(row["echo_markers"]), elsewhere=elsewhere
        ):
            continue  # onceflow's own write coming back: no answer (admission skips it too)
        if not wait_matches(request.condition, incoming, request.scope, park.id):
            continue
        done = resume_park(
            tx, park.id, by="event", output=event_output(incoming), event_id=incoming.id
        )
        return done.step_id if done.moved else None
    return None


def _split_record_key(key: str) -> tuple[str, str, str]:
    """`connection:object_type:object_id` (shared/workflows/scope.record_key) back apart."""
    connection, object_type, object_id = key.split(":", 2)
    return connection, object_type, object_id


class NotAllowed(PermissionError):
    """The caller is not among the people an approval names."""


def may_decide(park: Mapping[str, Any], *, user: str, roles: Sequence[str]) -> bool:
    """Whether `user` (with `roles`) is among those the approval names — once it escalated
    (`escalated_at`), those it escalated to as well."""
    users = list(park["approver_users"] or ())
    role_names = [park["approver_role"]] if park["approver_role"] else []
    if park.get("escalated_at") is not None:
        users += park.get("escalate_users") or ()
        role_names += [park["escalate_role"]] if park.get("escalate_role") else []
    return user in users or any(r in roles for r in role_names)


def deciders(park: Mapping[str, Any]) -> str:
    """Who may decide, in words ("role manager or user erin")."""
    who = [f"role {park['approver_role']}"] if park["approver_role"] else []
    who += [f"user {u}" for u in park["approver_users"] or ()]
    if park.get("escalated_at") is not None:
        who += [f"role {park['escalate_role']}"] if park.get("escalate_role") else []
        who += [f"user {u}" for u in park.get("escalate_users") or ()]
    return " or ".join(who)


def decide_approval(
    db: Database,
    park_id: int,
    *,
    decision: str,
    user: str,
    roles: Sequence[str],
    comment: str | None,
    tenant_scope: str | None,
    via: str = "ops",
) -> Resumed | None:
    """`user` votes on a waiting approval, in one transaction; the vote that completes its
    quorum (`required` approvals, or `reject_quorum` rejections) resumes it through the guarded
    resume. None: no such approval in the caller's scope. Raises `NotAllowed` when the caller
    may not decide it. Each approver counts once: a second vote changes nothing (`duplicate`);
    a vote after the approval closed is kept as `late` and changes nothing, saying "already
    decided by X at T". With the default quorum (1 and 1) the first decision wins, as ever."""
    if decision not in ("approved", "rejected"):
        raise ValueError(f"a decision is approved or rejected, not {decision!r}")
    refusal: str | None = None
    with db.transaction() as tx:
        park = park_row(tx, park_id, tenant_scope)
        if park is None or park["kind"] != "approval":
            return None
        if may_decide(park, user=user, roles=roles):
            return _vote(tx, park_id, decision=decision, user=user, comment=comment, via=via)
        refusal = f"only {deciders(park)} may decide this approval"
    # Raised outside the transaction: the database layer translates what escapes it.
    raise NotAllowed(refusal)


def _vote(
    tx: Tx, park_id: int, *, decision: str, user: str, comment: str | None, via: str
) -> Resumed:
    # The step row's lock first (as every writer of step and park takes them): the voters of
    # one approval queue here, so the tally below sees each vote committed before this one,
    # and exactly one vote finds the quorum complete (the resume is guarded besides).
    tx.one(LOCK_STEP, park_id=park_id)
    row = tx.one(VOTE, park_id=park_id, voter=user, decision=decision, via=via, comment=comment)
    tally = tx.one(TALLY, park_id=park_id)
    assert tally is not None  # the park row exists: read by the caller in this transaction
    approvals, rejections = int(tally["approvals"]), int(tally["rejections"])
    required = int(tally["required"])
    if row is None or not row["counted"]:
        vote = "duplicate" if row is None else "late"
        return Resumed(
            park_id,
            False,
            park=park_row(tx, park_id),
            vote=vote,
            approvals=approvals,
            rejections=rejections,
            required=required,
        )
    # Its posted Slack message shows each counted vote: an update is due (made by the sweep).
    tx.execute(QUEUE_UPDATE, park_id=park_id)
    approved = approvals >= required
    if not approved and rejections < int(tally["reject_quorum"]):
        return Resumed(
            park_id,
            False,
            park=park_row(tx, park_id),
            vote="counted",
            approvals=approvals,
            rejections=rejections,
            required=required,
        )
    final = "approved" if approved else "rejected"
    said = {"kind": "approval", "decision": final, "decided_by": user, "votes": tally["votes"]}
    done = resume_park(
        tx,
        park_id,
        by="decision",
        output={"resumed": {**said, "comment": comment}},
        decision=final,
        decided_by=user,
        comment=comment,
    )
    # Not moved though the quorum is complete: the deadline passed between the vote and the
    # resume (both judge it by the statement's clock) — only the deadline resumes it now, and
    # this vote came too late to decide anything.
    vote = "counted" if done.moved else "late"
    return replace(done, vote=vote, approvals=approvals, rejections=rejections, required=required)
