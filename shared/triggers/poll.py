"""Polling triggers, the processed-at pattern: start the workflow once per row of a table that
is not handled yet, and stamp the row as handled by a declared policy.

State lives on the record (the `stamp` column, NULL while not handled) and the poll query
asks only for those rows, through a partial index (checked on activation: a source no index
answers is refused with the CREATE INDEX to add). What onceflow adds is the poll key — the
workflow, the row's key, its stamp generation and the attempt — claimed under a unique
constraint in the transaction that emits the row's trigger event (poll_records), so a row
re-polled before its stamp lands starts nothing twice, and neither does a retried or
overlapping poll.

Stamp policies (`validate` says the trade-off of each in a warning):
- `on_attempt`: the row is stamped in the transaction that emits its event. Each row starts
  at most one run per generation; a run that fails is never retried by the poll (a person
  replays it from ops).
- `on_success`: the row is stamped once its run succeeded. A failed or refused occurrence is
  tried again on the next pass (a new attempt) — transient failures heal, a permanent one
  retries every pass forever.
- `after_attempts: N`: as on_success, but after N occurrences that did not succeed the row is
  stamped anyway (`gave_up` in poll_records, with the last run failed for a person to see).
While an occurrence's run has not finished the row is left alone, however often it is polled.
Under on_success and after_attempts, a row whose run a person cancelled is stamped and its
generation closed `cancelled`: the poll never starts it again by itself. An event the sweep
gave up as undelivered (admission never decided it) is an occurrence over without a run, tried
again as a refused one is.

A generation ends when onceflow stamps the row; if the application clears the stamp, the row
is not handled yet again, and the next poll starts its next generation, once the last
occurrence is decided and its run over. Its claim ends the last generation's enrollment, so
under `once_per_record` the record is handled once per generation: the new run is admitted,
not refused `duplicate`.

A SQL source's page and its rows' poll state are read by one statement (one snapshot): a row
another pass stamped meanwhile is never taken for one whose stamp the application cleared.

One pass reads the pending rows in key order, a page (`batch`) per transaction, keyset-paged
so each page is a range read of the index, until the rows run out or the pass's page budget
is spent (the rest wait for the next pass). A source that cannot be polled (table or column
dropped, index gone) is recorded in `poll_sources.last_error` and in the duty's result; the
other sources go on.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from shared.accounts.connections import get_connection, is_connection_id
from shared.core import queries
from shared.core.crashpoints import crash_point
from shared.core.db import Database, Tx
from shared.core.duty import Duty, claim_period
from shared.core.errors import TransientError
from shared.core.logs import get_logger
from shared.gates.throttle import claim_slot
from shared.ingest.echo import record_echo_marker
from shared.ingest.outbox import TriggerEvent, emit
from shared.port import observed
from shared.port.interface import CrmPort, SearchFilter
from shared.providers import connect, kinds, registry
from shared.triggers import AddProblem, TriggerKind
from shared.triggers.sql_source import (
    SourceInvalid,
    TableSource,
    check_against_database,
    parse_source,
    tenant_problem,
)
from shared.workflows.definition import AfterAttempts, PollCrm, PollTrigger, Trigger

SQL = queries.load("poll")
SOURCES_ACTIVE = SQL["poll_sources_active"]
SOURCE_CLAIM = SQL["poll_source_claim"]
SOURCE_RECORD = SQL["poll_source_record"]
RECORDS_STATE = SQL["poll_records_state"]
RECORDS_CLAIM = SQL["poll_records_claim"]
RECORDS_SET_EVENTS = SQL["poll_records_set_events"]
RECORDS_CLOSE = SQL["poll_records_close"]
SOURCE_STATUS = SQL["poll_source_status"]

# Below this a poll is a busy loop on the application's table; a minute is what the sweep's
# own schedule gives anyway.
MIN_EVERY_SECONDS = 60
MAX_PAGES_PER_PASS = 100
# A pass runs inside the sweep's invocation (50 s): it leaves time for everything else.
PASS_BUDGET_SECONDS = 15.0
DUTY_EVERY_SECONDS = 15.0
log = get_logger(__name__)


def event_type_for(workflow_id: str) -> str:
    return f"poll.row.w{UUID(workflow_id).hex}"


# ---------------------------------------------------------------- deciding, pure


@dataclass(frozen=True)
class RecordState:
    generation: int
    attempts: int
    status: Literal["open", "stamped", "gave_up", "cancelled"]
    # What became of the latest occurrence (poll_record_state, migrations/0230).
    outcome: Literal[
        "unadmitted", "undelivered", "refused", "running", "succeeded", "failed", "cancelled"
    ]


@dataclass(frozen=True)
class Decision:
    action: Literal["emit", "wait", "stamp", "give_up", "cancelled"]
    generation: int = 0
    attempt: int = 0


def decide(  # noqa: PLR0911 - one return per row of the policy's table
    state: RecordState | None, policy: str | AfterAttempts
) -> Decision:
    """What to do about one pending row, given its poll state and the stamp policy."""
    if state is None:
        return Decision("emit", 1, 1)
    undecided = state.outcome in ("unadmitted", "running")
    if state.status != "open":
        # onceflow stamped it and the application cleared the stamp: handle it again, once
        # the last occurrence is decided and its run over (its enrollment ends with the claim
        # of the next generation: poll_records_claim).
        return Decision("wait") if undecided else Decision("emit", state.generation + 1, 1)
    if policy == "on_attempt":
        # Its stamp goes with its event; still open means the stamp is owed (a CRM write that
        # did not happen yet), whatever became of the run.
        return Decision("stamp")
    if undecided:
        return Decision("wait")
    if state.outcome == "succeeded":
        return Decision("stamp")
    if state.outcome == "cancelled":
        # A person stopped it: the poll does not start it again by itself (clearing the
        # stamp does, as a new generation).
        return Decision("cancelled")
    # failed, refused, or undelivered (given up before admission decided it: no run)
    if isinstance(policy, AfterAttempts) and state.attempts >= policy.after_attempts:
        return Decision("give_up")
    return Decision("emit", state.generation, state.attempts + 1)


# ---------------------------------------------------------------- one pass


@dataclass
class PassReport:
    rows: int = 0
    emitted: int = 0
    stamped: int = 0
    gave_up: int = 0
    waiting: int = 0
    pages: int = 0
    cancelled: int = 0  # rows whose run a person cancelled: stamped, closed `cancelled`
    throttled: int = 0  # CRM calls not made: the connection's window was used up

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PollSource:
    workflow_id: str
    tenant_id: str
    name: str
    config: PollTrigger
    source: TableSource | None  # a SQL table source …
    crm: PollCrm | None = None  # … or a CRM search


def poll_pass(
    db: Database,
    src: PollSource,
    *,
    max_pages: int = MAX_PAGES_PER_PASS,
    budget_seconds: float = PASS_BUDGET_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    port_for: Callable[[str], CrmPort] | None = None,
) -> PassReport:
    """One pass over the source's pending rows, until they run out or the page or time
    budget is spent (the sweep's other duties and core jobs wait for it; the rest of the rows
    wait for the next pass). Raises SourceInvalid when the source cannot be polled."""
    deadline = clock() + budget_seconds

    def more() -> bool:
        return clock() < deadline

    if src.crm is not None:
        try:
            return _crm_pass(db, src, src.crm, max_pages=max_pages, more=more, port_for=port_for)
        finally:
            observed.flush(db)  # what the pass's port calls observed (shared/port/observed.py)
    assert src.source is not None
    refused = tenant_problem(src.source, src.tenant_id)
    if refused is not None:  # a definition activated before the rule: never read
        raise SourceInvalid("table", refused)
    with db.transaction() as tx:
        key_type, problems = check_against_database(tx, src.source, batch=src.config.batch)
    if problems:
        raise SourceInvalid("table", problems[0])
    report = PassReport()
    after: str | None = None
    for _ in range(max_pages):
        with db.transaction() as tx:
            last, n = _poll_page(
                tx, src, source=src.source, key_type=key_type, after=after, report=report
            )
        report.pages += 1
        if n < src.config.batch or last is None or not more():
            break
        after = last
    return report


@dataclass
class PageDecisions:
    emit: list[tuple[str, Decision]] = field(default_factory=list)
    stamp: list[str] = field(default_factory=list)
    give_up: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    waiting: int = 0


def _state_of(row: Mapping[str, Any]) -> RecordState | None:
    if row["generation"] is None:
        return None
    return RecordState(int(row["generation"]), int(row["attempts"]), row["status"], row["outcome"])


def _decide_page(
    src: PollSource, states: Sequence[tuple[str, RecordState | None]]
) -> PageDecisions:
    out = PageDecisions()
    for key, state in states:
        d = decide(state, src.config.stamp_policy)
        if d.action == "emit":
            out.emit.append((key, d))
        elif d.action == "stamp":
            out.stamp.append(key)
        elif d.action == "give_up":
            out.give_up.append(key)
        elif d.action == "cancelled":
            out.cancelled.append(key)
        else:
            out.waiting += 1
    return out


def _poll_page(
    tx: Tx,
    src: PollSource,
    *,
    source: TableSource,
    key_type: str,
    after: str | None,
    report: PassReport,
) -> tuple[str | None, int]:
    # The rows and their poll state in one statement: one snapshot (see page_query).
    query = source.page_query(key_type, after=after is not None, states=True)
    params: dict[str, Any] = {"limit": src.config.batch, "workflow_id": src.workflow_id}
    if after is not None:
        params["after"] = after
    rows = tx.all(query, **params)
    if not rows:
        return None, 0
    report.rows += len(rows)
    keys = [r["key"] for r in rows]
    page = _decide_page(src, [(r["key"], _state_of(r)) for r in rows])
    report.waiting += page.waiting
    row_of = {r["key"]: r["row"] for r in rows}

    def occurrence(key: str) -> Occurrence:
        return Occurrence(source.name, {"table": source.name, "key": key, "row": row_of[key]})

    emitted = _emit_occurrences(tx, src, page.emit, occurrence)
    report.emitted += len(emitted)
    stamp = page.stamp + (emitted if src.config.stamp_policy == "on_attempt" else [])
    report.stamped += _stamp(
        tx, src, source=source, key_type=key_type, keys=stamp, status="stamped"
    )
    report.gave_up += _stamp(
        tx, src, source=source, key_type=key_type, keys=page.give_up, status="gave_up"
    )
    report.cancelled += _stamp(
        tx, src, source=source, key_type=key_type, keys=page.cancelled, status="cancelled"
    )
    return keys[-1], len(rows)


@dataclass(frozen=True)
class Occurrence:
    record_object_type: str
    payload: dict[str, Any]
    connection_id: str | None = None


def _emit_occurrences(
    tx: Tx,
    src: PollSource,
    decisions: Sequence[tuple[str, Decision]],
    occurrence: Callable[[str], Occurrence],
) -> list[str]:
    if not decisions:
        return []
    claimed = tx.all(
        RECORDS_CLAIM,
        workflow_id=src.workflow_id,
        keys=[k for k, _ in decisions],
        generations=[d.generation for _, d in decisions],
        attempts=[d.attempt for _, d in decisions],
    )
    keys: list[str] = []
    event_ids: list[int] = []
    for c in claimed:
        key, generation, attempt = c["record_key"], int(c["generation"]), int(c["attempts"])
        found = occurrence(key)
        event_id = emit(
            tx,
            TriggerEvent(
                tenant_id=src.tenant_id,
                connection_id=found.connection_id,
                event_type=event_type_for(src.workflow_id),
                payload={**found.payload, "generation": generation, "attempt": attempt},
                # The poll key. poll_records' guarded claim is what makes it once; the
                # outbox's unique index on the source event id is a second guard.
                source_event_id=f"poll:{src.workflow_id}:{key}:{generation}:{attempt}",
                record_object_type=found.record_object_type,
                record_object_id=key,
            ),
        )
        if event_id is not None:
            keys.append(key)
            event_ids.append(event_id)
        crash_point("poll_mid_page")
    tx.execute(RECORDS_SET_EVENTS, workflow_id=src.workflow_id, keys=keys, event_ids=event_ids)
    return keys


def _stamp(
    tx: Tx, src: PollSource, *, source: TableSource, key_type: str, keys: list[str], status: str
) -> int:
    if not keys:
        return 0
    tx.all(source.stamp_query(key_type), keys=keys)
    return tx.execute(RECORDS_CLOSE, workflow_id=src.workflow_id, keys=keys, status=status)


# ---------------------------------------------------------------- a CRM search


CRM_OBJECT_TYPES = ("contact", "company", "deal")
CRM_PAGE = 100  # HubSpot's search returns at most 200 a page; 100 keeps requests small
PROPERTY = re.compile(r"^[a-z][a-z0-9_]{0,99}$")


def _crm_pass(
    db: Database,
    src: PollSource,
    crm: PollCrm,
    *,
    max_pages: int,
    more: Callable[[], bool],
    port_for: Callable[[str], CrmPort] | None,
) -> PassReport:
    """Page through the search, start what is due, then write the stamps that are owed.

    The stamps are written after the paging: a stamped record leaves the results, which would
    shift the offsets of the pages after it. A stamp not written (a crash, a 429) is owed still:
    the record comes back in the next search and is stamped then (`decide`). Every call takes a
    slot of the connection's throttle window, shared with its blocks' calls; when the window is
    used up the pass stops there and the rest waits for the next pass."""
    port = port_for(crm.connection) if port_for else connect.port_for(db, crm.connection)
    # The kind in onceflow's neutral words (Pipedrive's `person` is a `contact`): what the port
    # takes, and what the events' record keys and the echo markers of the stamps carry.
    kind = registry.object_kind(crm.object_type, kinds.provider_of(db, crm.connection))
    crm = crm.model_copy(update={"object_type": kind or crm.object_type})
    filters = [
        *(SearchFilter(f.property, f.operator.upper(), f.value) for f in crm.filters),
        SearchFilter(crm.stamp, "NOT_HAS_PROPERTY", None),
    ]
    report = PassReport()
    owed: list[str] = []
    given_up: list[str] = []
    cancelled: list[str] = []
    after: str | None = None
    for _ in range(max_pages):
        if not _slot(db, crm.connection):
            report.throttled += 1
            break
        page = port.search_page(
            crm.object_type, filters, limit=min(CRM_PAGE, src.config.batch), after=after
        )
        report.pages += 1
        report.rows += len(page.records)
        properties = {r.id: dict(r.properties) for r in page.records}
        if page.records:
            with db.transaction() as tx:
                states = {
                    r["record_key"]: _state_of(r)
                    for r in tx.all(
                        RECORDS_STATE, workflow_id=src.workflow_id, keys=list(properties)
                    )
                }
            decided = _decide_page(src, [(key, states.get(key)) for key in properties])
            due = []
            for key, d in decided.emit:
                # A record onceflow stamped that the search still shows unstamped: the search
                # index lags writes (HubSpot: seconds), or someone cleared the stamp. The record
                # itself says which.
                if d.attempt == 1 and d.generation > 1:
                    if not _slot(db, crm.connection):
                        report.throttled += 1
                        decided.waiting += 1
                        continue
                    if _still_stamped(port, crm, key):
                        decided.waiting += 1
                        continue
                due.append((key, d))
            report.waiting += decided.waiting

            def occurrence(key: str, found: dict[str, Any] = properties) -> Occurrence:
                return Occurrence(
                    crm.object_type,
                    {"object_type": crm.object_type, "id": key, "properties": found[key]},
                    crm.connection,
                )

            with db.transaction() as tx:
                emitted = _emit_occurrences(tx, src, due, occurrence)
            report.emitted += len(emitted)
            owed += decided.stamp + (emitted if src.config.stamp_policy == "on_attempt" else [])
            given_up += decided.give_up
            cancelled += decided.cancelled
        if page.next_after is None or not more():
            break
        after = page.next_after
    report.stamped += _stamp_crm(db, src, crm, port, keys=owed, status="stamped")
    report.gave_up += _stamp_crm(db, src, crm, port, keys=given_up, status="gave_up")
    report.cancelled += _stamp_crm(db, src, crm, port, keys=cancelled, status="cancelled")
    report.throttled += (
        len(owed)
        + len(given_up)
        + len(cancelled)
        - report.stamped
        - report.gave_up
        - report.cancelled
    )
    return report


def _slot(db: Database, connection_id: str) -> bool:
    """A call slot in the connection's throttle window (shared with its blocks' calls)."""
    with db.transaction() as tx:
        return claim_slot(tx, connection_id).allowed


def _still_stamped(port: CrmPort, crm: PollCrm, key: str) -> bool:
    value = port.get(crm.object_type, key, [crm.stamp]).properties.get(crm.stamp)
    return value not in (None, "")


def _stamp_crm(
    db: Database, src: PollSource, crm: PollCrm, port: CrmPort, *, keys: list[str], status: str
) -> int:
    """Write the stamp property on each record, then close their generations. Each write is
    announced by an echo marker first, so the property change it causes doesn't start the
    workflows watching that property."""
    written: list[str] = []
    stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    try:
        for key in keys:
            if not _slot(db, crm.connection):
                break  # the rest stay owed: stamped on a later pass
            with db.transaction() as tx:
                record_echo_marker(
                    tx,
                    connection_id=crm.connection,
                    object_type=crm.object_type,
                    object_id=key,
                    fields={crm.stamp: stamp},
                    step_id=None,
                )
            port.update(crm.object_type, key, {crm.stamp: stamp})
            written.append(key)
    finally:
        if written:
            with db.transaction() as tx:
                tx.execute(RECORDS_CLOSE, workflow_id=src.workflow_id, keys=written, status=status)
    return len(written)


# ---------------------------------------------------------------- the sweep duty


def active_sources(tx: Tx) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(workflow id, tenant, workflow name, its trigger as stored) of every active poll."""
    return [
        (
            r["workflow_id"],
            r["tenant_id"],
            r["name"],
            r["trigger"],
        )
        for r in tx.all(SOURCES_ACTIVE)
    ]


