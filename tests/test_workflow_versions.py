"""Immutable versions, content-hash reuse, activation/bindings, pinning, and the index lookup."""

from __future__ import annotations

import json

import pytest

from shared.core.db import Database
from shared.core.errors import OnceflowError
from shared.publishing import versions
from shared.publishing.validate import DefinitionInvalid

V1 = """\
name: greet
tenant: acme
trigger:
  events: [hubspot.contact.created, hubspot.contact.property_changed]
  watch: [email]
steps:
  - id: hello
    type: http.request
    config: {url: "https://example.com/v1"}
"""
# Same content, different formatting, comments, key order and explicit defaults.
V1_REFORMATTED = """\
# the same workflow
tenant: acme
name: greet
steps:
  - {id: hello, type: http.request, config: {url: "https://example.com/v1"}}
trigger: {events: [hubspot.contact.created, hubspot.contact.property_changed],
          watch: [email], dedup: once_per_record, record: event}
"""
V2 = """\
name: greet
tenant: acme
trigger:
  events: [hubspot.deal.created]
  dedup: every_time
steps:
  - id: hello
    type: http.request
    config: {url: "https://example.com/v2"}
    next: bye
  - id: bye
    type: end
"""


@pytest.fixture
def tenant(db: Database) -> str:
    with db.transaction() as tx:
        tx.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'Acme'), ('other', 'Other')")
    return "acme"


def _bindings(db: Database) -> list[tuple[str, str, str]]:
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT event_type, version_id::text AS v, dedup_mode FROM trigger_bindings "
            "ORDER BY event_type"
        )
    return [(r["event_type"], r["v"], r["dedup_mode"]) for r in rows]


@pytest.mark.usefixtures("tenant")
def test_identical_content_returns_the_same_version(db: Database) -> None:
    with db.transaction() as tx:
        first = versions.publish(tx, V1)
    with db.transaction() as tx:
        again = versions.publish(tx, V1_REFORMATTED)
        second = versions.publish(tx, V2)
    assert first.created and not again.created and second.created
    assert again.version_id == first.version_id
    assert (first.number, second.number) == (1, 2)
    assert second.workflow_id == first.workflow_id
    with db.transaction() as tx:
        listed = versions.list_versions(tx, first.workflow_id)
        count = tx.scalar("SELECT count(*) FROM workflow_versions")
    assert [v.number for v in listed] == [1, 2]
    assert count == 2


@pytest.mark.usefixtures("tenant")
def test_versions_are_immutable_in_the_database(db: Database) -> None:
    with db.transaction() as tx:
        v1 = versions.publish(tx, V1)
    with pytest.raises(OnceflowError, match="immutable"), db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_versions SET definition = '{}' WHERE id = CAST(:id AS uuid)",
            id=v1.version_id,
        )
    with db.transaction() as tx:
        assert versions.load_version(tx, v1.version_id).steps[0].config["url"].endswith("/v1")


@pytest.mark.usefixtures("tenant")
def test_an_invalid_definition_is_never_stored(db: Database) -> None:
    with pytest.raises(DefinitionInvalid) as refused, db.transaction() as tx:
        versions.publish(tx, V1.replace("http.request", "http.post"))
    assert "unknown block type 'http.post'" in str(refused.value)
    assert refused.value.report.errors[0].line == 8
    with pytest.raises(DefinitionInvalid, match="not yours"), db.transaction() as tx:
        versions.publish(tx, V1, tenant_id="other")
    with pytest.raises(DefinitionInvalid, match="does not exist"), db.transaction() as tx:
        versions.publish(tx, V1.replace("tenant: acme", "tenant: ghost"))
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_versions") == 0
        assert tx.scalar("SELECT count(*) FROM workflows") == 0


@pytest.mark.usefixtures("tenant")
def test_activate_writes_one_binding_per_event_and_rebinds(db: Database) -> None:
    with db.transaction() as tx:
        v1 = versions.publish(tx, V1)
        v2 = versions.publish(tx, V2)
        act = versions.activate(
            tx, tenant_id="acme", workflow_id=v1.workflow_id, version_id=v1.version_id
        )
    assert act.previous_version_id is None
    assert _bindings(db) == [
        ("hubspot.contact.created", v1.version_id, "once_per_record"),
        ("hubspot.contact.property_changed", v1.version_id, "once_per_record"),
    ]
    with db.transaction() as tx:
        act = versions.activate(
            tx, tenant_id="acme", workflow_id=v1.workflow_id, version_id=v2.version_id
        )
        found = versions.bindings_for_event(tx, tenant_id="acme", event_type="hubspot.deal.created")
        stale = versions.bindings_for_event(
            tx, tenant_id="acme", event_type="hubspot.contact.created"
        )
    assert act.previous_version_id == v1.version_id
    assert _bindings(db) == [("hubspot.deal.created", v2.version_id, "every_time")]
    assert found == [versions.Binding(v1.workflow_id, v2.version_id, "every_time")]
    assert stale == []
    with db.transaction() as tx:
        assert [v.active for v in versions.list_versions(tx, v1.workflow_id)] == [False, True]


@pytest.mark.usefixtures("tenant")
def test_activation_is_scoped_to_the_tenant_and_the_workflow(db: Database) -> None:
    with db.transaction() as tx:
        v1 = versions.publish(tx, V1)
        other = versions.publish(tx, V1.replace("name: greet", "name: other"))
    with pytest.raises(versions.WorkflowNotFound), db.transaction() as tx:
        versions.activate(
            tx, tenant_id="other", workflow_id=v1.workflow_id, version_id=v1.version_id
        )
    with pytest.raises(versions.VersionNotFound), db.transaction() as tx:
        versions.activate(
            tx, tenant_id="acme", workflow_id=v1.workflow_id, version_id=other.version_id
        )
    assert _bindings(db) == []


