"""One expression scope: a trigger rule, a branch condition and a step's `${{ … }}` template
read the same `event`, `trigger` and `record` (shared/workflows/scope.py), through real
admission and real step execution on the test's Postgres."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from shared.admission.admit import admit_event
from shared.blocks.base import BlockContext, BlockResult
from shared.core.db import Database
from shared.steps.advance import advance_step
from shared.workflows.scope import Occurrence
from tests.admission_support import (
    EVENT_TYPE,
    Published,
    bind_workflow,
    emit_event,
    make_connection,
    make_tenant,
)
from tests.examples_support import CRM_EVENT_EXAMPLES
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.steps_support import steps_of

PAYLOAD = {
    "eventId": 9001,
    "subscriptionType": "contact.propertyChange",
    "objectId": 101,
    "propertyName": "lifecyclestage",
    "propertyValue": "lead",
    "properties": {"firstname": "Ada"},
}


@pytest.fixture
def conn(db: Database) -> str:
    make_tenant(db)
    return make_connection(db)


def _echo_lookup(seen: list[dict[str, Any]]) -> Any:
    """`http.request` steps hand their rendered config to the test instead of sending it."""

    def echo(ctx: BlockContext, config: BaseModel) -> BlockResult:
        seen.append(config.model_dump())
        return BlockResult(output={"rendered": config.model_dump()})

    return block_lookup(Recorder(), **{"http.request": spec("http.request", echo)})


def _run_all(db: Database, first: list[str], lookup: Any) -> None:
    queue = list(first)
    while queue:
        advanced = advance_step(db, queue.pop(0), lookup=lookup, dispatch=queue.extend)
        assert advanced.claimed, advanced


EXPRESSIONS = [
    ("event.type", "hubspot.contact.property_changed"),
    ("event.changed_fields.lifecyclestage", "lead"),
    ("event.author_id", "userId:7"),
    ("event.source_event_id", "9001"),
    ("trigger.propertyName", "lifecyclestage"),
    ("trigger.objectId", 101),
    ("record.id", "101"),
    ("record.object_type", "contact"),
    ("record.lifecyclestage", "lead"),
    ("record.firstname", "Ada"),
]


@pytest.mark.parametrize(("expression", "value"), EXPRESSIONS)
def test_a_rule_a_branch_and_a_step_config_read_one_value(
    db: Database, conn: str, expression: str, value: Any
) -> None:
    literal = json.dumps(value)
    workflow = bind_workflow(
        db,
        "same-scope",
        rule=f"{expression} == {literal}",
        steps=[
            {
                "id": "show",
                "type": "http.request",
                "config": {
                    "url": "https://receiver.example/hook",
                    "body": {"value": f"${{{{ {expression} }}}}"},
                },
                "next": "check",
            },
            {
                "id": "check",
                "type": "branch",
                "branches": [{"when": f"{expression} == {literal}", "next": "same"}],
                "otherwise": "different",
            },
            {"id": "same", "type": "end"},
            {"id": "different", "type": "end"},
        ],
    )
    event_id = emit_event(
        db,
        connection_id=conn,
        changed={"lifecyclestage": "lead"},
        author_id="userId:7",
        source_event_id="9001",
        payload=PAYLOAD,
    )
    published = Published()
    result = admit_event(db, event_id, publish=published)
    outcome = result.outcome_for(workflow)
    assert outcome.outcome == "admitted", outcome  # the rule saw `value`
    seen: list[dict[str, Any]] = []
    _run_all(db, published.ids, _echo_lookup(seen))
    steps = steps_of(db, str(outcome.run_id))
    assert steps["show"]["status"] == "succeeded", steps["show"]["error"]
    assert seen[0]["body"] == {"value": value}  # the step's template rendered `value`
    assert steps["check"]["branch_choice"] == "same"  # the branch condition held too


def test_the_record_a_record_expression_named_is_the_one_steps_see(db: Database, conn: str) -> None:
    workflow = bind_workflow(
        db,
        "deal-record",
        record='{"id": trigger.dealId, "object_type": "deal"}',
        rule='record.object_type == "deal" && record.id == "555"',
        steps=[
            {
                "id": "show",
                "type": "http.request",
                "config": {
                    "url": "https://receiver.example/hook",
                    "body": {"record": "${{ record }}", "run": "${{ run.id }}"},
                },
            }
        ],
    )
    event_id = emit_event(db, connection_id=conn, payload={"dealId": "555"})
    published = Published()
    outcome = admit_event(db, event_id, publish=published).outcome_for(workflow)
    assert outcome.outcome == "admitted", outcome
    seen: list[dict[str, Any]] = []
    _run_all(db, published.ids, _echo_lookup(seen))
    key = f"{conn}:deal:555"
    assert seen[0]["body"] == {
        "record": {"id": "555", "object_type": "deal", "key": key},
        "run": outcome.run_id,
    }


SHOWN = {
    "type": "${{ event.type }}",
    "stage": "${{ record.lifecyclestage }}",
    "name": "${{ record.firstname }}",
    "property": "${{ trigger.propertyName }}",
}
RENDERED = {"type": EVENT_TYPE, "stage": "lead", "name": "Ada", "property": "lifecyclestage"}


def _show_workflow(db: Database) -> str:
    return bind_workflow(
        db,
        "shown",
        rule='record.lifecyclestage == "lead"',
        steps=[
            {
                "id": "show",
                "type": "http.request",
                "config": {"url": "https://receiver.example/hook", "body": SHOWN},
            }
        ],
    )


def test_a_replay_renders_what_the_original_run_rendered(db: Database, conn: str) -> None:
    from shared.ops.replay import replay_run
    from tests.steps_support import TENANT, run_row

    workflow = _show_workflow(db)
    published = Published()
    event_id = emit_event(db, connection_id=conn, payload=PAYLOAD)
    run_id = str(admit_event(db, event_id, publish=published).outcome_for(workflow).run_id)
    failing = block_lookup(
        Recorder(), **{"http.request": block_lookup(Recorder())("test.fail_permanent")}
    )
    _run_all(db, published.ids, failing)
    assert run_row(db, run_id)["status"] == "failed"

    replayed = replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=lambda ids: None)
    seen: list[dict[str, Any]] = []
    _run_all(db, list(replayed.restarted_step_ids), _echo_lookup(seen))
    assert seen == [{"url": "https://receiver.example/hook", "body": RENDERED}]
    assert run_row(db, replayed.run_id)["trigger_record"] == run_row(db, run_id)["trigger_record"]


def test_a_rehearsal_of_a_stored_event_renders_what_a_live_run_renders(
    db: Database, conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uuid import UUID

    from shared.ops.models import RehearsalRequest
    from shared.ops.rehearsal import drive_rehearsal, rehearsal_result, start_rehearsal

    monkeypatch.setenv("ACME_SIGNING_SECRET", "s3cret")
    with db.transaction() as tx:
        tx.execute("UPDATE tenants SET signing_secret_env = 'ACME_SIGNING_SECRET'")
    workflow = _show_workflow(db)
    event_id = emit_event(db, connection_id=conn, payload=PAYLOAD)
    start = start_rehearsal(
        db, RehearsalRequest(workflow_id=UUID(workflow), event_id=event_id), None
    )
    drive_rehearsal(db, start.run_id)
    result = rehearsal_result(db, start.run_id)
    assert result.status == "succeeded", result
    (sent,) = [w["would_send"] for w in result.would_send]
    assert json.loads(sent["body"]) == RENDERED


# --- the examples against what HubSpot really sends --------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
# The examples a HubSpot webhook starts: what such a webhook carries is what they may read.
EXAMPLES = CRM_EVENT_EXAMPLES
RECORD_READ = re.compile(r"\brecord\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*[\"']([^\"']+)[\"']\s*\])")


def _hubspot_property_change(event_type: str, prop: str) -> Occurrence:
    """The trigger occurrence a real HubSpot propertyChange webhook becomes: it carries the one
    property that changed, nothing else of the record."""
    from shared.providers.hubspot.normalize import normalize

    obj = event_type.split(".")[1]
    body = [
        {
            "eventId": 1774012,
            "subscriptionId": 2881778,
            "portalId": 62515,
            "appId": 1160452,
            "occurredAt": 1767225600000,
            "subscriptionType": f"{obj}.propertyChange",
            "attemptNumber": 0,
            "objectId": 123,
            "propertyName": prop,
            "propertyValue": "lead",
            "changeFlag": "UPDATED",
            "changeSource": "CRM_UI",
            "sourceId": "userId:5",
        }
    ]
    (event,) = normalize(json.dumps(body).encode())
    assert event.event_type == event_type
    return Occurrence(
        id=1,
        type=event.event_type,
        tenant_id="acme",
        connection_id="c0ffee00-0000-4000-8000-000000000001",
        source_event_id=event.source_event_id,
        occurred_at=event.occurred_at,
        author_id=event.author_id,
        changed_fields=event.changed_fields,
        payload=event.payload,
        record_object_type=event.object_type,
        record_object_id=event.object_id,
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_reads_only_what_a_hubspot_webhook_carries(path: Path) -> None:
    """A rule or step that reads `record.firstname` on a property change of lifecyclestage
    would never match, or fail at run time: a field the webhook doesn't carry is read from
    the CRM by a crm.get step first (`steps.<id>.output.properties.…`)."""
    import yaml

    from shared.workflows.definition import WorkflowDefinition
    from shared.workflows.expressions import compile_expression, evaluate, template_expressions
    from shared.workflows.scope import RunFacts, rule_scope, step_scope, trigger_record

    definition = WorkflowDefinition.model_validate(yaml.safe_load(path.read_text()))
    trigger = definition.trigger
    assert trigger.watch, "a property-change example watches the properties it reads"
    expressions = [("trigger.rule", trigger.rule)] if trigger.rule else []
    for step in definition.steps:
        expressions += [(f"{step.id}.config", e) for _, e in template_expressions(step.config)]
        expressions += [(f"{step.id}.when", b.when) for b in step.branches]
    for event_type in trigger.events:
        for prop in trigger.watch:
            occurrence = _hubspot_property_change(event_type, prop)
            record_expr = None if trigger.record == "event" else compile_expression(trigger.record)
            _, record, missing = trigger_record(occurrence, record_expr)
            assert missing is None, missing
            carried = set(record)
            for where, source in expressions:
                for m in RECORD_READ.finditer(source):
                    field = m.group(1) or m.group(2)
                    assert field in carried, (
                        f"{path.name} {where} reads record.{field}, which a {event_type} "
                        f"webhook for {prop} does not carry (it carries {sorted(carried)}): "
                        "fetch it with crm.get first"
                    )
            # Every template that reads no step output (nor a foreach's item, which comes from
            # one) renders over the real scope.
            run = RunFacts("r", "w", "v", "acme", "r", "live")
            if trigger.debounce is not None:  # a debounced run's event lists its burst
                burst = {"id": 1, "occurred_at": "2026-01-01T00:00:00Z", "changed_fields": {}}
                occurrence = dataclasses.replace(occurrence, burst=(burst,))
            scope = step_scope(occurrence, record, run=run, steps={})
            if trigger.rule:
                evaluate(trigger.rule, rule_scope(occurrence, record))
            for _, source in expressions:
                if not {"steps", "iteration"} & compile_expression(source).variables:
                    evaluate(source, scope)


# --- the scope is described once ------------------------------------------------------------


def test_the_description_names_every_field_the_scope_builds() -> None:
    from datetime import UTC, datetime

    from shared.workflows import scope

    occurrence = Occurrence(
        id=1,
        type="t.x.y",
        tenant_id="acme",
        connection_id="c",
        occurred_at=datetime.now(UTC),
        record_object_type="contact",
        record_object_id="1",
    )
    run = scope.RunFacts("r", "w", "v", "acme", "r", "live")
    # A foreach body's step: the widest scope there is.
    loop = {"item": {"n": 1}, "index": 0, "foreach": "each"}
    built = scope.step_scope(occurrence, None, run=run, steps={}, loop=loop)
    assert set(built) == set(scope.ROOTS) == scope.STEP_ROOTS
    assert "iteration" not in scope.step_scope(occurrence, None, run=run, steps={})
    assert set(scope.rule_scope(occurrence, {})) == scope.RULE_ROOTS
    for root in ("event", "record", "run", "iteration"):
        for name in built[root]:
            assert f"`{name}`" in scope.ROOTS[root], (root, name)


def test_the_json_schema_describes_the_scope_from_its_one_home() -> None:
    from shared.publishing.schema import build_schema
    from shared.workflows import scope

    schema = build_schema()
    described = schema["$defs"]["ExpressionScope"]
    assert {k: v["description"] for k, v in described["properties"].items()} == scope.ROOTS
    trigger = schema["$defs"]["Trigger"]["properties"]
    for where in (
        trigger["rule"],
        trigger["record"],
        schema["$defs"]["Branch"]["properties"]["when"],
    ):
        assert "#/$defs/ExpressionScope" in where["description"]


def test_the_readme_describes_the_scope_from_its_one_home() -> None:
    from shared.workflows import scope

    assert scope.markdown_table() in (ROOT / "README.md").read_text(), (
        "paste shared.workflows.scope.markdown_table() into the README's Expressions section"
    )


def test_the_scope_module_is_pure() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import shared.workflows.scope; "
        "print([m for m in ('pg8000', 'httpx') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"


def test_a_step_is_given_the_outputs_its_expressions_name_and_reads_them_as_before(
    db: Database,
) -> None:
    """Issue 23, item 16: a claim no longer carries every earlier output; a step reads the
    ones its expressions name (`steps.<id>`, `steps["<id>"]`), and one that reads `steps` by
    no literal name (`size(steps)`) still sees every succeeded step."""
    from shared.workflows.definition import Step
    from shared.workflows.scope import steps_read
    from tests.steps_support import definition, publish_version, start_run

    def step(config: dict[str, Any], **more: Any) -> Step:
        return Step.model_validate({"id": "x", "type": "http.request", "config": config, **more})

    assert steps_read(step({"a": "${{ steps.a.output.n }}", "b": '${{ steps["b-1"] }}'})) == {
        "a",
        "b-1",
    }
    assert steps_read(step({"a": "no template"})) == frozenset()
    assert steps_read(step({}, branches=[{"when": "steps.c.branch_choice == 'y'", "next": "x"}]))
    assert steps_read(step({"n": "${{ size(steps) }}"})) is None
    assert steps_read(step({"n": "${{ steps[trigger.k] }}"})) is None
    wait = Step.model_validate(
        {"id": "w", "type": "wait_for", "config": {"when": "steps.d.output.ok", "event": "e"}}
    )
    assert steps_read(wait) == {"d"}

    seen: list[dict[str, Any]] = []
    version = publish_version(
        db,
        definition(
            [
                {"id": "a", "type": "http.request", "config": {"n": 1}, "next": "b-1"},
                {"id": "b-1", "type": "http.request", "config": {"n": 2}, "next": "c"},
                {
                    "id": "c",
                    "type": "http.request",
                    "config": {
                        "a": "${{ steps.a.output.rendered.n }}",
                        "b": '${{ steps["b-1"].output.rendered.n }}',
                    },
                    "next": "d",
                },
                {"id": "d", "type": "http.request", "config": {"all": "${{ size(steps) }}"}},
            ]
        ),
    )
    _, first = start_run(db, version)
    _run_all(db, first, _echo_lookup(seen))
    assert seen[2] == {"a": 1, "b": 2} and seen[3] == {"all": 3}
