"""The expression sandbox: compile, evaluate, render, references, and escape attempts."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.workflows.expressions import (
    MAX_SOURCE_LENGTH,
    ExpressionError,
    PreparedScope,
    compile_expression,
    evaluate,
    evaluate_condition,
    references,
    render,
)

SCOPE: dict[str, Any] = {
    "event": {
        "type": "hubspot.contact.created",
        "occurred_at": datetime(2025, 3, 1, 12, 0, tzinfo=UTC),
        "payload": {"objectId": 42},
        "changed_fields": ["lifecyclestage"],
        "author_id": None,
    },
    "trigger": {"objectId": 42, "items": [1, 2, 3]},
    "record": {"id": "42", "object_type": "contacts", "firstname": "Ada", "score": 7},
    "steps": {
        "create_task": {"output": {"id": "t-9", "count": 3}},
        "notify-hook": {"output": {"status": 200}},
    },
}


def test_evaluates_over_the_scope() -> None:
    assert evaluate('record.firstname + "!"', SCOPE) == "Ada!"
    assert evaluate("record.score * 2", SCOPE) == 14
    assert evaluate("trigger.items.exists(i, i == 2)", SCOPE) is True
    assert evaluate('steps["notify-hook"].output.status', SCOPE) == 200
    assert evaluate('event.occurred_at < timestamp("2026-01-01T00:00:00Z")', SCOPE) is True


def test_condition_must_be_a_bool() -> None:
    assert evaluate_condition('record.firstname == "Ada"', SCOPE) is True
    with pytest.raises(ExpressionError, match="must be true or false"):
        evaluate_condition("record.score", SCOPE)


def test_missing_key_is_a_clear_error_and_has_tests_for_it() -> None:
    with pytest.raises(ExpressionError, match=r"no such key 'lastname'.*has\("):
        evaluate("record.lastname", SCOPE)
    assert evaluate("has(record.lastname)", SCOPE) is False


@pytest.mark.parametrize(
    ("src", "message"),
    [
        ("1 +", "does not compile"),
        ("", "empty"),
        ("foo.bar", "unknown name 'foo'"),
        ("os.system('x')", "unknown name 'os'"),
        ("__import__('os')", "is not available"),
        ("record.firstname.repeat(3)", "is not available"),
    ],
)
def test_compile_errors_say_what_is_wrong(src: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        compile_expression(src)


def test_references_finds_step_ids_in_both_spellings() -> None:
    assert references('steps.create_task.output.id + steps["notify-hook"].output.x') == {
        "create_task",
        "notify-hook",
    }
    # A comprehension variable or a field called steps is not the root variable.
    assert references('record.steps == 1 && "steps.fake" != ""') == set()


def test_render_whole_string_keeps_the_type_and_embedded_stringifies() -> None:
    config = {
        "count": "${{ steps.create_task.output.count }}",
        "subject": "Call ${{ record.firstname }} (${{ record.score }}) ${{ event.author_id }}",
        "nested": [{"when": "${{ event.occurred_at }}"}, "plain", 5],
        "flag": " ${{ record.score > 3 }} ",
        "two": "${{ record.score }}${{ record.score }}",
    }
    assert render(config, SCOPE) == {
        "count": 3,
        "subject": "Call Ada (7) ",
        "nested": [{"when": "2025-03-01T12:00:00Z"}, "plain", 5],
        "flag": True,
        "two": "77",
    }


def test_render_errors_name_the_expression() -> None:
    with pytest.raises(ExpressionError, match=r"record\.nope"):
        render({"x": "${{ record.nope }}"}, SCOPE)


# ---------------------------------------------------------------- sandbox escapes


@pytest.mark.parametrize(
    "src",
    [
        "record.__class__",
        "record.__class__.__mro__",
        'record["__dict__"]',
        "trigger.__globals__",
    ],
)
def test_attribute_access_to_internals_finds_only_data(src: str) -> None:
    """The scope is plain data: dunder names are just missing keys."""
    with pytest.raises(ExpressionError, match="no such key"):
        evaluate(src, SCOPE)


@pytest.mark.parametrize(
    "src",
    [
        "import('os')",
        "__import__('os').system('id')",
        "exec('1')",
        "open('/etc/passwd')",
        "getattr(record, '__class__')",
        "eval('1')",
    ],
)
def test_imports_and_host_functions_do_not_exist(src: str) -> None:
    with pytest.raises(ExpressionError):
        compile_expression(src)


def test_string_repetition_is_not_in_the_language() -> None:
    with pytest.raises(ExpressionError, match="string \\* int"):
        evaluate('"x" * 1000000000', SCOPE)


def test_huge_allocation_through_a_comprehension_is_stopped_before_it_runs() -> None:
    big = "y" * 60_000
    scope = {**SCOPE, "trigger": {"items": list(range(500)), "text": big}}
    started = time.monotonic()
    with pytest.raises(ExpressionError, match="could build about"):
        evaluate(
            "trigger.items.exists(i, size(trigger.text + trigger.text + trigger.text) == 0)", scope
        )
    assert time.monotonic() - started < 1.0


def test_very_long_evaluation_is_stopped_before_it_runs() -> None:
    """Nested comprehensions over a 1 000-element list would take minutes in this library;
    the cost estimate refuses them at once."""
    scope = {**SCOPE, "trigger": {"items": list(range(1_000))}}
    started = time.monotonic()
    with pytest.raises(ExpressionError, match="worst case"):
        evaluate("size(trigger.items.map(x, trigger.items.map(y, x + y))) > 0", scope)
    assert time.monotonic() - started < 1.0


def test_comprehension_nesting_is_limited_at_compile_time() -> None:
    src = (
        "trigger.items.all(a, trigger.items.all(b, trigger.items.all(c, "
        "trigger.items.all(d, a == d))))"
    )
    with pytest.raises(ExpressionError, match="nested 4 deep"):
        compile_expression(src)


def test_the_same_comprehension_runs_on_a_small_input() -> None:
    assert evaluate("size(trigger.items.map(x, trigger.items.map(y, x + y)))", SCOPE) == 3


def test_source_length_is_limited() -> None:
    with pytest.raises(ExpressionError, match="characters long"):
        compile_expression("1 + " * (MAX_SOURCE_LENGTH // 4 + 1) + "1")


def test_result_size_is_limited() -> None:
    scope = {**SCOPE, "trigger": {"text": "z" * 200_000}}
    with pytest.raises(ExpressionError, match="the result is"):
        evaluate("trigger.text + trigger.text", scope)


def test_regex_is_linear_time() -> None:
    """A classic catastrophic-backtracking pattern finishes at once (RE2-style engine)."""
    scope = {**SCOPE, "trigger": {"text": "a" * 5_000 + "!"}}
    started = time.monotonic()
    assert evaluate('trigger.text.matches("^(a+)+$")', scope) is False
    assert time.monotonic() - started < 1.0


def test_host_objects_never_reach_the_evaluator() -> None:
    with pytest.raises(ExpressionError, match="cannot pass a object"):
        evaluate("record.x", {"record": {"x": object()}})


@pytest.mark.parametrize(
    "src",
    [
        'record.firstname + "!"',
        "trigger.items.exists(i, i == 2)",
        'steps["notify-hook"].output.status',
        'event.occurred_at < timestamp("2026-01-01T00:00:00Z")',
        "record.lastname",  # no such key
        "record.score",  # not a bool
        "size(trigger.items.map(x, trigger.items.map(y, x + y))) > 0",  # over budget (big)
        "record.x",  # a host object in the scope
    ],
)
def test_a_prepared_scope_answers_like_the_plain_one_every_time(src: str) -> None:
    """Admission evaluates one rule per bound workflow over one event's PreparedScope, which is
    measured and converted once: each evaluation must answer exactly as over the dict."""
    values = {**SCOPE, "trigger": {"items": list(range(1_000))}, "record": {"x": object()}}
    for scope in (SCOPE, values):
        expected = _outcome(src, scope)
        assert expected[0] in ("value", "ExpressionError")
        prepared = PreparedScope(scope)
        assert [_outcome(src, prepared) for _ in range(3)] == [expected] * 3
        assert _outcome(src, prepared, condition=True) == _outcome(src, scope, condition=True)


def _outcome(src: str, scope: Any, *, condition: bool = False) -> tuple[str, Any]:
    try:
        return "value", (evaluate_condition if condition else evaluate)(src, scope)
    except ExpressionError as exc:
        return "ExpressionError", str(exc)


def test_a_variable_missing_from_a_prepared_scope_is_refused() -> None:
    with pytest.raises(ExpressionError, match="'steps' is not available here"):
        evaluate("steps.a.output", PreparedScope({"record": {}}))