def load_source(
    workflow_id: str, tenant_id: str, name: str, trigger: Mapping[str, Any]
) -> PollSource:
    config = PollTrigger.model_validate(trigger["poll"])
    source = None if config.table is None else parse_source(config.table)
    return PollSource(workflow_id, tenant_id, name, config, source, config.crm)


def poll_due_sources(db: Database) -> dict[str, Any]:
    """The sweep duty: poll each active source whose period has passed, one after another.

    A source that cannot be polled is recorded on its row and in this duty's result; the
    others go on, and it is tried again next period (no tight loop: the claim holds it off
    for `every_seconds`)."""
    with db.transaction() as tx:
        sources = active_sources(tx)
    out: dict[str, Any] = {"sources": len(sources), "polled": 0, "emitted": 0}
    errors: dict[str, str] = {}
    for workflow_id, tenant_id, name, trigger in sources:
        every = max(float(trigger["poll"].get("every_seconds", 0)), MIN_EVERY_SECONDS)
        with db.transaction() as tx:
            # Claimable a little before its period ends, like a sweep duty: a source polled
            # every minute is polled on every tick of a minute schedule despite its jitter.
            claimed = tx.one(
                SOURCE_CLAIM, workflow_id=workflow_id, every_seconds=claim_period(every)
            )
        if claimed is None:
            continue
        result: dict[str, Any] | None = None
        error: str | None = None
        try:
            report = poll_pass(db, load_source(workflow_id, tenant_id, name, trigger))
            result = report.as_dict()
            out["polled"] += 1
            out["emitted"] += report.emitted
        except TransientError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            errors[workflow_id] = error
            log.warning("poll of workflow %s (%s) failed: %s", name, workflow_id, exc)
        with db.transaction() as tx:
            tx.execute(
                SOURCE_RECORD,
                workflow_id=workflow_id,
                result=json.dumps(result),
                error=error,
            )
    if errors:
        out["errors"] = errors
    return out


