"""Why, from the first byte: a property change the drain turned into no event is recorded per
record (reason and field values), a webhook refused at the door is counted per connection
(never its body); both are explained on the record's timeline in plain words, visible only
to their tenant, and drops are trimmed after the retention."""

from __future__ import annotations

import time
from typing import Any

import functions_framework
import pytest

from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.ingest import inbox
from shared.ingest.drops import trim_drops
from shared.sweep.catalog import default_duties
from tests.ingest_support import (
    HUBSPOT_SECRET,
    hubspot_body,
    hubspot_event,
    hubspot_v3_headers,
    make_connection,
)
from tests.ops_support import (
    ROOT_MAIN,
    bearer,
    mint,
)

T = 1_700_000_000_000
BASE = "https://hooks.example.com"


def _deliver(db: Database, conn: str, *events: dict[str, Any]) -> None:
    with db.transaction() as tx:
        inbox.store(tx, conn, hubspot_body(*events), {})


def _changes_of_contact_101(db: Database, tenant: str) -> str:
    conn = make_connection(db, tenant_id=tenant, watched_fields={"contact": ["lifecyclestage"]})
    _deliver(db, conn, hubspot_event(1, property_value="lead", occurred_at_ms=T))
    # The provider announces event 1 again (another delivery attempt: a different body).
    again = hubspot_event(1, property_value="lead", occurred_at_ms=T)
    again["attemptNumber"] = 1
    _deliver(db, conn, again)
    _deliver(
        db,
        conn,
        hubspot_event(2, property_name="firstname", property_value="Ada", occurred_at_ms=T + 1),
        hubspot_event(3, property_value="lead", occurred_at_ms=T + 2),
        hubspot_event(4, property_value="x" * 300, occurred_at_ms=T - 5000),
    )
    inbox.drain_inbox(db, budget_seconds=10, until_empty=True)
    return conn


def test_every_drop_is_recorded_per_record_and_explained_to_its_tenant_only(
    db: Database, client: Any
) -> None:
    acme = _changes_of_contact_101(db, "acme")
    globex = _changes_of_contact_101(db, "globex")
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT reason, fields, source_event_id FROM pre_admission_drops"
            " WHERE connection_id = :c ORDER BY id",
            c=acme,
        )
    # The change's time is part of its identity (shared/providers/hubspot/normalize.py dedup_key).
    assert [(r["reason"], r["fields"], r["source_event_id"].split(":")[4]) for r in rows] == [
        ("re_announced", {"lifecyclestage": "lead"}, str(T)),
        # A body's events are applied in the order they occurred; a long value is cut.
        ("out_of_order", {"lifecyclestage": "x" * 200 + "…"}, str(T - 5000)),
        ("not_watched", {"firstname": "Ada"}, str(T + 1)),
        ("unchanged", {"lifecyclestage": "lead"}, str(T + 2)),
    ]

    token = mint(db, "acme")
    story = client.get(
        "/v1/records/explain",
        query_string={"record_key": f"{acme}:contact:101"},
        headers=bearer(token),
    ).get_json()
    drops = {d["reason"]: d for d in story["drops"]}
    assert set(drops) == {"not_watched", "unchanged", "out_of_order", "re_announced"}
    assert (
        "no active workflow watches that field on contact records"
        in (drops["not_watched"]["explanation"])
    )
    assert "`watch` list" in drops["not_watched"]["explanation"]
    assert drops["not_watched"]["fields"] == {"firstname": "Ada"}
    assert "arrived late" in drops["out_of_order"]["explanation"]
    assert len(story["events"]) == 1  # the one change that did become an event
    # The other tenant's identical record and drops stay theirs.
    other = client.get(
        "/v1/records/explain",
        query_string={"record_key": f"{globex}:contact:101"},
        headers=bearer(token),
    )
    assert other.status_code == 404
    assert {d["id"] for d in story["drops"]}.isdisjoint(_drop_ids(db, globex))
    # The page says the same in plain words.
    client.post("/ui/login", data={"token": token})
    html = client.get("/ui", query_string={"q": f"{acme}:contact:101"}).get_data(as_text=True)
    assert "Changes that never became events" in html
    assert "<code>firstname</code> = <code>Ada</code>" in html
    assert globex not in html


def _drop_ids(db: Database, conn: str) -> set[int]:
    with db.transaction() as tx:
        return {
            r["id"]
            for r in tx.all("SELECT id FROM pre_admission_drops WHERE connection_id = :c", c=conn)
        }


def test_drops_are_trimmed_after_the_retention_by_a_sweep_duty(db: Database) -> None:
    conn = _changes_of_contact_101(db, "acme")
    with db.transaction() as tx:
        tx.execute(
            "UPDATE pre_admission_drops SET recorded_at = now() - interval '15 days'"
            " WHERE reason IN ('unchanged', 'out_of_order')"
        )
    assert trim_drops(db, 14) == {"deleted": 2}
    with db.transaction() as tx:
        left = tx.all("SELECT reason FROM pre_admission_drops WHERE connection_id = :c", c=conn)
    assert sorted(r["reason"] for r in left) == ["not_watched", "re_announced"]
    assert trim_drops(db, 14) == {"deleted": 0}  # again: nothing more
    config = SweepConfig.from_env({"ONCEFLOW_DROP_RETENTION_DAYS": "3"})
    assert config.drop_retention_days == 3
    assert "trim_pre_admission_drops" in {d.name for d in default_duties(config)}


def test_refused_webhooks_are_counted_per_connection_and_explained(
    db: Database, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")
    monkeypatch.delenv("PUBLIC_BASE_URL", raising=False)
    monkeypatch.setenv("HUBSPOT_SECRET_ACME", HUBSPOT_SECRET)
    webhook = functions_framework.create_app("webhook", ROOT_MAIN, "http").test_client()
    acme = make_connection(db, tenant_id="acme")
    globex = make_connection(db, tenant_id="globex", secret_env="HUBSPOT_SECRET_ACME")
    body = hubspot_body(hubspot_event(1))
    path = f"/hubspot/{acme}"
    forged = hubspot_v3_headers(body, BASE + path, secret="guess")
    for _ in range(2):
        assert webhook.post(path, data=body, headers=forged, base_url=BASE).status_code == 401
    stale = hubspot_v3_headers(body, BASE + path, timestamp_ms=int(time.time() * 1000) - 600_000)
    assert webhook.post(path, data=body, headers=stale, base_url=BASE).status_code == 401
    good = hubspot_v3_headers(body, BASE + path)
    assert webhook.post(path, data=body, headers=good, base_url=BASE).status_code == 200

    story = client.get(
        "/v1/records/explain",
        query_string={"record_key": f"{acme}:contact:101"},
        headers=bearer(mint(db, "acme")),
    ).get_json()
    counts = {w["check_name"]: w for w in story["webhook_refusals"]}
    assert {k: w["refusals"] for k, w in counts.items()} == {
        "hubspot_v3_mismatch": 2,
        "timestamp_stale": 1,
    }
    assert counts["hubspot_v3_mismatch"]["explanation"].startswith(
        "The signature did not match: check the app secret."
    )
    # Another tenant's connection shows none of it.
    theirs = client.get(
        "/v1/records/explain",
        query_string={"record_key": f"{globex}:contact:101"},
        headers=bearer(mint(db, "globex")),
    ).get_json()
    assert theirs["webhook_refusals"] == []
