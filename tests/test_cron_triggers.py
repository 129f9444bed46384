"""Cron triggers (shared/triggers/cron.py): ticks across DST, the tick key under its unique
constraint (two racing sweeps fire one event), missed ticks recorded or caught up (capped),
ticks admitted like any event, and bad schedules refused by validate or reported by the duty
without stopping the sweep."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared import triggers
from shared.admission.admit import admit_event
from shared.core.db import Database
from shared.core.duty import SweepConfig, run_duty
from shared.publishing import versions
from shared.publishing.validate import validate_text
from shared.sweep.catalog import default_duties
from shared.triggers import cron
from tests.admission_support import activate_text, count, make_tenant
from tests.ops_support import bearer, client_fixture, dispatched_fixture, mint

__all__ = ["client_fixture", "dispatched_fixture"]

PARIS = "Europe/Paris"
GRACE = cron.CronSettings(grace=timedelta(minutes=5))


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def schedule(expr: str, zone: str = PARIS, *, catch_up: bool = False) -> cron.Schedule:
    return cron.parse_schedule({"cron": expr, "time_zone": zone, "catch_up": catch_up})


def source(trigger: str, name: str = "daily") -> str:
    return f"name: {name}\ntenant: acme\ntrigger: {trigger}\nsteps:\n  - {{id: done, type: end}}\n"


# ------------------------------------------------------------------ DST, pure


def test_fixed_time_in_the_spring_forward_gap_fires_once_right_after_the_gap() -> None:
    # Paris, 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
    ticks = cron.ticks_between(schedule("30 2 * * *"), utc(2026, 3, 27, 12), utc(2026, 3, 30, 12))
    assert ticks == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST, the first instant after the gap
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_fixed_time_in_the_fall_back_repeat_fires_only_at_the_first_occurrence() -> None:
    # Paris, 2026-10-25: 03:00 CEST goes back to 02:00 CET, so 02:30 happens twice.
    ticks = cron.ticks_between(schedule("30 2 * * *"), utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert ticks == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST (the first); not 01:30Z (02:30 CET)
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
    ]


def test_stepped_schedule_follows_real_time_through_both_dst_changes() -> None:
    every_half_hour = schedule("*/30 * * * *")
    # The repeated hour is lived twice: four ticks between 02:00 CEST and 02:30 CET.
    repeat = cron.ticks_between(
        every_half_hour, utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 1, 45)
    )
    assert repeat == [
        utc(2026, 10, 25, 0, 0),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 1, 0),
        utc(2026, 10, 25, 1, 30),
    ]
    # The skipped hour isn't: 01:30 CET is followed by 03:00 CEST, 30 real minutes later.
    gap = cron.ticks_between(every_half_hour, utc(2026, 3, 29, 0, 15), utc(2026, 3, 29, 1, 15))
    assert gap == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 0)]


def test_weekday_schedule_reads_local_time() -> None:
    ticks = cron.ticks_between(
        schedule("0 9 * * MON-FRI"), utc(2026, 12, 4, 0), utc(2026, 12, 8, 0)
    )
    # Friday 4th and Monday 7th at 09:00 Paris (08:00Z); nothing on the weekend.
    assert ticks == [utc(2026, 12, 4, 8), utc(2026, 12, 7, 8)]


# ------------------------------------------------------------------ planning, pure


def test_without_catch_up_only_a_timely_tick_fires_and_the_rest_are_recorded_missed() -> None:
    hourly = schedule("0 * * * *", "UTC")
    plan = cron.plan_ticks(
        hourly, utc(2026, 12, 3, 8, 30), utc(2026, 12, 3, 11, 2), grace=GRACE.grace
    )
    assert plan.fire == [utc(2026, 12, 3, 11)]
    assert [t for t, _ in plan.missed] == [utc(2026, 12, 3, 9), utc(2026, 12, 3, 10)]
    assert plan.missed[0][1] == "tick 2026-12-03 09:00 UTC was missed, catch_up is off"
    # Later than the grace: the newest tick is missed too.
    late = cron.plan_ticks(
        hourly, utc(2026, 12, 3, 8, 30), utc(2026, 12, 3, 11, 6), grace=GRACE.grace
    )
    assert late.fire == [] and len(late.missed) == 3


# ------------------------------------------------------------------ validate


@pytest.mark.parametrize(
    ("trigger", "path", "words"),
    [
        ('{cron: "0 9 * * *", time_zone: Mars/Olympus}', "trigger.time_zone", "unknown time zone"),
        ('{cron: "0 0 30 2 *"}', "trigger.cron", "never fires"),
        ('{cron: "0 0 31 4,6 *"}', "trigger.cron", "never fires"),
        ('{cron: "0 0 9 * * *"}', "trigger.cron", "five fields"),
        ('{cron: "61 * * * *"}', "trigger.cron", "cannot read"),
        ('{cron: "0 9 * * *", events: [a.b]}', "trigger", "both `events` and `cron`"),
        ("{events: [a.b], time_zone: UTC}", "trigger.time_zone", "belongs to a cron trigger"),
        ("{dedup: every_time}", "trigger", "needs one of"),
    ],
)
def test_bad_schedules_are_located_validate_errors(trigger: str, path: str, words: str) -> None:
    report = validate_text(source(trigger), "wf.yaml")
    assert not report.ok
    problems = [p for p in report.errors if p.where == path]
    assert problems, report.problems
    assert words in problems[0].message
    assert problems[0].line == 3


def test_a_good_schedule_validates_and_an_event_definition_keeps_its_hash() -> None:
    assert validate_text(source('{cron: "0 9 * * MON-FRI", time_zone: Europe/Paris}')).ok
    # Trigger fields added for cron stay out of the canonical form of an event trigger, so a
    # version stored before they existed is found again by the same content.
    report = validate_text(source("{events: [hubspot.contact.created]}"))
    assert report.definition is not None
    assert "cron" not in versions.canonical_json(report.definition)


# ------------------------------------------------------------------ against the database


def activate(db: Database, trigger: str, name: str = "daily") -> str:
    return activate_text(db, source(trigger, name))


def activated_at(db: Database, workflow_id: str) -> datetime:
    with db.transaction() as tx:
        value = tx.scalar(
            "SELECT activated_at FROM workflow_activations WHERE workflow_id = :w", w=workflow_id
        )
    assert isinstance(value, datetime)
    return value


def ticks(db: Database, workflow_id: str) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return list(reversed(cron.list_ticks(tx, workflow_id, limit=1000)))


def events_of(db: Database, workflow_id: str) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return [
            dict(r)
            for r in tx.all(
                "SELECT id, occurred_at, payload, source_event_id FROM workflow_trigger_events"
                " WHERE event_type = :e ORDER BY id",
                e=cron.event_type_for(workflow_id),
            )
        ]


def next_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0) + timedelta(minutes=1)


def test_a_tick_is_an_ordinary_event_that_admission_turns_into_one_run(db: Database) -> None:
    make_tenant(db)
    workflow_id = activate(db, '{cron: "* * * * *"}')
    tick = next_minute(activated_at(db, workflow_id))
    report = cron.fire_due_ticks(db, now=tick + timedelta(seconds=3), settings=GRACE)
    assert report == {"schedules": 1, "fired": 1, "missed": 0}
    (event,) = events_of(db, workflow_id)
    assert event["occurred_at"] == tick
    assert ticks(db, workflow_id)[0]["event_id"] == event["id"]
    result = admit_event(db, event["id"], publish=lambda ids: None)
    assert [o.workflow_id for o in result.admitted] == [workflow_id]
    # Run it twice: the same pass again decides nothing new.
    assert cron.fire_due_ticks(db, now=tick + timedelta(seconds=4), settings=GRACE)["fired"] == 0
    assert len(events_of(db, workflow_id)) == 1


def test_two_sweeps_racing_one_tick_emit_one_event(db: Database) -> None:
    make_tenant(db)
    workflow_id = activate(db, '{cron: "* * * * *"}')
    now = next_minute(activated_at(db, workflow_id)) + timedelta(seconds=1)
    barrier = threading.Barrier(2)
    results: list[dict[str, int]] = []
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            with db.transaction() as tx:
                (row,) = cron.active_schedules(tx)
                # Both have read the same state before either writes: each decides the tick.
                barrier.wait(timeout=10)
                results.append(cron.fire_schedule(tx, row, now, GRACE))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert sorted(r["fired"] for r in results) == [0, 1]
    assert len(events_of(db, workflow_id)) == 1
    assert count(db, "SELECT count(*) FROM cron_ticks WHERE workflow_id = :w", w=workflow_id) == 1


def test_catch_up_after_a_three_hour_outage_fires_the_newest_100_oldest_first(
    db: Database,
) -> None:
    make_tenant(db)
    workflow_id = activate(db, '{cron: "* * * * *", catch_up: true}')
    first = next_minute(activated_at(db, workflow_id))
    recovery = first + timedelta(hours=3, seconds=20)  # ticks first .. first+180 min are due
    report = cron.fire_due_ticks(db, now=recovery, settings=GRACE)
    assert report["fired"] == 100 and report["missed"] == 81
    events = events_of(db, workflow_id)
    expected = [first + timedelta(minutes=81 + i) for i in range(100)]
    assert [e["occurred_at"] for e in events] == expected  # oldest first, by event id
    assert all(e["payload"]["caught_up"] for e in events)
    rows = ticks(db, workflow_id)
    missed = [r for r in rows if r["status"] == "missed"]
    assert [r["scheduled_at"] for r in missed] == [first + timedelta(minutes=i) for i in range(81)]
    assert "beyond the catch-up cap of 100" in missed[-1]["detail"]


def test_missed_ticks_without_catch_up_are_recorded_and_shown_by_the_ops_api(
    db: Database, client: Any
) -> None:
    make_tenant(db)
    workflow_id = activate(db, '{cron: "0 * * * *", time_zone: Europe/Paris}')
    start = activated_at(db, workflow_id)
    first = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    recovery = first + timedelta(hours=2, minutes=1)  # 3 ticks due; the newest is 1 min late
    report = cron.fire_due_ticks(db, now=recovery, settings=GRACE)
    assert (report["fired"], report["missed"]) == (1, 2)
    assert len(events_of(db, workflow_id)) == 1
    token = mint(db, "acme")
    answer = client.get(f"/v1/workflows/{workflow_id}/ticks?status=missed", headers=bearer(token))
    assert answer.status_code == 200
    items = answer.get_json()["items"]
    local = first.astimezone(cron.ZoneInfo(PARIS))
    assert [i["status"] for i in items] == ["missed", "missed"]
    assert items[-1]["detail"] == (
        f"tick {local:%Y-%m-%d %H:%M} Europe/Paris was missed, catch_up is off"
    )
    status = client.get(f"/v1/workflows/{workflow_id}/trigger", headers=bearer(token))
    assert status.status_code == 200
    detail = status.get_json()["detail"]
    assert status.get_json()["kind"] == "cron"
    assert (detail["ticks_fired"], detail["ticks_missed"]) == (1, 2)
    assert items[-1]["detail"] in detail["recent_missed"]
    other = mint(db, None)
    assert (
        client.get(f"/v1/workflows/{workflow_id}/ticks", headers=bearer(other)).status_code == 200
    )
    make_tenant(db, "globex")
    stranger = mint(db, "globex")
    assert (
        client.get(f"/v1/workflows/{workflow_id}/ticks", headers=bearer(stranger)).status_code
        == 404
    )


def test_a_schedule_the_runtime_cannot_read_is_reported_and_the_others_still_fire(
    db: Database,
) -> None:
    make_tenant(db)
    good = activate(db, '{cron: "* * * * *"}', "good")
    bad = activate(db, '{cron: "* * * * *"}', "bad")
    # A version stored when its zone existed, read by a runtime whose tz database lacks it.
    with db.transaction() as tx:
        tx.execute("ALTER TABLE workflow_versions DISABLE TRIGGER workflow_versions_no_update")
        tx.execute(
            "UPDATE workflow_versions SET definition = jsonb_set(definition, '{trigger,time_zone}',"
            " '\"Atlantis/Capital\"') WHERE workflow_id = :w",
            w=bad,
        )
        tx.execute("ALTER TABLE workflow_versions ENABLE TRIGGER workflow_versions_no_update")
    # The sweep's duty: the bad schedule is reported in the duty's recorded result; the duty
    # itself succeeds, so the sweep goes on and the next period runs it again.
    (duty,) = cron.KIND.duties()
    result = run_duty(db, duty)
    assert result is not None and bad in result["errors"]
    assert "Atlantis/Capital" in result["errors"][bad]
    with db.transaction() as tx:
        assert tx.scalar("SELECT last_ok FROM sweep_duties WHERE name = 'fire_cron_ticks'")
    now = next_minute(max(activated_at(db, good), activated_at(db, bad))) + timedelta(seconds=2)
    report = cron.fire_due_ticks(db, now=now, settings=GRACE)
    assert report["fired"] == 1 and list(report["errors"]) == [bad]
    assert len(events_of(db, good)) == 1 and events_of(db, bad) == []


def test_the_sweeps_one_list_of_duties_carries_each_trigger_kinds_duties() -> None:
    names = [d.name for d in default_duties(SweepConfig())]
    assert len(names) == len(set(names))
    for kind in triggers.kinds():
        for duty in kind.duties():
            assert duty.name in names
    assert {"fire_cron_ticks", "poll_sources", "expire_webhook_trigger_keys"} <= set(names)