@pytest.mark.usefixtures("tenant")
def test_deactivate_removes_bindings_and_in_flight_runs_keep_their_version(
    db: Database,
) -> None:
    with db.transaction() as tx:
        v1 = versions.publish(tx, V1)
        versions.activate(
            tx, tenant_id="acme", workflow_id=v1.workflow_id, version_id=v1.version_id
        )
        run_id = _start_run(tx, v1.workflow_id, v1.version_id)
    with db.transaction() as tx:
        assert versions.deactivate(tx, tenant_id="acme", workflow_id=v1.workflow_id) == (
            v1.version_id
        )
        assert versions.deactivate(tx, tenant_id="acme", workflow_id=v1.workflow_id) is None
    assert _bindings(db) == []
    with db.transaction() as tx:
        row = tx.one(
            "SELECT status, version_id::text AS v FROM workflow_runs WHERE id = CAST(:id AS uuid)",
            id=run_id,
        )
    assert row == {"status": "running", "v": v1.version_id}


def _start_run(tx: object, workflow_id: str, version_id: str) -> str:
    from shared.core.db import Tx

    assert isinstance(tx, Tx)
    return str(
        tx.scalar(
            "INSERT INTO workflow_runs (tenant_id, workflow_id, version_id, start_key, "
            "dedup_mode, trigger_payload, lineage_root) VALUES ('acme', CAST(:w AS uuid), "
            "CAST(:v AS uuid), 'workflow_event:' || gen_random_uuid(), 'every_time', '{}', "
            "gen_random_uuid()) RETURNING id::text",
            w=workflow_id,
            v=version_id,
        )
    )


@pytest.mark.usefixtures("tenant")
def test_a_run_started_on_v1_stays_pinned_to_v1_after_v2_is_activated(db: Database) -> None:
    """Schema-level pinning: the run row names its version (a foreign key that cannot point at
    another workflow's version), and that version's graph is what loads for it."""
    with db.transaction() as tx:
        v1 = versions.publish(tx, V1)
        versions.activate(
            tx, tenant_id="acme", workflow_id=v1.workflow_id, version_id=v1.version_id
        )
        run_id = _start_run(tx, v1.workflow_id, v1.version_id)
    with db.transaction() as tx:
        v2 = versions.publish(tx, V2)
        versions.activate(
            tx, tenant_id="acme", workflow_id=v1.workflow_id, version_id=v2.version_id
        )
    with db.transaction() as tx:
        pinned = tx.scalar(
            "SELECT version_id::text FROM workflow_runs WHERE id = CAST(:id AS uuid)", id=run_id
        )
        graph = versions.load_version(tx, pinned)
    assert pinned == v1.version_id
    assert [s.id for s in graph.steps] == ["hello"]
    assert graph.steps[0].config["url"] == "https://example.com/v1"
    # The foreign key refuses a run naming a version of another workflow.
    with db.transaction() as tx:
        other = versions.publish(tx, V1.replace("name: greet", "name: other"))
    with pytest.raises(OnceflowError, match="foreign key"), db.transaction() as tx:
        _start_run(tx, v1.workflow_id, other.version_id)
    # And a version that runs point at cannot be deleted.
    with pytest.raises(OnceflowError, match="foreign key"), db.transaction() as tx:
        tx.execute("DELETE FROM workflow_versions WHERE id = CAST(:id AS uuid)", id=v1.version_id)


@pytest.mark.usefixtures("tenant")
def test_binding_lookup_uses_the_index(db: Database) -> None:
    with db.transaction() as tx:
        v1 = versions.publish(tx, V1)
        # Many tenants' bindings, so a sequential scan would be a real cost the planner avoids.
        tx.execute(
            "INSERT INTO tenants (id, name) SELECT 't' || g, 'T' FROM generate_series(1, 300) g"
        )
        tx.execute(
            "INSERT INTO workflows (id, tenant_id, name) SELECT gen_random_uuid(), 't' || g, 'w' "
            "FROM generate_series(1, 300) g"
        )
        tx.execute(
            "INSERT INTO workflow_versions (workflow_id, number, content_hash, definition, "
            "source_text) SELECT id, 1, repeat('a', 64), '{}', '' FROM workflows "
            "WHERE name = 'w'"
        )
        tx.execute(
            "INSERT INTO trigger_bindings (tenant_id, event_type, workflow_id, version_id, "
            "dedup_mode) SELECT w.tenant_id, 'hubspot.contact.e' || e, w.id, v.id, "
            "'every_time' FROM workflows w JOIN workflow_versions v ON v.workflow_id = w.id, "
            "generate_series(1, 20) e WHERE w.name = 'w'"
        )
        versions.activate(
            tx, tenant_id="acme", workflow_id=v1.workflow_id, version_id=v1.version_id
        )
    with db.transaction() as tx:
        tx.execute("ANALYZE trigger_bindings")
        lookup = versions.BINDINGS_FOR_EVENT.text
        plan = tx.all(
            "EXPLAIN (FORMAT JSON) " + lookup,
            tenant_id="acme",
            event_type="hubspot.contact.created",
        )
    text = json.dumps(plan)
    assert "trigger_bindings_pkey" in text, text
    assert "Seq Scan" not in text, text
