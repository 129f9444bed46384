"""Echo markers: the canonical value form, the all-fields match, expiry at the change's time,
and the sweep's cleanup (real Postgres)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.db import Database
from shared.echo import (
    canonical_value,
    check_echo,
    expire_echo_markers,
    is_echo,
    record_echo_marker,
    value_hash,
)
from tests.admission_support import make_connection, make_tenant


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
        tx.execute("UPDATE echo_markers SET expires_at = now() - interval '2 hours'")
    with db.transaction() as tx:
        assert expire_echo_markers(tx, grace_seconds=3600) == 2
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
    from shared.echo import ECHO_CLOCK_SKEW_SECONDS

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


def test_an_expired_marker_outlives_the_longest_path_an_undelivered_event_can_take() -> None:
    """Invariant 17: a marker lives until every event that could echo it has been admitted.
    The slowest admission the engine still performs is an event the sweep published again
    `max_event_redeliveries` times, `redeliver_events_after_seconds` apart, before giving it up
    as undelivered; the grace after expiry must cover that whole path, or a late echo would
    start the workflow again."""
    from shared.echo import EXPIRY_GRACE_SECONDS
    from shared.steps.sweep import SweepConfig

    config = SweepConfig()
    publisher_cadence = 60  # Cloud Scheduler's once a minute, the slowest publisher there is
    slowest_admission = (
        config.max_event_redeliveries + 1
    ) * config.redeliver_events_after_seconds + publisher_cadence
    assert slowest_admission < EXPIRY_GRACE_SECONDS
