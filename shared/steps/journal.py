"""Creating step rows: the journal a run is replayed and recovered from.

A step row exists, with its idempotency key, before its block can run (invariant 6), and the
rows for a step's successors are created in the transaction that settles it (invariant 8).
Admission calls `insert_steps` for a run's first steps; the engine calls it when settling.

Journal keys: a node runs once per run under its node id; a repeated or foreach iteration
journals under `node[i]` (nested: `node[i][j]`), see `step_key`. The idempotency key is
`onceflow:<lineage root>:<step key>`, so it is the same for every retry of a step *and* every
replay of the run in its lineage: a receiver that dedupes on it sees one logical call.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.core import queries
from shared.core.db import Tx
from shared.workflows.definition import Step

SQL = queries.load("steps")
INSERT_MANY = SQL["steps_insert_many"]
PENDING_FOR_RUN = SQL["steps_pending_for_run"]
MARK_DISPATCHED = SQL["steps_mark_dispatched"]


def step_key(node_id: str, iteration: Sequence[int] = ()) -> str:
    """The journal key of a node, or of one iteration of a repeated/foreach node."""
    return node_id + "".join(f"[{int(i)}]" for i in iteration)


# The journal key of a step's compensation (shared/steps/saga.py): `compensate:<step key>`. A
# step id can't contain ':' (STEP_ID_PATTERN), so no node's own key looks like one; the
# compensation's idempotency key is then `onceflow:<lineage root>:compensate:<step key>`, its
# own, stable across redeliveries, retries and replays like any step's.
COMPENSATION_PREFIX = "compensate:"


def compensation_key(key: str) -> str:
    return COMPENSATION_PREFIX + key


def compensated_key(key: str) -> str | None:
    """The step key a compensation row undoes; None for any other row."""
    return key[len(COMPENSATION_PREFIX) :] if key.startswith(COMPENSATION_PREFIX) else None


def idempotency_key(lineage_root: str, key: str) -> str:
    """Stable across retries and replays of the step in its lineage; generated client-side."""
    return f"onceflow:{lineage_root}:{key}"


def insert_steps(
    tx: Tx,
    *,
    run_id: str,
    lineage_root: str,
    nodes: Sequence[Step],
    stamp_dispatched: bool = False,
    keys: Sequence[str] | None = None,
) -> list[str]:
    """Insert pending rows for `nodes` (ON CONFLICT (run_id, step_key) DO NOTHING).

    Returns the ids to dispatch: the rows inserted now plus any of these steps that already
    existed and are still pending (a redelivered admission resumes dispatching them). A step
    that exists and is not pending is someone else's business (running, parked or finished).

    `stamp_dispatched=True` sets `dispatched_at` in the same statement, for callers that publish
    right after commit (the engine's settle): it saves a round trip, and if the publish is lost
    the sweep re-dispatches once the stamp is older than its threshold. Callers that leave it
    unset are covered too: the sweep treats a never-dispatched row by its creation time.

    `keys` gives each node's journal key when it is not the node id: the iterations of a
    repeated/foreach node, e.g. `[step_key(n.id, [i]) for i …]` with the node repeated.
    """
    if not nodes:
        return []
    if keys is not None and len(keys) != len(nodes):
        raise ValueError("insert_steps: one key per node")
    rows = tx.all(
        INSERT_MANY,
        run_id=run_id,
        lineage_root=lineage_root,
        step_keys=list(keys) if keys is not None else [step_key(n.id) for n in nodes],
        node_ids=[n.id for n in nodes],
        block_types=[n.type for n in nodes],
        stamp_dispatched=stamp_dispatched,
    )
    return [str(r["id"]) for r in rows]


def pending_step_ids(tx: Tx, run_id: str) -> list[str]:
    """The run's steps waiting to be claimed (to re-publish after a lost dispatch)."""
    return [str(r["id"]) for r in tx.all(PENDING_FOR_RUN, run_id=run_id)]


def mark_dispatched(tx: Tx, step_ids: Sequence[str]) -> int:
    """Stamp `dispatched_at` on still-pending steps after their `step-ready` was published.

    Touches fewer rows than given when a step was claimed meanwhile (its message arrived
    faster than this update): that is fine, the stamp only matters while a step is pending."""
    if not step_ids:
        return 0
    return tx.execute(MARK_DISPATCHED, step_ids=list(step_ids))
