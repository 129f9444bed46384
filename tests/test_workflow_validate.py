"""Definition validation: errors and warnings with file, line and column; the CLI; the schema;
the examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema_rs
import pytest
import yaml

from shared.blocks import registry
from shared.publishing.schema import render_schema
from shared.publishing.validate import Problem, validate_data, validate_text
from tests.examples_support import unexplained_problems

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "workflows").glob("*.yaml"))
HEAD = """\
name: wf
tenant: acme
trigger:
  events: [hubspot.contact.created]
"""


def _problems(text: str, severity: str = "error") -> list[Problem]:
    report = validate_text(textwrap.dedent(text), "wf.yaml")
    return [p for p in report.problems if p.severity == severity]


def _one(text: str, severity: str = "error") -> Problem:
    found = _problems(text, severity)
    assert len(found) == 1, [str(p) for p in found]
    return found[0]


def test_a_good_definition_validates() -> None:
    report = validate_text(
        HEAD
        + """\
steps:
  - id: create
    type: crm.create
    config: {object_type: tasks, properties: {subject: "Call ${{ record.firstname }}"}}
    next: notify
  - id: notify
    type: http.request
    config: {url: "https://example.com/x", body: {id: "${{ steps.create.output.id }}"}}
"""
    )
    assert report.ok, [str(p) for p in report.problems]
    assert report.definition is not None
    assert report.definition.entry.id == "create"


def test_yaml_syntax_error_has_a_position() -> None:
    p = _one(HEAD + "steps:\n  - id: [unclosed\n")
    assert "not valid YAML" in p.message
    assert (p.line, p.file) == (7, "wf.yaml")


def test_a_character_yaml_forbids_is_an_error_with_its_position() -> None:
    # \x84 (a C1 control) is refused by YAML's reader before any parsing starts.
    p = _one(HEAD + "description: caf\x84\n")
    assert p.message == "not valid YAML: character #x0084 is not allowed"
    assert (p.line, p.column, p.file) == (5, 17, "wf.yaml")


def test_missing_field_points_at_the_enclosing_mapping() -> None:
    p = _one("name: wf\ntenant: acme\nsteps:\n  - {id: a, type: end}\n")
    assert p.path == ("trigger",)
    assert "missing required field 'trigger'" in p.message
    assert (p.line, p.column) == (1, 1)


def test_wrong_value_says_what_was_expected_and_found() -> None:
    p = _one(
        """\
        name: wf
        tenant: acme
        trigger:
          events: [hubspot.contact.created]
          dedup: sometimes
        steps:
          - {id: a, type: end}
        """
    )
    assert p.path == ("trigger", "dedup")
    assert "'once_per_record', 'not_while_running' or 'every_time'" in p.message
    assert "found 'sometimes'" in p.message
    assert (p.line, p.column) == (5, 10)


def test_unknown_field_points_at_the_key() -> None:
    p = _one(HEAD + "steps:\n  - id: a\n    type: end\n    nxt: b\n")
    assert p.path == ("steps", 0, "nxt")
    assert "unknown field 'nxt'" in p.message
    assert (p.line, p.column) == (8, 5)


def test_duplicate_keys_are_errors() -> None:
    p = _one(HEAD + "steps:\n  - id: a\n    type: end\n    type: delay\n")
    assert "duplicate key 'type'" in p.message
    assert p.line == 8


def test_unknown_block_type_lists_the_known_ones() -> None:
    p = _one(HEAD + "steps:\n  - id: a\n    type: crm.delete\n")
    assert p.path == ("steps", 0, "type")
    assert "unknown block type 'crm.delete'" in p.message
    assert "crm.create" in p.message
    assert (p.line, p.column) == (7, 11)


def test_bad_config_is_checked_by_the_block_model_but_templates_pass() -> None:
    p = _one(HEAD + "steps:\n  - id: a\n    type: delay\n    config: {weeks: 1}\n")
    assert p.path == ("steps", 0, "config", "weeks")
    assert "unknown field 'weeks'" in p.message
    ok = validate_text(
        HEAD + 'steps:\n  - id: a\n    type: delay\n    config: {seconds: "${{ record.wait }}"}\n'
    )
    assert ok.ok, [str(x) for x in ok.problems]


def test_dangling_edge() -> None:
    p = _one(HEAD + "steps:\n  - id: a\n    type: delay\n    config: {seconds: 1}\n    next: b\n")
    assert p.path == ("steps", 0, "next")
    assert "edge to 'b', which is not a step id" in p.message
    assert p.line == 9


def test_unreachable_step() -> None:
    p = _one(HEAD + "steps:\n  - id: a\n    type: end\n  - id: b\n    type: end\n")
    assert p.path == ("steps", 1)
    assert "'b' is unreachable" in p.message


def test_cycle() -> None:
    text = (
        HEAD
        + """\