# ---------------------------------------------------------------- the kind


POLICY_WARNINGS = {
    "on_success": "stamp_policy on_success: a row is stamped only when its run succeeded, so a "
    "transient failure heals on the next pass, but a row that always fails starts a run every "
    "pass forever; after_attempts: N stops after N",
    "on_attempt": "stamp_policy on_attempt: a row is stamped when its run is started, so it is "
    "never started twice, but a run that fails is not retried by the poll (replay it from ops)",
    "after_attempts": "stamp_policy after_attempts: a row is stamped when its run succeeded or "
    "after {n} runs that did not, so transient failures get {n} tries and a permanent one "
    "stops; check poll_records for rows given up on",
}


def check(t: Trigger, add: AddProblem) -> None:
    poll = t.poll
    assert poll is not None
    if poll.every_seconds < MIN_EVERY_SECONDS:
        add(
            "error",
            ("trigger", "poll", "every_seconds"),
            f"a poll runs at most once a minute: every_seconds is at least {MIN_EVERY_SECONDS}; "
            f"found {poll.every_seconds}",
        )
    if (poll.table is None) == (poll.crm is None):
        add("error", ("trigger", "poll"), "a poll has one source: `table` or `crm`")
    if poll.table is not None:
        try:
            parse_source(poll.table)
        except SourceInvalid as exc:
            add("error", ("trigger", "poll", "table", exc.field), str(exc))
    if poll.crm is not None:
        check_crm(poll.crm, add)
    policy = poll.stamp_policy
    if isinstance(policy, AfterAttempts):
        warning = POLICY_WARNINGS["after_attempts"].format(n=policy.after_attempts)
    else:
        warning = POLICY_WARNINGS[policy]
    add("warning", ("trigger", "poll", "stamp_policy"), warning)
    if policy != "on_attempt" and t.dedup == "once_per_record":
        add(
            "error",
            ("trigger", "dedup"),
            "a row that is tried again (stamp_policy other than on_attempt) would be refused as "
            "a duplicate under once_per_record; use not_while_running (no two runs for one row "
            "at once) or every_time",
        )
    if t.record != "event":
        add(
            "error",
            ("trigger", "record"),
            "a poll trigger's record is the row; `record` does not apply",
        )
    if t.rule is not None and policy != "on_attempt":
        add(
            "warning",
            ("trigger", "rule"),
            "a row the rule refuses stays unstamped and is tried again every pass; put the "
            "condition in the source's `where` instead",
        )


