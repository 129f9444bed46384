"""Re-decide: after a rule is fixed, the events a workflow refused are decided again under its
current version (issue 30, item 2). The ops side previews them (`preview`: which refusals,
which records, what the current version says for each, written nowhere) and acts on the
previewed set (`redecide`: one decision per (event, workflow, version), recorded beside the
refusal in admission_redecisions; the refusal row stays as admission wrote it).

The decision is admission's own (shared/admission/admit.py), in its order of precedence:
the version's trigger (`trigger_for`: `definition_unreadable`), `static_refusal` (the
record, the rule, the credits) on the event as it arrived, the circuit breaker (`paused`),
then the dedup rule `admission_dedup` read under admission's own record lock
(`admission_lock_records`), so a re-decision racing a live admission of a new event for the
same record serializes with it and the dedup modes hold (once_per_record: one run).

Which refusals can be re-decided (`REDECIDABLE`): those a fix changes — the rule
(`rule_not_matched`), the record expression (`missing_record_identity`), a definition that
didn't parse (`definition_unreadable`), the breaker (`workflow_paused`, once resumed) and the
credits (`insufficient_credits`, once topped up). Not: `duplicate` and `already_running` (the
dedup mode said no on purpose; re-admitting would break it), `echo_suppressed` (onceflow's
own write coming back: running on it is the loop the marker prevents), `superseded` (a later
change of the debounce burst started the run that stands for it), `batched` (the batch's run
holds the event), `provider_suppressed` (a
paused connection or an excluded author is the tenant's own choice, not a bug).

A re-decided event starts at most one run per workflow, ever: its start key is
`redecide:<event>:<version>` and a partial unique index allows one re-decision with a run per
(event, workflow) (migrations/0490_admission_redecisions.sql). A current version that
debounces, batches, throttles or limits the concurrency of its starts is not re-decided
(`holds_starts`): those hold a start in a burst, a batch or a queue that an old event can't
join in order (or a slot count it would bypass); say so rather than start around them.
A half-open breaker's trial slots are left to live events (`workflow_paused`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from shared.admission.admit import (
    LOCK_RECORDS,
    DefinitionUnreadable,
    _priority,
    event_facts,
    paused,
    static_refusal,
    trigger_for,
)
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.errors import ConflictError, TransientError
from shared.core.pubsub import publish_step_ready

SQL = queries.load("admission")
CANDIDATES = SQL["admission_redecide_candidates"]
DEDUP = SQL["admission_redecide_dedup"]
REDECIDE = SQL["admission_redecide"]

# The refusals a fix can change (see above); the API's `reasons` takes these.
Redecidable = Literal[
    "rule_not_matched",
    "missing_record_identity",
    "definition_unreadable",
    "workflow_paused",
    "insufficient_credits",
]
REDECIDABLE: tuple[str, ...] = get_args(Redecidable)
ATTEMPTS = 3


@dataclass(frozen=True)
class Filter:
    """Which refusals: of this tenant (None: an admin, every tenant), refused in
    [created_after, created_before), optionally of one workflow, record, event type, reasons."""

    tenant_id: str | None
    workflow_id: str | None = None
    record_key: str | None = None
    event_type: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    reasons: Sequence[str] = REDECIDABLE


@dataclass(frozen=True)
class Redecision:
    """One refusal and what the current version says of it. `outcome` is `admitted` (a
    preview: would start a run), a refusal reason, `not_bound` (the workflow is no longer
    active on the event's type) or `holds_starts` (see the module doc); `repeated` when an
    act found the pairing re-decided already (its earlier decision is answered)."""

    refusal_id: int
    event_id: int
    workflow_id: str
    record_key: str | None
    was_reason: str
    was_detail: str
    version_id: str | None
    outcome: str
    detail: str | None
    run_id: str | None = None
    repeated: bool = False

    @property
    def would_run(self) -> bool:
        return self.outcome == "admitted"


@dataclass(frozen=True)
class _Judged:
    """The decision that needs no other run: a refusal, or the run's makings."""

    refusal: tuple[str, str] | None
    key: str | None
    record: dict[str, Any]
    entry_node: str = ""
    entry_type: str = ""
    recordable: bool = True  # False: not_bound / holds_starts, decided nothing
    priority: int = 0  # the run's, over the rule scope (shared/admission/priority.py)


def _judge(row: Mapping[str, Any]) -> _Judged:
    facts = event_facts(row)
    if row["version_id"] is None:
        why = f"workflow {row['workflow_id']} is not active on {row['event_type']} now"
        return _Judged(("not_bound", why), facts.record_key, {}, recordable=False)
    try:
        trigger = trigger_for(str(row["version_id"]), row["definition"])
    except DefinitionUnreadable as exc:
        return _Judged(("definition_unreadable", str(exc)), facts.record_key, {})
    if (
        trigger.gathering is not None
        or trigger.throttle is not None
        or trigger.concurrency is not None
    ):
        why = (
            "the current version debounces, batches, throttles or limits the concurrency of its "
            "starts; re-decide starts no run"
        )
        return _Judged(("holds_starts", why), facts.record_key, {}, recordable=False)
    key, record, refused = static_refusal(facts, trigger, str(row["dedup_mode"]))
    if refused is None and row["breaker_state"] == "open":
        refused = paused(row["workflow_id"], row["breaker_opened_at"], row["breaker_reason"])
    elif refused is None and row["breaker_state"] == "half_open":
        refused = (
            "workflow_paused",
            f"workflow {row['workflow_id']}'s circuit breaker is half-open: its trial runs are "
            "live events'; re-decide once it has closed",
        )
    priority = 0 if refused is not None else _priority(facts, trigger, record)
    return _Judged(refused, key, record, trigger.entry_node, trigger.entry_type, priority=priority)


def _candidates(tx: Tx, f: Filter, refusal_ids: Sequence[int] | None, limit: int) -> list[Any]:
    return tx.all(
        CANDIDATES,
        tenant_id=f.tenant_id,
        reasons=[r for r in f.reasons if r in REDECIDABLE],
        refusal_ids=list(refusal_ids) if refusal_ids is not None else None,
        workflow_id=f.workflow_id,
        record_key=f.record_key,
        event_type=f.event_type,
        created_after=f.created_after,
        created_before=f.created_before,
        limit=limit,
    )


def _answer(row: Mapping[str, Any], outcome: str, detail: str | None, **more: Any) -> Redecision:
    return Redecision(
        refusal_id=int(row["refusal_id"]),
        event_id=int(row["id"]),
        workflow_id=str(row["workflow_id"]),
        record_key=row["record_key"],
        was_reason=str(row["was_reason"]),
        was_detail=str(row["was_detail"]),
        version_id=row["version_id"],
        outcome=outcome,
        detail=detail,
        **more,
    )


def preview(db: Database, f: Filter, *, limit: int) -> list[Redecision]:
    """Up to `limit` refusals of the filter and what the current version says of each, in
    one READ ONLY transaction (nothing decided: a concurrent start may change the dedup answer
    before an act, which decides again under the lock)."""
    out: list[Redecision] = []
    with db.transaction() as tx:
        tx.execute("SET TRANSACTION READ ONLY")
        for row in _candidates(tx, f, None, limit):
            judged = _judge(row)
            if judged.refusal is not None:
                out.append(_answer(row, judged.refusal[0], judged.refusal[1]))
                continue
            dedup = tx.one(
                DEDUP,
                workflow_id=row["workflow_id"],
                dedup_mode=row["dedup_mode"],
                record_key=judged.key,
            )
            if dedup is not None and dedup["reason"] is not None:
                out.append(_answer(row, dedup["reason"], dedup["detail"]))
            else:
                out.append(_answer(row, "admitted", "the current version would start a run"))
    return out


def redecide(
    db: Database,
    refusal_id: int,
    *,
    tenant_id: str | None,
    bulk_id: str | None = None,
    publish: Callable[[Sequence[str]], None] = publish_step_ready,
) -> Redecision | None:
    """Decide the refusal again under the workflow's current version, once per (event,
    workflow, version); None when there is no such re-decidable refusal in the tenant's scope.
    A run started has its first step published after commit (a lost publish is the sweep's:
    it re-dispatches pending steps)."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with db.transaction() as tx:
                done = _redecide_in(tx, refusal_id, tenant_id, bulk_id)
            break
        except (ConflictError, TransientError):
            # A concurrent re-decision (or admission) won a unique index: decide again from
            # what is committed now, which answers `handled` or the dedup refusal.
            if attempt == ATTEMPTS:
                raise
    if done is None:
        return None
    answer, step_id = done
    if step_id is not None:
        publish([step_id])
    return answer


def _redecide_in(
    tx: Tx, refusal_id: int, tenant_id: str | None, bulk_id: str | None
) -> tuple[Redecision, str | None] | None:
    rows = _candidates(tx, Filter(tenant_id=tenant_id), [refusal_id], 1)
    if not rows:
        return None
    row = rows[0]
    judged = _judge(row)
    if not judged.recordable:
        assert judged.refusal is not None
        return _answer(row, judged.refusal[0], judged.refusal[1]), None
    dedup_mode = str(row["dedup_mode"])
    if judged.refusal is None and judged.key is not None and dedup_mode != "every_time":
        # Admission's own lock on (workflow, record): the decision statement's snapshot, taken
        # after it is held, sees a live admission's enrollment or run for the record.
        tx.one(LOCK_RECORDS, lock_keys=[f"{row['workflow_id']}|{judged.key}"])
    decided = tx.one(
        REDECIDE,
        refusal_id=refusal_id,
        event_id=int(row["id"]),
        workflow_id=row["workflow_id"],
        version_id=row["version_id"],
        dedup_mode=dedup_mode,
        run_id=str(uuid.uuid4()),
        record_key=judged.key,
        refusal=None if judged.refusal is None else judged.refusal[0],
        refusal_detail=None if judged.refusal is None else judged.refusal[1],
        entry_node=judged.entry_node,
        entry_type=judged.entry_type,
        record=json.dumps(judged.record, default=str),
        priority=judged.priority,
        bulk_id=bulk_id,
    )
    assert decided is not None  # one row, always
    if decided["outcome"] == "handled":
        answer = _answer(
            row,
            str(decided["prior_outcome"]),
            decided["detail"],
            run_id=decided["run_id"],
            repeated=True,
        )
        return answer, None
    answer = _answer(row, str(decided["outcome"]), decided["detail"], run_id=decided["run_id"])
    return answer, decided["step_id"]