steps:
  - id: a
    type: delay
    config: {seconds: 1}
    next: b
  - id: b
    type: branch
    branches: [{when: "true", next: a}]
    otherwise: c
  - id: c
    type: end
"""
    )
    p = _one(text)
    assert "cycle: a -> b -> a" in p.message


def test_self_loop() -> None:
    p = _one(HEAD + "steps:\n  - id: a\n    type: delay\n    config: {seconds: 1}\n    next: a\n")
    assert "leads to itself" in p.message


def test_reference_to_a_step_that_cannot_have_run_yet() -> None:
    text = (
        HEAD
        + """\
steps:
  - id: first
    type: http.request
    config: {url: "https://e.com", body: {x: "${{ steps.second.output.id }}"}}
    next: second
  - id: second
    type: http.request
    config: {url: "https://e.com"}
"""
    )
    p = _one(text)
    assert p.path == ("steps", 0, "config", "body", "x")
    assert "'second', which cannot have run before 'first'" in p.message
    assert (p.line, p.column) == (8, 46)


def test_reference_to_a_step_on_only_some_paths_is_a_warning() -> None:
    text = (
        HEAD
        + """\
steps:
  - id: route
    type: branch
    branches: [{when: "record.vip", next: tag}]
    otherwise: notify
  - id: tag
    type: http.request
    config: {url: "https://e.com"}
    next: notify
  - id: notify
    type: http.request
    config: {url: "https://e.com", body: {tag: "${{ steps.tag.output.status }}"}}
"""
    )
    assert _problems(text) == []
    p = _one(text, "warning")
    assert "runs on only some paths" in p.message
    assert "has(steps.tag)" in p.message


def test_expression_that_does_not_compile() -> None:
    p = _one(
        HEAD.replace("created]", "created]\n  rule: 'record.x =='")
        + "steps:\n  - {id: a, type: end}\n"
    )
    assert p.path == ("trigger", "rule")
    assert "does not compile" in p.message
    assert p.line == 5


def test_trigger_rule_cannot_read_steps() -> None:
    p = _one(
        HEAD.replace("created]", "created]\n  rule: 'steps.a.output.x == 1'")
        + "steps:\n  - {id: a, type: end}\n"
    )
    assert "cannot read `steps`" in p.message


def test_sandbox_escape_is_refused_at_validation() -> None:
    p = _one(
        HEAD + "steps:\n  - id: a\n    type: branch\n"
        "    branches: [{when: \"__import__('os') == 1\", next: b}]\n"
        "    otherwise: b\n  - {id: b, type: end}\n"
    )
    assert "is not available" in p.message


def test_branch_shape_errors() -> None:
    text = HEAD + "steps:\n  - id: a\n    type: end\n    otherwise: a\n"
    assert any("only branch steps have `otherwise`" in p.message for p in _problems(text))
    text = HEAD + "steps:\n  - id: a\n    type: branch\n    next: b\n  - {id: b, type: end}\n"
    messages = [p.message for p in _problems(text)]
    assert any("at least one entry in `branches`" in m for m in messages)
    assert any("not `next`" in m for m in messages)


def test_several_errors_are_reported_in_one_pass() -> None:
    text = """\
name: Bad Name
tenant: acme
trigger:
  events: [hubspot.contact.created, Contact-Created]
  rule: 'record.x +'
steps:
  - id: a
    type: crm.update
    config: {object_type: contacts, object_id: "1", properties: {x: 1}, bogus: 1}
  - id: b
    type: nope
"""
    paths = {p.path for p in _problems(text)}
    assert paths == {
        ("name",),
        ("trigger", "events", 1),
        ("trigger", "rule"),
        ("steps", 0, "config", "bogus"),
        ("steps", 1, "type"),
    }


def test_risky_choices_are_warnings() -> None:
    text = """\
name: wf
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
steps:
  - id: a
    type: crm.create
    config: {object_type: tasks, properties: {subject: x}}
