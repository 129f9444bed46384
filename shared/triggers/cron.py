"""Cron triggers: a workflow started by a schedule, once per tick.

    trigger: {cron: "0 9 * * MON-FRI", time_zone: Europe/Paris, catch_up: false}

The expression is read by `cronsim` (five fields; names like MON-FRI and JAN; `L` and `#`),
in `time_zone` (IANA name, default UTC). Ticks are instants: a tick's key is the workflow plus
the scheduled instant in UTC, and firing it is one INSERT into `cron_ticks` under that primary
key, in the transaction that emits its trigger event — so a retried, overlapping or racing
sweep that decides the same tick again conflicts and emits nothing.

Daylight saving time (cronsim follows Debian cron, the behaviour people already know):
- an expression with a fixed minute and hour (`30 2 * * *`) fires once per matching local day:
  in a spring-forward gap (02:30 does not exist that day) at the first instant after the gap
  (03:00 local); in a fall-back repeat (02:30 happens twice) only at the first 02:30;
- an expression whose minute or hour is a wildcard or step (`*/15 * * * *`, `0 * * * *`)
  follows real elapsed time: nothing in the gap, both halves of the repeated hour.

Which ticks are due is decided by the `fire_cron_ticks` sweep duty, from where the workflow's
ticks were last decided (the newest recorded tick, or its activation if later) up to now:
- the newest due tick fires if it is at most `grace` late (default 5 minutes: the sweep runs
  every minute, so a tick is normally seconds late);
- older due ticks, and a newest one later than the grace, are ticks missed while nothing ran.
  Without `catch_up` each is recorded `missed` with its reason; with `catch_up` they fire on
  recovery, the newest `CATCH_UP_LIMIT` (100) of them, oldest first, and the older ones are
  recorded missed ("beyond the catch-up cap"). At most `MISSED_RECORD_LIMIT` missed ticks are
  recorded one by one per pass; the oldest recorded one counts the rest.

Each tick's event has its own record identity (`cron_tick` / the UTC instant), so with the
default dedup mode `once_per_record` each tick starts one run, and a tick refused by admission
(credits, rule) shows in the refusals like any event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Duty
from shared.core.errors import PermanentError, TransientError
from shared.core.logs import get_logger
from shared.core.settings import DEFAULTS, settings_from
from shared.ingest.outbox import TriggerEvent, emit
from shared.triggers import AddProblem, TriggerKind
from shared.workflows.definition import Trigger

SQL = queries.load("cron")
SCHEDULES_ACTIVE = SQL["cron_schedules_active"]
TICK_INSERT = SQL["cron_tick_insert"]
TICK_SET_EVENT = SQL["cron_tick_set_event"]
TICKS_LIST = SQL["cron_ticks_list"]
TICKS_SUMMARY = SQL["cron_ticks_summary"]

CATCH_UP_LIMIT = 100
MISSED_RECORD_LIMIT = 100
# How far back a pass looks for ticks after a long outage: a minutely schedule down for a
# month would otherwise iterate 43,200 ticks only to record the newest few.
LOOKBACK = timedelta(days=7)
DEFAULT_GRACE_SECONDS = DEFAULTS.cron_grace_seconds
TICK_OBJECT_TYPE = "cron_tick"
DUTY_EVERY_SECONDS = 15.0
log = get_logger(__name__)


class CronInvalid(PermanentError, ValueError):
    """A schedule that cannot be used; `field` is the trigger field at fault."""

    code = "cron_invalid"

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Schedule:
    expression: str
    zone: ZoneInfo
    catch_up: bool

    @property
    def zone_name(self) -> str:
        return self.zone.key


def parse_schedule(trigger: Trigger | Mapping[str, Any]) -> Schedule:
    """The schedule of a cron trigger; `CronInvalid` naming the field at fault."""
    raw = trigger.model_dump() if isinstance(trigger, Trigger) else dict(trigger)
    expression = raw.get("cron")
    if not isinstance(expression, str):
        raise CronInvalid("cron", "a cron trigger needs a `cron` expression")
    zone_name = raw.get("time_zone") or "UTC"
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronInvalid(
            "time_zone", f"unknown time zone {zone_name!r}; use an IANA name like Europe/Paris"
        ) from None
    fields = expression.split()
    if len(fields) != 5:
        raise CronInvalid(
            "cron",
            f"a cron expression has five fields (minute hour day-of-month month day-of-week); "
            f"{expression!r} has {len(fields)}",
        )
    start = datetime(2000, 1, 1, tzinfo=zone)
    try:
        it = CronSim(expression, start)
    except CronSimError as exc:
        if _readable_in_some_month(fields):
            raise CronInvalid(
                "cron",
                f"cron expression {expression!r} never fires: no month it names has that day",
            ) from None
        raise CronInvalid("cron", f"cannot read cron expression {expression!r}: {exc}") from None
    try:
        next(it)
    except StopIteration:
        raise CronInvalid(
            "cron", f"cron expression {expression!r} never fires (no date matches it)"
        ) from None
    return Schedule(expression, zone, bool(raw.get("catch_up")))


def _readable_in_some_month(fields: list[str]) -> bool:
    """Whether the expression reads once its month field allows every month: then it was
    refused for naming a day its months don't have (`0 0 30 2 *`), not for bad syntax."""
    try:
        CronSim(" ".join([*fields[:3], "*", fields[4]]), datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError:
        return False
    return True


def ticks_between(schedule: Schedule, after: datetime, until: datetime) -> list[datetime]:
    """The ticks in (after, until], ascending, as UTC instants."""
    return list(_ticks(schedule, after, until))


def _ticks(schedule: Schedule, after: datetime, until: datetime) -> Any:
    it = CronSim(schedule.expression, after.astimezone(schedule.zone))
    for tick in it:
        instant = tick.astimezone(UTC)
        if instant > until:
            return
        # Debian-cron's handling of a repeated hour starts from the local wall time, so the
        # first tick can be the first 02:30 when `after` was in the second: already past.
        if instant > after:
            yield instant


@dataclass
class TickPlan:
    fire: list[datetime] = field(default_factory=list)  # ascending
    missed: list[tuple[datetime, str]] = field(default_factory=list)


def plan_ticks(
    schedule: Schedule, decided_until: datetime, now: datetime, *, grace: timedelta
) -> TickPlan:
    """What to do about the ticks after `decided_until` up to `now` (see the module doc)."""
    start = max(decided_until, now - LOOKBACK)
    keep = CATCH_UP_LIMIT + MISSED_RECORD_LIMIT
    newest: deque[datetime] = deque(maxlen=keep)
    total = 0
    for tick in _ticks(schedule, start, now):
        newest.append(tick)
        total += 1
    plan = TickPlan()
    if not newest:
        return plan
    due = list(newest)
    if schedule.catch_up:
        plan.fire = due[-CATCH_UP_LIMIT:]
        older = due[:-CATCH_UP_LIMIT]
        reason = f"beyond the catch-up cap of {CATCH_UP_LIMIT} (only the newest fire)"
    else:
        latest = due[-1]
        older = due[:-1]
        if now - latest <= grace:
            plan.fire = [latest]
        else:
            older = due
        reason = "catch_up is off"
    older = older[-MISSED_RECORD_LIMIT:]
    unrecorded = total - len(plan.fire) - len(older)
    for i, tick in enumerate(older):
        detail = f"tick {_local(schedule, tick)} was missed, {reason}"
        if i == 0 and unrecorded > 0:
            detail += f"; {unrecorded} earlier tick(s) since {_local(schedule, start)} too"
        plan.missed.append((tick, detail))
    if start > decided_until and older:
        tick, detail = plan.missed[0]
        plan.missed[0] = (
            tick,
            f"{detail}; ticks before {_local(schedule, start)} were not looked at "
            f"(more than {LOOKBACK.days} days back)",
        )
    return plan


def _local(schedule: Schedule, instant: datetime) -> str:
    return f"{instant.astimezone(schedule.zone):%Y-%m-%d %H:%M} {schedule.zone_name}"


def event_type_for(workflow_id: str) -> str:
    """The event type a workflow's ticks carry, and its binding listens to: its own, so a
    tick starts that workflow and no other."""
    return f"cron.tick.w{UUID(workflow_id).hex}"


@dataclass(frozen=True)
class CronSettings:
    grace: timedelta = timedelta(seconds=DEFAULT_GRACE_SECONDS)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CronSettings:
        return cls(grace=timedelta(seconds=settings_from(env).cron_grace_seconds))


@dataclass(frozen=True)
class ScheduleRow:
    workflow_id: str
    tenant_id: str
    name: str
    trigger: Mapping[str, Any]
    decided_until: datetime


def active_schedules(tx: Tx) -> list[ScheduleRow]:
    out = []
    for r in tx.all(SCHEDULES_ACTIVE):
        out.append(
            ScheduleRow(
                r["workflow_id"],
                r["tenant_id"],
                r["name"],
                r["trigger"],
                r["decided_until"],
            )
        )
    return out


def fire_schedule(
    tx: Tx, row: ScheduleRow, now: datetime, settings: CronSettings
) -> dict[str, int]:
    """Decide one workflow's due ticks in the caller's transaction: fire some, record the
    rest missed. A tick another sweep already decided is skipped (its INSERT conflicts)."""
    schedule = parse_schedule(row.trigger)
    plan = plan_ticks(schedule, row.decided_until, now, grace=settings.grace)
    fired = missed = 0
    for tick, detail in plan.missed:
        if tx.one(
            TICK_INSERT,
            workflow_id=row.workflow_id,
            scheduled_at=tick,
            status="missed",
            detail=detail,
        ):
            missed += 1
    for tick in plan.fire:
        late = (now - tick).total_seconds()
        detail = f"tick {_local(schedule, tick)} fired {late:.0f}s after its time" + (
            " (caught up)" if len(plan.fire) > 1 else ""
        )
        if not tx.one(
            TICK_INSERT,
            workflow_id=row.workflow_id,
            scheduled_at=tick,
            status="fired",
            detail=detail,
        ):
            continue
        event_id = emit(tx, tick_event(row, schedule, tick, caught_up=len(plan.fire) > 1))
        tx.execute(
            TICK_SET_EVENT, workflow_id=row.workflow_id, scheduled_at=tick, event_id=event_id
        )
        fired += 1
    return {"fired": fired, "missed": missed}


def tick_event(
    row: ScheduleRow, schedule: Schedule, tick: datetime, *, caught_up: bool
) -> TriggerEvent:
    instant = tick.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return TriggerEvent(
        tenant_id=row.tenant_id,
        event_type=event_type_for(row.workflow_id),
        payload={
            "cron": schedule.expression,
            "time_zone": schedule.zone_name,
            "scheduled_at": instant,
            "local_time": tick.astimezone(schedule.zone).isoformat(),
            "caught_up": caught_up,
        },
        # The tick's key again: the outbox's unique index on (tenant, connection,
        # source_event_id) is a second guard behind the cron_ticks primary key.
        source_event_id=f"cron:{row.workflow_id}:{instant}",
        record_object_type=TICK_OBJECT_TYPE,
        record_object_id=instant,
        occurred_at=tick,
    )


def fire_due_ticks(
    db: Database, *, now: datetime | None = None, settings: CronSettings | None = None
) -> dict[str, Any]:
    """The sweep duty: every active schedule's due ticks, one transaction per workflow.

    A schedule that cannot be read (a time zone the runtime's tz database lacks, say) is
    reported in the duty's result and logged, and the others go on: a bad schedule never
    stops the sweep or the other schedules."""
    settings = settings or CronSettings.from_env()
    with db.transaction() as tx:
        rows = active_schedules(tx)
    fired = missed = 0
    errors: dict[str, str] = {}
    for row in rows:
        at = now or datetime.now(UTC)
        try:
            with db.transaction() as tx:
                result = fire_schedule(tx, row, at, settings)
        except TransientError:
            raise
        except Exception as exc:
            errors[row.workflow_id] = f"{type(exc).__name__}: {exc}"
            log.warning(
                "cron schedule of workflow %s (%s) failed: %s", row.name, row.workflow_id, exc
            )
            continue
        fired += result["fired"]
        missed += result["missed"]
    out: dict[str, Any] = {"schedules": len(rows), "fired": fired, "missed": missed}
    if errors:
        out["errors"] = errors
    return out


def list_ticks(
    tx: Tx, workflow_id: str, *, status: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    return [
        dict(r) for r in tx.all(TICKS_LIST, workflow_id=workflow_id, status=status, limit=limit)
    ]


# --------------------------------------------------------------------------- the kind


def check(t: Trigger, add: AddProblem) -> None:
    try:
        parse_schedule(t)
    except CronInvalid as exc:
        add("error", ("trigger", exc.field), str(exc))
    if t.record != "event":
        add(
            "error",
            ("trigger", "record"),
            "a cron trigger's record is the tick itself; `record` does not apply",
        )
    if t.dedup == "not_while_running":
        add(
            "warning",
            ("trigger", "dedup"),
            "each tick is its own record, so not_while_running does not hold a tick back "
            "while the previous tick's run is still going",
        )


def status(tx: Tx, t: Trigger, workflow_id: str) -> dict[str, Any]:
    summary = tx.one(TICKS_SUMMARY, workflow_id=workflow_id)
    missed = list_ticks(tx, workflow_id, status="missed", limit=5)
    return {
        "cron": t.cron,
        "time_zone": t.time_zone or "UTC",
        "catch_up": bool(t.catch_up),
        "ticks_fired": int(summary["fired"]) if summary else 0,
        "ticks_missed": int(summary["missed"]) if summary else 0,
        "last_decided": summary["last_decided"].isoformat()
        if summary and summary["last_decided"]
        else None,
        "recent_missed": [m["detail"] for m in missed],
    }


KIND = TriggerKind(
    name="cron",
    fields=("cron", "time_zone", "catch_up"),
    applies=lambda t: t.cron is not None,
    check=check,
    event_types=lambda _t, workflow_id: (event_type_for(workflow_id),),
    duties=lambda: (Duty("fire_cron_ticks", DUTY_EVERY_SECONDS, fire_due_ticks),),
    status=status,
)
