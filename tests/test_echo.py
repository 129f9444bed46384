"""Echo markers: the canonical value form, the all-fields match, expiry at the change's time,
and the sweep's cleanup (real Postgres)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import functions_framework
import pytest

from shared.core.db import Database
from shared.ingest.echo import (
    ENGINE_ADMISSION_SECONDS,
    canonical_value,
    check_echo,
    expire_echo_markers,
    is_echo,
    record_echo_marker,
    value_hash,
)
from tests.admission_support import make_connection, make_tenant

ROOT = Path(__file__).resolve().parent.parent
BASE = "https://hooks.example.com"


def test_canonical_value_is_what_a_provider_sends_back() -> None:
    assert canonical_value(None) == ""
    assert canonical_value("lead") == "lead"
    assert canonical_value(True) == "true" and canonical_value(False) == "false"
    assert canonical_value(100) == "100" and canonical_value(100.0) == "100"
    assert canonical_value(12.5) == "12.5"
    assert canonical_value({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    # HubSpot reports every propertyValue as a string: a number written is echoed as text.
    assert value_hash(42) == value_hash("42")
    assert value_hash("x") != value_hash("y")


def test_is_echo_needs_every_changed_field_to_match() -> None:
    markers = [("lifecyclestage", value_hash("customer")), ("owner", value_hash("7"))]
    assert is_echo({"lifecyclestage": "customer"}, markers)
    assert is_echo({"lifecyclestage": "customer", "owner": 7}, markers)
    # One field onceflow didn't write (or wrote a different value to) makes it a real change.
    assert not is_echo({"lifecyclestage": "customer", "phone": "1"}, markers)
    assert not is_echo({"lifecyclestage": "lead"}, markers)
    # Creations and deletions carry no changed fields: never an echo.
    assert not is_echo({}, markers)


def test_markers_match_while_alive_at_the_change_and_the_sweep_expires_them(
    db: Database,
) -> None:
    make_tenant(db)
    conn = make_connection(db)
    with db.transaction() as tx:
        written = record_echo_marker(
            tx,
            connection_id=conn,
            object_type="contact",
            object_id="101",
            fields={"lifecyclestage": "customer", "score": 10},
            step_id=None,
            ttl_seconds=60,
        )
    assert written == 2
    now = datetime.now(UTC)

    def check(changed: dict[str, object], at: datetime, object_type: str = "contact") -> bool:
        with db.transaction() as tx:
            return check_echo(
                tx,
                connection_id=conn,
                object_type=object_type,
                object_id="101",
                changed_fields=changed,
                occurred_at=at,
            )

    assert check({"lifecyclestage": "customer"}, now)
    assert check({"score": "10"}, now)
    assert not check({"lifecyclestage": "customer"}, now, object_type="deal")
    # A change that happened after the marker expired is a person's change, not our echo.
    assert not check({"lifecyclestage": "customer"}, now + timedelta(minutes=5))

    with db.transaction() as tx:
        tx.execute(
            "UPDATE echo_markers SET expires_at = now() - interval '2 days', "
            "keep_until = now() - interval '1 second'"
        )
    with db.transaction() as tx:
        assert expire_echo_markers(tx) == 2
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM echo_markers") == 0
        # Within the grace period a recently expired marker is kept for late admissions.
        record_echo_marker(
            tx,
            connection_id=conn,
            object_type="contact",
            object_id="101",
            fields={"x": 1},
            step_id=None,
            ttl_seconds=10,
        )
    with db.transaction() as tx:
        assert expire_echo_markers(tx) == 0


def test_a_change_made_before_onceflows_write_was_sent_is_not_its_echo(db: Database) -> None:
    """A rep sets lifecyclestage=customer; a minute later a workflow writes the same value.
    The rep's change happened before the write was sent, so no marker may explain it (the
    first release matched on expiry alone and refused the rep's change as an echo). Within
    the documented clock skew the marker still matches."""
    from shared.ingest.echo import ECHO_CLOCK_SKEW_SECONDS

    make_tenant(db)
    conn = make_connection(db)
    with db.transaction() as tx:
        record_echo_marker(
            tx,
            connection_id=conn,
            object_type="contact",
            object_id="7",
            fields={"lifecyclestage": "customer"},
            step_id=None,
        )
        sent_at = tx.scalar("SELECT sent_at FROM echo_markers")

    def check(at: datetime) -> bool:
        with db.transaction() as tx:
            return check_echo(
                tx,
                connection_id=conn,
                object_type="contact",
                object_id="7",
                changed_fields={"lifecyclestage": "customer"},
                occurred_at=at,
            )

    assert not check(sent_at - timedelta(minutes=1))
    assert not check(sent_at - timedelta(seconds=ECHO_CLOCK_SKEW_SECONDS + 1))
    assert check(sent_at - timedelta(seconds=ECHO_CLOCK_SKEW_SECONDS - 1))
    assert check(sent_at + timedelta(seconds=2))


def test_an_expired_marker_outlives_the_longest_path_an_undelivered_event_can_take(
    db: Database,
) -> None:
    """Invariant 17: a marker lives until every event that could echo it has been admitted.
    That path has two legs: the provider's own retries of a failed delivery (its declared
    redelivery horizon; HubSpot's 10 retries from 2 minutes, doubling, are 2,046 minutes),
    then onceflow's slowest admission, an event the sweep published again
    `max_event_redeliveries` times, `redeliver_events_after_seconds` apart, before giving it up
    as undelivered. Each provider's grace must cover both, and a marker written for a
    connection of that provider must carry it."""
    from shared.core.duty import SweepConfig
    from shared.ingest.echo import expiry_grace_seconds
    from shared.providers.registry import PROVIDERS, REDELIVERY_HORIZON_SECONDS

    config = SweepConfig()
    publisher_cadence = 60  # Cloud Scheduler's once a minute, the slowest publisher there is
    slowest_admission = (
        config.max_event_redeliveries + 1
    ) * config.redeliver_events_after_seconds + publisher_cadence
    assert slowest_admission < ENGINE_ADMISSION_SECONDS
    assert set(REDELIVERY_HORIZON_SECONDS) == set(PROVIDERS)
    hubspot_retries = sum(2**k for k in range(1, 11)) * 60  # 2 + 4 + ... + 1024 minutes
    assert REDELIVERY_HORIZON_SECONDS["hubspot"] >= hubspot_retries
    for provider in PROVIDERS:
        assert expiry_grace_seconds(provider) >= (
            REDELIVERY_HORIZON_SECONDS[provider] + slowest_admission
        )

    make_tenant(db)
    for provider in PROVIDERS:
        with db.transaction() as tx:
            conn = str(
                tx.scalar(
                    "INSERT INTO connections (tenant_id, provider, webhook_secret_env) "
                    "VALUES ('acme', :p, 'X') RETURNING id",
                    p=provider,
                )
            )
            record_echo_marker(
                tx,
                connection_id=conn,
                object_type="contact",
                object_id="1",
                fields={"f": 1},
                step_id=None,
            )
            kept = tx.scalar(
                "SELECT extract(epoch FROM keep_until - expires_at) FROM echo_markers "
                "WHERE connection_id = :c",
                c=conn,
            )
        assert float(kept) == expiry_grace_seconds(provider), provider


def _age_echo_markers(db: Database, seconds: float) -> None:
    """Move every timestamp of every marker `seconds` into the past: the write was sent that
    long ago (the sweep's and admission's `now()` stay real)."""
    with db.transaction() as tx:
        columns = [
            r["column_name"]
            for r in tx.all(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'echo_markers' AND data_type LIKE 'timestamp%'"
            )
        ]
        assignments = ", ".join(
            f"{c} = {c} - make_interval(secs => CAST(:s AS double precision))" for c in columns
        )
        tx.execute(f"UPDATE echo_markers SET {assignments}", s=seconds)


def test_a_hubspot_redelivery_late_within_its_horizon_is_still_an_echo_then_trimmed(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 9 of issue 23: HubSpot retries a failed delivery up to 10 times, 2, 4, 8, ...
    minutes apart (more than a day). The webhook was down; onceflow's write was sent
    `horizon - 1 h` ago; its echo, which occurred a second after the write, finally arrives
    through the webhook function (attemptNumber 9), is drained and admitted: it must still be
    refused as `echo_suppressed`, and the sweep must trim the marker once the horizon has
    passed. (The first release deleted markers an hour after expiry: the late echo started
    the workflow.)"""
    from shared.admission import admit as admission
    from shared.ingest.echo import expire_markers_past_grace
    from shared.ingest.inbox import drain_inbox
    from shared.providers.registry import REDELIVERY_HORIZON_SECONDS
    from tests import ingest_support
    from tests.admission_support import bind_workflow

    monkeypatch.setenv("WEBHOOK_NUDGE", "off")
    monkeypatch.setenv("HUBSPOT_SECRET_ACME", ingest_support.HUBSPOT_SECRET)
    conn = ingest_support.make_connection(db, watched_fields={"contact": ["lifecyclestage"]})
    workflow_id = bind_workflow(db, "on-stage")
    with db.transaction() as tx:
        record_echo_marker(
            tx,
            connection_id=conn,
            object_type="contact",
            object_id="101",
            fields={"lifecyclestage": "customer"},
            step_id=None,
        )
    horizon = REDELIVERY_HORIZON_SECONDS["hubspot"]
    _age_echo_markers(db, horizon - 3600)
    # The sweep's cleanup runs during the outage: the marker must survive it.
    assert expire_markers_past_grace(db) == {"expired": 0}
    with db.transaction() as tx:
        sent_at = tx.scalar("SELECT sent_at FROM echo_markers")

    late = ingest_support.hubspot_event(
        1, 101, property_value="customer", occurred_at_ms=int(sent_at.timestamp() * 1000) + 1000
    )
    late["attemptNumber"] = 9
    body = ingest_support.hubspot_body(late)
    client = functions_framework.create_app("webhook", str(ROOT / "main.py"), "http").test_client()
    path = f"/hubspot/{conn}"
    headers = ingest_support.hubspot_v3_headers(body, BASE + path)
    assert client.post(path, data=body, headers=headers, base_url=BASE).status_code == 200
    drain_inbox(db, budget_seconds=10, until_empty=True)
    with db.transaction() as tx:
        event_id = int(tx.scalar("SELECT id FROM workflow_trigger_events"))
    result = admission.admit_event(db, event_id, publish=lambda ids: None)
    assert [(o.workflow_id, o.reason) for o in result.outcomes] == [
        (workflow_id, "echo_suppressed")
    ]

    # Past the horizon nothing can echo the write any more: the sweep trims the marker.
    _age_echo_markers(db, 2 * 3600 + ENGINE_ADMISSION_SECONDS)
    assert expire_markers_past_grace(db) == {"expired": 1}
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM echo_markers") == 0