"""
    warnings = [p.message for p in _problems(text, "warning")]
    assert any("creates a record for every event" in w for w in warnings)
    assert any("no `watch` list" in w for w in warnings)
    assert _problems(text) == []


def test_json_definitions_are_accepted() -> None:
    data = yaml.safe_load(HEAD + "steps:\n  - {id: a, type: end}\n")
    report = validate_text(json.dumps(data, indent=2), "wf.json")
    assert report.ok
    assert validate_data(data).ok


def test_dates_stay_strings() -> None:
    report = validate_text(
        HEAD + "steps:\n  - id: a\n    type: delay\n    config: {until: 2030-01-01T00:00:00Z}\n"
    )
    assert report.ok
    assert report.definition is not None
    assert report.definition.steps[0].config == {"until": "2030-01-01T00:00:00Z"}


# ---------------------------------------------------------------- CLI, schema, examples


def test_cli_exits_non_zero_on_errors_and_prints_positions(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEAD + "steps:\n  - id: a\n    type: nope\n")
    good = EXAMPLES[0]
    result = subprocess.run(
        [sys.executable, "-m", "shared.ops.cli", "validate", str(good), str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 1
    assert f"{bad}:7:11: error: steps[0].type: unknown block type 'nope'" in result.stdout
    assert f"{good}: ok" in result.stdout
    ok = subprocess.run(
        [sys.executable, "-m", "shared.ops.cli", "validate", str(good)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_exported_schema_matches_the_models() -> None:
    committed = (ROOT / "schema" / "workflow.schema.json").read_text()
    assert committed == render_schema(), "run `make schema` and commit the result"


def test_examples_exist_for_each_automation() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"enroll-new-lead", "deal-closed-won", "lead-replied-reengage"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_with_the_full_catalog(path: Path) -> None:
    registry.load_catalog()
    report = validate_text(path.read_text(), str(path))
    unknown = [p for p in report.problems if "unknown block type" in p.message]
    assert not unknown, f"block types not registered: {[str(p) for p in unknown]}"
    assert report.ok, [str(p) for p in report.problems]
    assert not unexplained_problems(report), [str(p) for p in report.warnings]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_passes_the_exported_schema(path: Path) -> None:
    schema = json.loads((ROOT / "schema" / "workflow.schema.json").read_text())
    validator = jsonschema_rs.Draft202012Validator(schema)
    data = validate_text(path.read_text()).definition
    assert data is not None
    errors = [e.message for e in validator.iter_errors(data.model_dump(mode="json"))]
    assert errors == []


def test_schema_catches_a_bad_config_in_the_editor() -> None:
    schema = json.loads(render_schema())
    validator = jsonschema_rs.Draft202012Validator(schema)
    doc = yaml.safe_load(HEAD + "steps:\n  - {id: a, type: delay, config: {weeks: 1}}\n")
    assert not validator.is_valid(doc)
    doc = yaml.safe_load(HEAD + 'steps:\n  - {id: a, type: delay, config: {seconds: "${{ x }}"}}\n')
    assert validator.is_valid(doc)


# ---------------------------------------------------------------- wait_for

WAIT = """\
steps:
  - id: wait
    type: wait_for
    config:
      event: hubspot.contact.property_changed
      when: {when}
      timeout: {timeout}
      on_timeout: {on_timeout}
    next: after
  - id: after
    type: end
  - id: nudge
    type: end
"""


def test_a_wait_for_with_a_goto_validates_and_the_goto_is_an_edge() -> None:
    report = validate_text(
        HEAD
        + WAIT.format(
            when="'event.changed_fields.x == \"y\"'",
            timeout="{days: 3}",
            on_timeout="{goto: nudge}",
        )
    )
    assert report.ok, [str(p) for p in report.problems]
    assert report.definition is not None
    assert report.definition.step("wait").successors() == ["after", "nudge"]


def test_a_wait_for_goto_to_no_step_is_an_error_at_the_goto() -> None:
    problem = _one(
        HEAD + WAIT.format(when="'true'", timeout="{days: 3}", on_timeout="{goto: nowhere}")
    )
    assert problem.where == "steps[0].config.on_timeout.goto"
    assert "'nowhere', which is not a step id" in problem.message


def test_a_wait_for_condition_that_does_not_compile_is_an_error_at_the_condition() -> None:
    found = _problems(
        HEAD + WAIT.format(when="'event.x =='", timeout="{days: 3}", on_timeout="{goto: nudge}")
    )
    assert [p.where for p in found] == ["steps[0].config.when"], [str(p) for p in found]
    assert (found[0].line, found[0].column) == (10, 13)


@pytest.mark.parametrize("timeout", ["{days: 400}", "{}", "{seconds: 0}"])
def test_a_wait_for_needs_a_bounded_positive_timeout(timeout: str) -> None:
    found = _problems(
        HEAD + WAIT.format(when="'true'", timeout=timeout, on_timeout="{goto: nudge}")
    )
    assert found and all(p.where.startswith("steps[0].config") for p in found)
    assert any("timeout" in p.message for p in found), [str(p) for p in found]


def test_cli_summary_is_the_last_line_and_ends_with_a_newline(tmp_path: Path) -> None:
    """Piped (stdout block-buffered, stderr not), the summary used to come out before the
    problems it sums up; it is the last line of the combined output, newline-terminated."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEAD + "steps:\n  - id: a\n    type: nope\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for files, summary in (
        ([str(EXAMPLES[0]), str(bad)], "1 of 2 file(s) have errors"),
        ([str(EXAMPLES[0])], "1 file(s) ok"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "shared.ops.cli", "validate", *files],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
            check=False,
        )
        assert result.stdout.endswith("\n"), repr(result.stdout)
        assert result.stdout.splitlines()[-1].startswith(summary), result.stdout


