"""Replay planning, pure: what is copied, what is reset, what is restarted."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from shared.ops.replay_plan import JournalStep, plan_replay, reachable_nodes
from shared.workflows.definition import WorkflowDefinition


def _wf(steps: list[dict[str, Any]]) -> WorkflowDefinition:
    return WorkflowDefinition.model_validate(
        {"name": "wf", "tenant": "acme", "trigger": {"events": ["a.b"]}, "steps": steps}
    )


def _s(key: str, status: str, choice: str | None = None) -> JournalStep:
    return JournalStep(
        id=f"id-{key}",
        step_key=key,
        node_id=key.split("[", maxsplit=1)[0],
        block_type="http.request",
        status=status,
        branch_choice=choice,
    )


BRANCHY = _wf(
    [
        {"id": "a", "type": "http.request", "next": "br"},
        {
            "id": "br",
            "type": "branch",
            "branches": [{"when": "true", "next": "l1"}],
            "otherwise": "r1",
        },
        {"id": "l1", "type": "http.request", "next": "l2"},
        {"id": "l2", "type": "http.request", "next": "join"},
        {"id": "r1", "type": "http.request", "next": "r2"},
        {"id": "r2", "type": "http.request", "next": "join"},
        {"id": "join", "type": "http.request"},
    ]
)


def test_a_chain_copies_what_settled_before_the_error_and_restarts_the_error() -> None:
    steps = [_s("a", "succeeded"), _s("br", "succeeded", "l1"), _s("l1", "failed")]
    plan = plan_replay(BRANCHY, steps)
    assert [s.step_key for s in plan.copy] == ["a", "br"]
    assert [s.step_key for s in plan.restart] == ["l1"]
    assert plan.reset_nodes == {"l1", "l2", "join"}
    assert plan.first_error is not None and plan.first_error.step_key == "l1"


def test_the_other_branch_of_a_parallel_fan_out_is_copied_untouched() -> None:
    # Both sides ran (the block created both successors); the left one failed.
    steps = [
        _s("a", "succeeded"),
        _s("br", "succeeded"),
        _s("l1", "failed"),
        _s("r1", "succeeded"),
        _s("r2", "succeeded"),
    ]
    plan = plan_replay(BRANCHY, steps)
    assert [s.step_key for s in plan.copy] == ["a", "br", "r1", "r2"]
    assert [s.step_key for s in plan.restart] == ["l1"]


def test_recorded_branch_choices_limit_the_reset_region() -> None:
    wf = _wf(
        [
            {"id": "f", "type": "http.request", "next": "br"},
            {
                "id": "br",
                "type": "branch",
                "branches": [{"when": "x", "next": "x"}],
                "otherwise": "y",
            },
            {"id": "x", "type": "http.request"},
            {"id": "y", "type": "http.request"},
        ]
    )
    chosen = [_s("f", "failed"), _s("br", "succeeded", "y")]
    assert reachable_nodes(wf, ["f"], chosen) == {"f", "br", "y"}
    assert reachable_nodes(wf, ["f"], [_s("f", "failed"), _s("br", "succeeded", "otherwise")]) == {
        "f",
        "br",
        "y",
    }
    assert reachable_nodes(wf, ["f"], [_s("f", "failed"), _s("br", "succeeded", "0")]) == {
        "f",
        "br",
        "x",
    }
    # The branch block's own journal values: the chosen node, or "no edge taken".
    from shared.blocks import flow
    from shared.ops.replay_plan import NO_BRANCH_TAKEN

    assert NO_BRANCH_TAKEN == flow.NO_BRANCH_TAKEN
    assert reachable_nodes(wf, ["f"], [_s("f", "failed"), _s("br", "succeeded", "x")]) == {
        "f",
        "br",
        "x",
    }
    assert reachable_nodes(
        wf, ["f"], [_s("f", "failed"), _s("br", "succeeded", NO_BRANCH_TAKEN)]
    ) == {"f", "br"}
    # No recorded choice: every edge is walked (more is reset, nothing is trusted blindly).
    assert reachable_nodes(wf, ["f"], [_s("f", "failed")]) == {"f", "br", "x", "y"}


def test_settled_iterations_beside_a_failed_one_are_kept() -> None:
    wf = _wf(
        [
            {"id": "each", "type": "http.request", "next": "after"},
            {"id": "after", "type": "http.request"},
        ]
    )
    steps = [_s("each[0]", "succeeded"), _s("each[1]", "failed"), _s("each[2]", "succeeded")]
    plan = plan_replay(wf, steps)
    assert [s.step_key for s in plan.copy] == ["each[0]", "each[2]"]
    assert [s.step_key for s in plan.restart] == ["each[1]"]


def test_unsettled_iterations_on_either_side_of_a_failed_one_restart_with_it() -> None:
    # Items are delivered in any order: each[2] failed while each[0] and each[3] waited.
    wf = _wf(
        [
            {"id": "each", "type": "http.request", "next": "after"},
            {"id": "after", "type": "http.request"},
        ]
    )
    steps = [
        _s("each[0]", "pending"),
        _s("each[1]", "succeeded"),
        _s("each[2]", "failed"),
        _s("each[3]", "waiting_for_retry"),
        _s("each[4]", "failed"),
    ]
    plan = plan_replay(wf, steps)
    assert [s.step_key for s in plan.copy] == ["each[1]"]
    assert [s.step_key for s in plan.restart] == ["each[0]", "each[2]", "each[3]", "each[4]"]


def test_an_unsettled_step_outside_the_region_is_restarted_too() -> None:
    steps = [
        _s("a", "succeeded"),
        _s("br", "succeeded"),
        _s("l1", "failed"),
        _s("r1", "waiting_for_retry"),
    ]
    plan = plan_replay(BRANCHY, steps)
    assert [s.step_key for s in plan.restart] == ["l1", "r1"]
    assert [s.step_key for s in plan.copy] == ["a", "br"]


def test_nothing_failed_and_nothing_unsettled_means_nothing_to_restart() -> None:
    plan = plan_replay(BRANCHY, [_s("a", "succeeded")])
    assert plan.restart == () and plan.first_error is None


def test_planning_imports_no_driver_and_no_http() -> None:
    src = Path(__file__).resolve().parent.parent / "shared/ops/replay_plan.py"
    imported: set[str] = set()
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not {
        m
        for m in imported
        if m.split(".")[0] in {"pg8000", "httpx", "shared"}
        and m not in {"shared.workflows.definition", "shared.workflows.step_keys"}
    }