def check_tenant(t: Trigger, tenant_id: str, add: AddProblem) -> None:
    """A SQL source names a table of the definition's own tenant (sql_source.tenant_problem)."""
    if t.poll is None or t.poll.table is None:
        return
    try:
        source = parse_source(t.poll.table)
    except SourceInvalid:
        return  # `check` located that already
    refused = tenant_problem(source, tenant_id)
    if refused is not None:
        add("error", ("trigger", "poll", "table", "table"), refused)


SEARCH_OPERATORS = frozenset(
    {
        "EQ",
        "NEQ",
        "GT",
        "GTE",
        "LT",
        "LTE",
        "HAS_PROPERTY",
        "NOT_HAS_PROPERTY",
        "CONTAINS_TOKEN",
        "NOT_CONTAINS_TOKEN",
    }
)


def check_crm(crm: PollCrm, add: AddProblem) -> None:
    where = ("trigger", "poll", "crm")
    if not is_connection_id(crm.connection):
        add("error", (*where, "connection"), f"a connection id is a UUID; found {crm.connection!r}")
    if registry.object_kind(crm.object_type) not in CRM_OBJECT_TYPES:
        add(
            "error",
            (*where, "object_type"),
            f"object_type is one of {', '.join(CRM_OBJECT_TYPES)} (or a CRM's own name for "
            f"one); found {crm.object_type!r}",
        )
    if not PROPERTY.match(crm.stamp):
        add("error", (*where, "stamp"), f"a property name is lower snake case; found {crm.stamp!r}")
    for i, f in enumerate(crm.filters):
        if f.operator.upper() not in SEARCH_OPERATORS:
            add(
                "error",
                (*where, "filters", i, "operator"),
                f"operator is one of {', '.join(sorted(SEARCH_OPERATORS))}; found {f.operator!r}",
            )
        if f.property == crm.stamp:
            add(
                "error",
                (*where, "filters", i, "property"),
                "the stamp property is filtered by onceflow itself (it has no value while a "
                "record is not handled yet)",
            )