# ---------------------------------------------------------------- what a wait can hear


def _wait(config: str) -> str:
    return (
        HEAD
        + textwrap.dedent(
            """\
        steps:
          - id: reply
            type: wait_for
            config:
        """
        )
        + textwrap.indent(textwrap.dedent(config), "      ")
        + "    next: done\n  - id: done\n    type: end\n"
    )


def test_a_wait_on_a_property_change_that_names_no_field_is_warned_about() -> None:
    """Issue 23 item 2: a wait hears a property change only for the fields it listens to
    (subscribed and watched); `when: true` names none."""
    unheard = _wait("event: hubspot.contact.property_changed\ntimeout: {days: 1}\n")
    problem = _one(unheard, "warning")
    assert problem.where == "steps[0].config.when"
    assert "can't tell which field" in problem.message and "`watch`" in problem.message
    for heard in (
        "event: hubspot.contact.property_changed\nwatch: [hs_lead_status]\ntimeout: {days: 1}\n",
        "event: hubspot.contact.property_changed\ntimeout: {days: 1}\n"
        "when: 'record.hs_lead_status == \"CONNECTED\"'\n",
        "event: hubspot.contact.created\ntimeout: {days: 1}\n",
    ):
        assert _problems(_wait(heard), "warning") == [], heard
        assert _problems(_wait(heard)) == [], heard


def test_an_unknown_event_type_is_refused_with_a_suggestion() -> None:
    """Issue 24 item 5: a misspelt event type bound the workflow to events that never come."""
    end = "steps:\n  - id: a\n    type: end\n"
    problem = _one(HEAD.replace("hubspot.contact.created", "hubspot.contacts.created") + end)
    assert problem.where == "trigger.events[0]"
    assert "did you mean 'hubspot.contact.created'?" in problem.message
    problem = _one(HEAD.replace("hubspot.contact.created", "hubspt.deal.created") + end)
    assert "there is no provider 'hubspt'" in problem.message
    assert "did you mean 'hubspot.deal.created'?" in problem.message
    # In a wait too.
    problem = _one(_wait("event: hubspot.contact.property_change\ntimeout: {days: 1}\n"))
    assert problem.where == "steps[0].config.event"
    assert "did you mean 'hubspot.contact.property_changed'?" in problem.message
    # The sender's own names (standard webhooks, app events) are not judged.
    for own in ("standard.invoice.paid", "acme.signup.done"):
        assert _problems(HEAD.replace("hubspot.contact.created", own) + end) == []


def test_a_task_hubspot_refuses_or_hides_is_warned_about() -> None:
    """Issue 24 item 5: HubSpot requires hs_timestamp on a task and shows it on a record only
    through an association (https://developers.hubspot.com/docs/api/crm/tasks)."""
    bare = HEAD + textwrap.dedent(
        """\
        steps:
          - id: t
            type: crm.create
            config:
              object_type: tasks
              properties: {hs_task_subject: Call}
        """
    )
    messages = sorted(p.message for p in _problems(bare, "warning"))
    assert len(messages) == 2, messages
    assert "refuses a task without `hs_timestamp`" in messages[0]
    assert "with no `associations` shows on no record" in messages[1]
    good = bare.replace(
        "properties: {hs_task_subject: Call}",
        'properties: {hs_task_subject: Call, hs_timestamp: "${{ event.occurred_at }}"}\n'
        '      associations: [{object_type: contacts, id: "${{ record.id }}"}]',
    )
    assert _problems(good, "warning") == [] and _problems(good) == []
    # Other objects need neither.
    contact = bare.replace("object_type: tasks", "object_type: contacts")
    assert _problems(contact, "warning") == []


