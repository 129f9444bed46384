"""Replay planning, pure logic: which steps of a failed run are copied, which are reset.

Invariant 12: a replay copies the settled steps and resets only the nodes reachable from the
first error, following the branch choices the original run recorded. Walking the recorded
choice (not every edge) is what keeps the other branch of a settled `branch` step untouched:
its steps are copied, never re-run. A branch node with no recorded choice is walked along
every edge, the conservative reading (more is reset, nothing settled is trusted blindly).

Within the reset region, only the *root* steps are restarted (created again as pending); the
rest of the region's rows are dropped and the engine recreates them as the roots settle
(invariant 8), exactly as it did the first time. No database or HTTP here; tests drive it
with plain values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from shared.workflows.definition import WorkflowDefinition
from shared.workflows.step_keys import compensated_key

SETTLED = frozenset({"succeeded", "skipped", "failed"})
# Settled without having done their work: a replay starts them again.
NOT_DONE = frozenset({"failed", "skipped"})
# What the `branch` block journals when no edge was taken (shared.blocks.flow; a test keeps
# the two equal without this pure module importing the blocks).
NO_BRANCH_TAKEN = "(none)"


@dataclass(frozen=True)
class JournalStep:
    id: str
    step_key: str
    node_id: str
    block_type: str
    status: str
    branch_choice: str | None = None
    idempotency_key: str | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class ReplayPlan:
    first_error: JournalStep | None
    reset_nodes: frozenset[str]
    copy: tuple[JournalStep, ...]
    reset: tuple[JournalStep, ...]
    restart: tuple[JournalStep, ...]


def chosen_successors(
    definition: WorkflowDefinition, node_id: str, choices: Iterable[str]
) -> list[str]:
    """The edges a node took, from its recorded branch choices (all edges if none recorded).

    The `branch` block records the node it chose, or NO_BRANCH_TAKEN when its path ended."""
    try:
        step = definition.step(node_id)
    except KeyError:
        return []
    every = step.successors()
    recorded = list(choices)
    if not recorded:
        return every
    picked: list[str] = []
    for choice in recorded:
        if choice == NO_BRANCH_TAKEN:
            continue
        if choice in every:
            picked.append(choice)
        elif choice == "otherwise" and step.otherwise:
            picked.append(step.otherwise)
        elif choice.isdigit() and int(choice) < len(step.branches):
            picked.append(step.branches[int(choice)].next)
        else:
            return every  # a choice we can't map: walk everything rather than trust it
    return picked


def reachable_nodes(
    definition: WorkflowDefinition, roots: Iterable[str], steps: Sequence[JournalStep]
) -> frozenset[str]:
    """Nodes reachable from `roots`, roots included, following recorded branch choices."""
    choices: dict[str, list[str]] = {}
    for s in steps:
        if s.branch_choice is not None and s.status in SETTLED:
            choices.setdefault(s.node_id, []).append(s.branch_choice)
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        todo.extend(chosen_successors(definition, node, choices.get(node, [])))
    return frozenset(seen)


def first_error(steps: Sequence[JournalStep]) -> JournalStep | None:
    failed = [
        (s.finished_at is None, s.finished_at, i, s)
        for i, s in enumerate(steps)
        if s.status == "failed"
    ]
    if not failed:
        return None
    failed.sort(key=lambda t: (t[0], t[1] or datetime.min, t[2]))
    return failed[0][3]


def plan_replay(
    definition: WorkflowDefinition,
    steps: Sequence[JournalStep],
    start: JournalStep | None = None,
) -> ReplayPlan:
    """What a replay of a run with this journal does.

    Roots: `start` when a person chose the step to replay from, else the first failed step;
    then any failed, skipped (a cancelled run's) or unsettled
    step the first region does not cover (nothing else would ever drive it again in the new
    run), and every iteration of a root's node that did not succeed (a foreach runs its
    items in any order, so the one that failed may have unsettled siblings on either side)."""
    # A compensated run (shared/steps/saga.py): its compensation rows are not replayed, and a
    # step whose effect its compensation undid is not done any more: the replay starts at the
    # earliest of them that leads to the chosen (or failed) step, so the steps after it run
    # again in order with its new output.
    undone_keys = {k for s in steps if (k := compensated_key(s.step_key)) is not None}
    steps = [s for s in steps if compensated_key(s.step_key) is None]
    first = first_error(steps)
    origin = start or first
    for s in sorted(
        (s for s in steps if s.step_key in undone_keys),
        key=lambda s: (s.finished_at or datetime.min, s.step_key),
    ):
        if origin is None or origin.node_id in reachable_nodes(definition, [s.node_id], steps):
            origin = s
            break
    roots: list[JournalStep] = [origin] if origin is not None else []
    region = reachable_nodes(definition, [r.node_id for r in roots], steps)
    while True:
        root_nodes = {r.node_id for r in roots}
        stray = [
            s
            for s in steps
            if s not in roots
            and (
                (s.node_id not in region and (s.status in NOT_DONE or s.status not in SETTLED))
                # An iteration beside a restarted one (`node[0]` pending while `node[2]`
                # failed: items run in any order) that did not succeed: it restarts too,
                # rather than being dropped for its loop to create again.
                or (s.node_id in root_nodes and s.status != "succeeded")
            )
        ]
        if not stray:
            break
        roots.extend(stray)
        region = reachable_nodes(definition, [r.node_id for r in roots], steps)
    root_ids = {r.id for r in roots}
    root_nodes = {r.node_id for r in roots}
    copy: list[JournalStep] = []
    reset: list[JournalStep] = []
    for s in steps:
        if s.id in root_ids:
            reset.append(s)
        elif s.node_id in root_nodes and s.status in SETTLED and s.status not in NOT_DONE:
            # A settled sibling iteration of a root node (`node[0]` beside a failed
            # `node[1]`) is kept: it did its work and its key is not being reused.
            copy.append(s)
        elif s.node_id in region or s.status not in SETTLED:
            reset.append(s)
        else:
            copy.append(s)
    # Unsettled iterations beside their failed sibling restart too; in journal order.
    restart = tuple(s for s in steps if s.id in root_ids)
    return ReplayPlan(
        first_error=first, reset_nodes=region, copy=tuple(copy), reset=tuple(reset), restart=restart
    )
