"""A picture of a run, drawn on the server as SVG: the workflow graph of the version the run
executes, each node coloured by its step's status, the branch taken, waits with the time they
wake, and a waterfall of every attempt from the lease history.

The page has a strict CSP and no scripts, so the picture is plain markup inlined in the page.
This module only computes the geometry (pure: no database, no HTTP); the markup is the
autoescaped template `templates/run_picture.svg`, so a step id or an error a tenant chose is
escaped like everything else on the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup

from shared.ops.html import TEMPLATES
from shared.ops.models import StepView
from shared.steps.states import PARKED, StepStatus
from shared.workflows.definition import Step, WorkflowDefinition

NODE_W, NODE_H = 190, 46
GAP_X, GAP_Y = 30, 56
PAD = 16
LANE_H, LANE_LABEL_W, WATERFALL_W = 20, 170, 560
# One colour per step status (the page's badge colours: ops.css), keyed by the statuses' one
# home so a status added there can't be drawn as a node no step reached (grey); a step parked
# for an event or an approval is waiting like a delay, not "not reached".
_WAIT_FILL = "#2b4acb"
FILL: dict[str | None, str] = {
    StepStatus.SUCCEEDED: "#1f7a4d",
    StepStatus.FAILED: "#b42318",
    StepStatus.RUNNING: "#8a6100",
    StepStatus.PENDING: "#8a6100",
    **{status: _WAIT_FILL for status in PARKED},
    StepStatus.SKIPPED: "#5b6475",
    None: "#c4c9d4",
}
RECLAIMED = "#d97706"  # an attempt whose lease expired and the sweep took back
WAITING = PARKED


@dataclass(frozen=True)
class Node:
    id: str
    block_type: str
    status: str | None
    x: int
    y: int
    fill: str
    note: str  # attempts, or when a wait wakes


@dataclass(frozen=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int
    taken: bool
    back: bool  # to a node on the same or an earlier level: drawn as a curve on the side
    label: str


@dataclass(frozen=True)
class Bar:
    label: str
    x: float
    y: int
    width: float
    fill: str
    title: str


@dataclass(frozen=True)
class Picture:
    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]
    bars: list[Bar]
    waterfall_y: int
    span_text: str


def _levels(definition: WorkflowDefinition) -> dict[str, int]:
    """Breadth-first depth from the entry step; unreachable steps go below the rest."""
    depth = {definition.entry.id: 0}
    queue = [definition.entry.id]
    while queue:
        current = queue.pop(0)
        for nxt in definition.step(current).successors():
            if nxt not in depth and any(s.id == nxt for s in definition.steps):
                depth[nxt] = depth[current] + 1
                queue.append(nxt)
    last = max(depth.values()) + 1
    for s in definition.steps:
        depth.setdefault(s.id, last)
    return depth


def _latest(steps: Sequence[StepView]) -> dict[str, StepView]:
    """The newest step row of each node (a node visited again in a loop has several)."""
    out: dict[str, StepView] = {}
    for s in steps:
        if s.node_id not in out or s.created_at >= out[s.node_id].created_at:
            out[s.node_id] = s
    return out


def _note(step: StepView | None) -> str:
    if step is None:
        return "not reached"
    if step.status in WAITING:
        waits_for = {
            StepStatus.WAITING_FOR_EVENT: "waits for an event",
            StepStatus.WAITING_FOR_APPROVAL: "waits for approval",
        }.get(StepStatus(step.status), "waits")
        if step.wake_at is not None:
            return f"{waits_for} until {step.wake_at:%Y-%m-%d %H:%M:%S}"
        return waits_for
    word = "attempt" if step.attempt == 1 else "attempts"
    return f"{step.status} · {step.attempt} {word}"


def picture(definition: WorkflowDefinition, steps: Sequence[StepView], now: datetime) -> Picture:
    level = _levels(definition)
    by_level: dict[int, list[str]] = {}
    for s in definition.steps:
        by_level.setdefault(level[s.id], []).append(s.id)
    widest = max(len(v) for v in by_level.values())
    graph_w = widest * NODE_W + (widest - 1) * GAP_X
    width = max(graph_w + 2 * PAD, LANE_LABEL_W + WATERFALL_W + 2 * PAD)
    latest = _latest(steps)
    nodes: dict[str, Node] = {}
    for lvl, ids in sorted(by_level.items()):
        row_w = len(ids) * NODE_W + (len(ids) - 1) * GAP_X
        x0 = (width - row_w) // 2
        for i, node_id in enumerate(ids):
            step = latest.get(node_id)
            status = step.status if step else None
            nodes[node_id] = Node(
                id=node_id,
                block_type=definition.step(node_id).type,
                status=status,
                x=x0 + i * (NODE_W + GAP_X),
                y=PAD + lvl * (NODE_H + GAP_Y),
                fill=FILL.get(status, FILL[None]),
                note=_note(step),
            )
    edges = [
        _edge(nodes[s.id], nodes[nxt], latest.get(s.id), latest, label)
        for s in definition.steps
        for nxt, label in _labelled_successors(s)
        if nxt in nodes
    ]
    graph_h = PAD + (max(level.values()) + 1) * (NODE_H + GAP_Y) - GAP_Y
    bars, span_text = _waterfall(steps, now, top=graph_h + 40)
    height = graph_h + PAD + (40 + len(bars) * LANE_H if bars else 0)
    return Picture(width, height, list(nodes.values()), edges, bars, graph_h + 28, span_text)


def _labelled_successors(step: Step) -> list[tuple[str, str]]:
    out = [(b.next, f"if {b.when}") for b in step.branches]
    if step.otherwise:
        out.append((step.otherwise, "otherwise"))
    if step.next:
        out.append((step.next, ""))
    return out


def _edge(a: Node, b: Node, step: StepView | None, latest: dict[str, StepView], label: str) -> Edge:
    if step is not None and step.branch_choice is not None:
        taken = step.branch_choice == b.id
    else:
        taken = step is not None and step.status == "succeeded" and b.id in latest
    back = b.y <= a.y
    return Edge(
        x1=a.x + NODE_W // 2,
        y1=a.y + NODE_H,
        x2=b.x + NODE_W // 2,
        y2=b.y,
        taken=taken,
        back=back,
        label=label[:40],
    )


def _waterfall(steps: Sequence[StepView], now: datetime, top: int) -> tuple[list[Bar], str]:
    leases = sorted(
        ((s, lease) for s in steps for lease in s.leases), key=lambda p: p[1].claimed_at
    )
    if not leases:
        return [], ""
    start = leases[0][1].claimed_at
    end = max((lease.ended_at or now) for _, lease in leases)
    span = max((end - start).total_seconds(), 0.001)
    scale = WATERFALL_W / span
    bars = []
    for i, (s, lease) in enumerate(leases):
        began = (lease.claimed_at - start).total_seconds()
        finished = ((lease.ended_at or now) - start).total_seconds()
        how: str = lease.end_status or "running"
        fill = FILL["running"]
        if lease.end_kind == "settled":
            fill = FILL.get(lease.end_status, FILL[None])
        elif lease.end_kind == "reclaimed":
            how, fill = f"reclaimed → {lease.end_status}", RECLAIMED
        bars.append(
            Bar(
                label=f"{s.step_key} #{lease.attempt}",
                x=PAD + LANE_LABEL_W + began * scale,
                y=top + i * LANE_H,
                width=max((finished - began) * scale, 2.0),
                fill=fill,
                title=f"{s.step_key} attempt {lease.attempt}: {how}, "
                f"{finished - began:.3f} s" + (f" — {lease.error}" if lease.error else ""),
            )
        )
    return bars, f"{span:.3f} s from the first claim to the last end"


def render_picture(
    definition: WorkflowDefinition, steps: Sequence[StepView], now: datetime
) -> Markup:
    drawn = picture(definition, steps, now)
    return Markup(  # noqa: S704 - rendered by the autoescaping template environment
        TEMPLATES.get_template("run_picture.svg").render(
            p=drawn, node_w=NODE_W, node_h=NODE_H, pad=PAD, lane_h=LANE_H
        )
    )