# ---------------------------------------------------------------- waits of several events


MANY = """\
steps:
  - id: first
    type: delay
    config: {{seconds: 1}}
    next: wait
  - id: wait
    type: wait_for
    config:
{config}
      timeout: {{days: 3}}
    next: after
  - id: after
    type: end
"""


def _many(config: str) -> str:
    return HEAD + MANY.format(config=textwrap.indent(textwrap.dedent(config), " " * 6))


def test_a_wait_of_several_correlated_events_validates() -> None:
    report = validate_text(
        _many("""\
            mode: all
            correlate: {event: record.id, run: trigger.dealId}
            events:
              - {name: won, event: hubspot.deal.property_changed, when: 'record.dealstage == "won"'}
              - event: hubspot.deal.association_changed
                correlate: {event: trigger.fromObjectId, run: record.id}
            """),
        "wf.yaml",
    )
    assert report.ok, [str(p) for p in report.problems]


@pytest.mark.parametrize(
    ("config", "where", "position", "says"),
    [
        # each awaited event's condition is compiled where it is written
        (
            "events:\n  - {event: hubspot.contact.created, when: 'event.x =='}\n",
            "steps[1].config.events[0].when",
            (14, 50),
            "",
        ),
        # an unknown event type of one of the events
        (
            "events:\n  - event: hubspot.contact.created\n  - event: hubspot.contact.creatd\n",
            "steps[1].config.events[1].event",
            (15, 18),
            "did you mean 'hubspot.contact.created'",
        ),
        # the event's side of a correlation can't read the run
        (
            "event: hubspot.deal.created\n"
            "correlate: {event: steps.first.output.id, run: record.id}\n",
            "steps[1].config.correlate.event",
            (14, 26),
            "cannot read `steps`",
        ),
        # the run's side reads only steps that ran before the wait
        (
            "event: hubspot.deal.created\n"
            "correlate: {event: record.id, run: steps.after.output.id}\n",
            "steps[1].config.correlate.run",
            (14, 42),
            "cannot have run before",
        ),
        # a bad mode, at the mode
        (
            "mode: some\nevents:\n  - event: hubspot.contact.created\n",
            "steps[1].config.mode",
            (13, 13),
            "'any' or 'all'",
        ),
        # an unknown field of an awaited event, at its key
        (
            "events:\n  - {event: hubspot.contact.created, whan: 'true'}\n",
            "steps[1].config.events[0].whan",
            (14, 44),
            "unknown field 'whan'",
        ),
    ],
)
def test_each_field_of_a_wait_of_several_events_is_judged_where_it_is_written(
    config: str, where: str, position: tuple[int, int], says: str
) -> None:
    found = _problems(_many(config))
    assert [p.where for p in found] == [where], [str(p) for p in found]
    assert (found[0].line, found[0].column) == position, str(found[0])
    assert says in found[0].message, found[0].message


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("mode: all\nevent: hubspot.contact.created\n", "`mode` applies to `events`"),
        (
            "event: hubspot.contact.created\nevents:\n  - event: hubspot.contact.created\n",
            "`event`, or `events`",
        ),
        (
            "events:\n  - event: hubspot.contact.created\n  - event: hubspot.contact.created\n",
            "give each a distinct `name`",
        ),
        (
            "when: 'true == true'\nevents:\n  - event: hubspot.contact.created\n",
            "each event has its own `when`",
        ),
    ],
)
def test_a_wait_of_several_events_is_refused_its_contradictions_at_its_config(
    config: str, says: str
) -> None:
    found = _problems(_many(config))
    assert [p.where for p in found] == ["steps[1].config"], [str(p) for p in found]
    assert (found[0].line, found[0].column) == (13, 7), str(found[0])
    assert says in found[0].message, found[0].message


def test_each_awaited_property_change_is_listened_to() -> None:
    from shared.workflows import listening

    definition = yaml.safe_load(
        _many("""\
            events:
              - event: hubspot.contact.property_changed
                when: 'record.hs_lead_status == "CONNECTED"'
              - name: customer
                event: hubspot.contact.property_changed
                watch: [lifecyclestage]
            """)
    )
    fields = sorted(
        f for x in listening.listeners(definition) if x.where == "steps.wait" for f in x.fields
    )
    assert fields == ["hs_lead_status", "lifecyclestage"]


