"""foreach: a body step run once per item, `concurrency` at a time, journaled `<body>[i]`.

    foreach settles succeeded ─► its items are journaled in its output; rows body[0..c-1]
    an item settles succeeded ─► (same transaction, run row locked) the next items up to c in
                                 flight are created, in index order; after the last one:
                                 the collected outputs join the foreach's output and the
                                 foreach's `next` is created
    an item fails            ─► the run fails (as any step); items in flight finish; none
                                 is started after it

Items are delivered, so run, in any order. A replay copies the succeeded items and restarts
every other item the original created (the failed one, and any left pending or parked beside
it: shared/ops/replay_plan.py); as they succeed, the items that have no row yet are created,
always the lowest index first, so the loop finishes exactly as if it had not failed, each
item's key (and so its charge) the same in every run of the lineage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.blocks.base import FanOut
from shared.core import queries
from shared.core.db import Tx
from shared.steps.journal import insert_steps, step_key
from shared.workflows.definition import Step, WorkflowDefinition

SQL = queries.load("steps")
PROGRESS = SQL["loops_progress"]
OUTPUTS = SQL["loops_outputs"]
ADD_OUTPUTS = SQL["steps_add_loop_outputs"]


@dataclass(frozen=True)
class Loop:
    """The foreach a body step belongs to, as its scope and its settle need it."""

    foreach: Step
    body: Step
    count: int
    concurrency: int
    after: tuple[Step, ...]  # the foreach's successors, created when every item succeeded
    item: Any = None  # this iteration's element of the foreach's items


def foreach_of(graph: WorkflowDefinition, node: Step) -> Step | None:
    """The foreach whose body `node` is; None for a step outside any loop."""
    for candidate in graph.steps:
        if candidate.type == "foreach" and candidate.config.get("do") == node.id:
            return candidate
    return None


def enclosing_loop(
    graph: WorkflowDefinition, node: Step, facts: Mapping[str, Any] | None
) -> Loop | None:
    """The loop `node` is the body of, with its count and concurrency as the foreach journaled
    them and this iteration's item (`facts`: shared.steps.claim.RunOutputs.loop); None for a
    step outside any loop."""
    foreach = foreach_of(graph, node)
    if foreach is None:
        return None
    facts = facts or {}
    return Loop(
        foreach=foreach,
        body=node,
        count=int(facts.get("count") or 0),
        concurrency=max(int(facts.get("concurrency") or 1), 1),
        after=tuple(graph.step(n) for n in ([foreach.next] if foreach.next else [])),
        item=facts.get("item"),
    )


def iteration(step_key_text: str) -> int | None:
    """The index of an iteration's journal key (`body[3]` → 3); None for a plain key."""
    if not step_key_text.endswith("]") or "[" not in step_key_text:
        return None
    return int(step_key_text[step_key_text.rindex("[") + 1 : -1])


def loop_scope(loop: Loop, index: int) -> dict[str, Any]:
    """The `iteration` root of a body step's scope: its item, its index, the foreach's id."""
    return {"item": loop.item, "index": index, "foreach": loop.foreach.id}


def start_items(
    tx: Tx, *, run_id: str, lineage_root: str, fan_out: FanOut, body: Step
) -> list[str]:
    """The first iterations of a foreach that just succeeded (its settle's transaction)."""
    first = min(fan_out.concurrency, fan_out.count)
    return _insert(tx, run_id, lineage_root, body, range(first))


def after_item(tx: Tx, *, run_id: str, lineage_root: str, loop: Loop) -> list[str]:
    """An iteration succeeded (its settle's transaction, run row locked): start the next ones
    up to the concurrency, or, after the last, collect the outputs and create what follows
    the loop. The ids to dispatch."""
    progress = tx.one(
        PROGRESS,
        run_id=run_id,
        body=loop.body.id,
        count=loop.count,
        concurrency=loop.concurrency,
    )
    assert progress is not None
    created, succeeded = int(progress["created"]), int(progress["succeeded"])
    if created < loop.count:
        # The lowest indexes without a row, up to the concurrency: after a replay the rows
        # need not be a prefix (items are delivered in any order), so never "from `created`".
        return _insert(tx, run_id, lineage_root, loop.body, list(progress["next_indexes"] or ()))
    if succeeded < loop.count:
        return []  # others still in flight (or one failed: the run has failed)
    outputs = tx.scalar(OUTPUTS, run_id=run_id, body=loop.body.id)
    tx.execute(
        ADD_OUTPUTS,
        run_id=run_id,
        step_key=loop.foreach.id,
        outputs=outputs if isinstance(outputs, str) else json.dumps(outputs),
    )
    if not loop.after:
        return []
    return insert_steps(
        tx, run_id=run_id, lineage_root=lineage_root, nodes=list(loop.after), stamp_dispatched=True
    )


def _insert(
    tx: Tx, run_id: str, lineage_root: str, body: Step, indexes: Sequence[int]
) -> list[str]:
    if not indexes:
        return []
    return insert_steps(
        tx,
        run_id=run_id,
        lineage_root=lineage_root,
        nodes=[body] * len(indexes),
        keys=[step_key(body.id, [int(i)]) for i in indexes],
        stamp_dispatched=True,
    )