def _searchable_providers() -> list[str]:
    """The providers whose port can search records (a CRM adapter: `CrmPort.search_page`)."""
    return [p.title for p in registry.ALL if p.crm is not None]


def _searchable(provider: str) -> bool:
    found = registry.get(provider)
    return found is not None and found.crm is not None


def check_activation(tx: Tx, t: Trigger, tenant_id: str) -> list[tuple[tuple[str | int, ...], str]]:
    """What only the database can say: the table and columns exist and an index answers; the
    CRM connection is the tenant's own and in use."""
    assert t.poll is not None
    if t.poll.crm is not None:
        conn = get_connection(tx, t.poll.crm.connection)
        if conn is None or conn.tenant_id != tenant_id:
            return [(("trigger", "poll", "crm", "connection"), "no such connection")]
        if conn.status != "active" or not _searchable(conn.provider):
            return [
                (
                    ("trigger", "poll", "crm", "connection"),
                    f"connection {conn.id} is a {conn.status} {conn.provider} connection; a CRM "
                    f"search needs an active {' or '.join(_searchable_providers())} one",
                )
            ]
        return []
    assert t.poll.table is not None
    try:
        source = parse_source(t.poll.table)
    except SourceInvalid as exc:
        return [(("trigger", "poll", "table", exc.field), str(exc))]
    refused = tenant_problem(source, tenant_id)
    if refused is not None:
        return [(("trigger", "poll", "table", "table"), refused)]
    _, problems = check_against_database(tx, source, batch=t.poll.batch)
    return [(("trigger", "poll", "table"), p) for p in problems]


def status(tx: Tx, _t: Trigger, workflow_id: str) -> dict[str, Any]:
    row = tx.one(SOURCE_STATUS, workflow_id=workflow_id)
    assert row is not None  # the query always answers one row
    return {
        "last_polled_at": row["last_polled_at"].isoformat() if row["last_polled_at"] else None,
        "last_result": row["last_result"],
        "last_error": row["last_error"],
        "rows_open": int(row["open"]),
        "rows_stamped": int(row["stamped"]),
        "rows_given_up": int(row["gave_up"]),
        "rows_cancelled": int(row["cancelled"]),
    }


KIND = TriggerKind(
    name="poll",
    fields=("poll",),
    applies=lambda t: t.poll is not None,
    check=check,
    check_tenant=check_tenant,
    event_types=lambda _t, workflow_id: (event_type_for(workflow_id),),
    duties=lambda: (Duty("poll_sources", DUTY_EVERY_SECONDS, poll_due_sources),),
    check_activation=check_activation,
    status=status,
)