COMPENSATED = """\
steps:
  - id: create
    type: crm.create
    config: {object_type: tasks, properties: {subject: "Call"}}
    compensate:
      type: {undo_type}
      config: {undo_config}
    next: done
  - id: done
    type: end
"""


def _compensated(undo_type: str, undo_config: str) -> str:
    return HEAD + COMPENSATED.replace("{undo_type}", undo_type).replace(
        "{undo_config}", undo_config
    )


def test_a_compensation_reading_the_output_of_the_step_it_undoes_validates() -> None:
    report = validate_text(
        _compensated(
            "crm.update",
            '{object_type: tasks, object_id: "${{ steps.create.output.id }}", '
            "properties: {subject: Cancelled}}",
        ),
        "wf.yaml",
    )
    assert report.ok, [str(p) for p in report.problems]
    assert report.definition is not None
    undo = report.definition.step("create").compensation()
    assert undo is not None and undo.type == "crm.update"


def test_a_compensation_is_checked_like_a_step_with_its_position() -> None:
    p = _one(_compensated("crm.nope", "{}"))
    assert "unknown block type 'crm.nope'" in p.message
    assert (p.file, p.line, p.column) == ("wf.yaml", 10, 13)
    p = _one(_compensated("crm.update", "{object_type: tasks, properties: {subject: x}}"))
    assert "object_id" in p.message and p.line == 11
    p = _one(_compensated("delay", "{seconds: 5}"))
    assert "flow control" in p.message and (p.line, p.column) == (10, 13)
    p = _one(
        _compensated(
            "crm.update",
            '{object_type: tasks, object_id: "${{ steps.done.output.id }}", '
            "properties: {subject: x}}",
        )
    )
    assert "refers to step 'done', which cannot have run before 'create'" in p.message
    assert p.line == 11


FINALLY = """\
steps:
  - id: create
    type: crm.create
    config: {object_type: tasks, properties: {subject: "Call"}}
finally:
  - id: summary
    type: {final_type}
    config: {final_config}
    next: {final_next}
  - id: notify
    type: end
"""


def _with_finally(final_type: str, final_config: str, final_next: str = "notify") -> str:
    return HEAD + (
        FINALLY.replace("{final_type}", final_type)
        .replace("{final_config}", final_config)
        .replace("{final_next}", final_next)
    )


def test_a_finally_list_reading_a_main_step_validates_and_keeps_its_name() -> None:
    report = validate_text(
        _with_finally(
            "http.request",
            '{method: POST, url: "https://hooks.example.com/x", '
            'body: {task: "${{ steps.create.output.id }}"}}',
        ),
        "wf.yaml",
    )
    assert report.ok, [str(p) for p in report.problems]
    assert report.definition is not None and report.definition.finally_ is not None
    assert [s.id for s in report.definition.finally_] == ["summary", "notify"]
    assert "finally" in report.definition.model_dump(mode="json")


def test_a_finally_step_reads_the_finally_steps_before_it_not_those_after() -> None:
    chained = HEAD + FINALLY.replace("{final_type}", "http.request").replace(
        "{final_config}", '{method: POST, url: "https://hooks.example.com/x"}'
    ).replace("{final_next}", "notify").replace(
        "    type: end\n",
        "    type: http.request\n"
        '    config: {method: POST, url: "https://hooks.example.com/y", '
        'body: {said: "${{ steps.summary.output.status }}"}}\n',
    )
    report = validate_text(chained, "wf.yaml")
    assert report.ok, [str(p) for p in report.problems]


def test_a_finally_step_is_checked_like_a_step_with_its_position() -> None:
    p = _one(_with_finally("crm.nope", "{}"))
    assert "unknown block type 'crm.nope'" in p.message
    assert (p.file, p.line, p.column) == ("wf.yaml", 11, 11)
    p = _one(_with_finally("end", "{}", "create"))
    assert "a finally step leads to another finally step" in p.message
    assert (p.line, p.column) == (13, 11)
    p = _one(
        _with_finally(
            "http.request",
            '{method: POST, url: "https://hooks.example.com/x", '
            'body: {n: "${{ steps.notify.output.id }}"}}',
        )
    )
    assert "a finally step reads the main steps' outputs" in p.message and p.line == 12
    p = _one(
        HEAD
        + FINALLY.replace("id: summary", "id: create")
        .replace("{final_type}", "end")
        .replace("{final_config}", "{}")
        .replace("    next: {final_next}\n", "")
    )
    assert "duplicate step id 'create'" in p.message and p.line == 10
