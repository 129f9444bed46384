"""The picture of a run (pure: geometry and the autoescaped SVG template, no database): nodes
coloured by their step's status, the branch taken drawn bold and the other one dashed, a wait
with the time it wakes, and one waterfall bar per attempt, oldest first."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.ops.graph_svg import FILL, RECLAIMED, render_picture
from shared.ops.models import StepView
from shared.workflows.definition import WorkflowDefinition

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
DEFINITION = WorkflowDefinition.model_validate(
    {
        "name": "route-lead",
        "tenant": "acme",
        "trigger": {"events": ["hubspot.contact.created"]},
        "steps": [
            {
                "id": "triage",
                "type": "branch",
                "branches": [{"when": "event.id < 3 && true", "next": "call"}],
                "otherwise": "pause",
            },
            {"id": "call", "type": "http.request", "next": "done"},
            {"id": "pause", "type": "delay", "config": {"seconds": 60}, "next": "done"},
            {"id": "done", "type": "end"},
        ],
    }
)


def _lease(attempt: int, start: int, end: int, kind: str, status: str) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "lease_id": uuid.uuid4(),
        "claimed_at": T0 + timedelta(seconds=start),
        "end_kind": kind,
        "end_status": status,
        "outcome_code": None,
        "error_class": None,
        "error": "<timeout & more>" if kind == "reclaimed" else None,
        "ended_at": T0 + timedelta(seconds=end),
    }


def _step(node: str, status: str, n: int, **extra: Any) -> StepView:
    return StepView.model_validate(
        {
            "id": uuid.uuid4(),
            "step_key": node,
            "node_id": node,
            "block_type": "x",
            "status": status,
            "attempt": 1,
            "lease_id": None,
            "lease_expires_at": None,
            "wake_at": None,
            "dispatched_at": None,
            "idempotency_key": None,
            "side_effect_started_at": None,
            "input": None,
            "output": None,
            "error": None,
            "error_class": None,
            "outcome_code": None,
            "branch_choice": None,
            "copied_from": None,
            "created_at": T0 + timedelta(seconds=n),
            "started_at": None,
            "finished_at": None,
            "leases": [],
            **extra,
        }
    )


def test_the_picture_colours_nodes_marks_the_branch_taken_and_draws_every_attempt() -> None:
    steps = [
        _step(
            "triage",
            "succeeded",
            0,
            branch_choice="call",
            leases=[_lease(1, 0, 1, "settled", "succeeded")],
        ),
        _step(
            "call",
            "failed",
            1,
            attempt=2,
            leases=[
                _lease(1, 1, 31, "reclaimed", "pending"),
                _lease(2, 32, 33, "settled", "failed"),
            ],
        ),
    ]
    svg = str(render_picture(DEFINITION, steps, T0 + timedelta(minutes=5)))
    root = ET.fromstring(svg)  # well-formed: every tenant-chosen text was escaped
    nodes = {g.get("data-node"): g for g in root.iter(f"{SVG}g") if g.get("data-node")}
    assert set(nodes) == {"triage", "call", "pause", "done"}
    fills = {k: g.find(f"{SVG}rect").get("fill") for k, g in nodes.items()}  # type: ignore[union-attr]
    assert fills == {
        "triage": FILL["succeeded"],
        "call": FILL["failed"],
        "pause": FILL[None],
        "done": FILL[None],
    }
    assert nodes["pause"].get("data-status") == "not_reached"
    taken = [e for e in root if "taken" in (e.get("class") or "")]
    assert len(taken) == 1 and taken[0].findtext(f"{SVG}title") == "if event.id < 3 && true"
    attempts = [g for g in root.iter(f"{SVG}g") if g.get("class") == "attempt"]
    assert [a.findtext(f"{SVG}text") for a in attempts] == ["triage #1", "call #1", "call #2"]
    bars = [a.find(f"{SVG}rect") for a in attempts]
    assert bars[1].get("fill") == RECLAIMED and bars[2].get("fill") == FILL["failed"]  # type: ignore[union-attr]
    # The 30 s reclaimed lease is drawn 30 times as wide as the 1 s attempts.
    widths = [float(b.get("width")) for b in bars]  # type: ignore[arg-type, union-attr]
    assert abs(widths[1] / widths[0] - 30) < 0.5
    assert "<timeout & more>" in (attempts[1].findtext(f"{SVG}title") or "")


def test_a_wait_shows_when_it_wakes_and_a_run_without_attempts_has_no_waterfall() -> None:
    steps = [
        _step("triage", "succeeded", 0, branch_choice="pause"),
        _step("pause", "waiting_for_delay", 1, wake_at=T0 + timedelta(hours=1)),
    ]
    root = ET.fromstring(str(render_picture(DEFINITION, steps, T0)))
    pause = next(g for g in root.iter(f"{SVG}g") if g.get("data-node") == "pause")
    assert "waits until 2026-12-03 10:00:00" in (pause.findtext(f"{SVG}title") or "")
    assert pause.get("data-status") == "waiting_for_delay"
    assert not [g for g in root.iter(f"{SVG}g") if g.get("class") == "attempt"]


def test_a_step_parked_for_an_approval_or_an_event_is_drawn_waiting_not_unreached() -> None:
    """Every step status has its own colour, and a parked one is drawn like a wait: a step
    waiting for a person looked grey like a step never reached."""
    from shared.steps.states import PARKED, StepStatus

    assert set(StepStatus) <= set(FILL)
    assert all(FILL[s] != FILL[None] for s in StepStatus)
    for status, words in (
        ("waiting_for_approval", "waits for approval until 2026-12-04 09:00:00"),
        ("waiting_for_event", "waits for an event until 2026-12-04 09:00:00"),
    ):
        assert status in PARKED
        steps = [
            _step("triage", "succeeded", 0, branch_choice="pause"),
            _step("pause", status, 1, wake_at=T0 + timedelta(days=1)),
        ]
        root = ET.fromstring(str(render_picture(DEFINITION, steps, T0)))
        pause = next(g for g in root.iter(f"{SVG}g") if g.get("data-node") == "pause")
        assert pause.find(f"{SVG}rect").get("fill") == FILL["waiting_for_delay"]  # type: ignore[union-attr]
        assert words in (pause.findtext(f"{SVG}title") or "")
