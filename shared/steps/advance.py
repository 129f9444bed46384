"""`advance_step`: one step per invocation — claim, execute, settle, dispatch.

    claim (lease) ─► [at-most-once already started? → failed OUTCOME_UNKNOWN]
                  ─► [delay served? → succeeded] [wait resumed? → settled from its resume]
                  ─► render config ─► gates, then block.execute(ctx), under a heartbeat
                  ─► classify ─► settle the gates ─► settle + next rows (one txn, fenced)
                  ─► publish step-ready

Gates (rate limits, budget, charge) are declared on the block spec and the workflow; the walk
over their catalog (shared/steps/gated.py, shared/gates/catalog.py) runs here, on this
invocation's pool; no block calls them.

Ack/nack: the caller acks (returns normally) for everything this function returns — a step
that was not claimable, a recorded failure, a lease lost mid-way — and lets a `TransientError`
from the database propagate so Pub/Sub redelivers. A publish that fails after the settle
committed is not re-raised: redelivery would find the step settled and publish nothing; the
sweep re-dispatches the stamped pending rows instead.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from shared.blocks.base import NO_RETRY, BlockContext, BlockResult, BlockSpec
from shared.core import queries, tracing
from shared.core.crashpoints import crash_point
from shared.core.db import Database, Tx
from shared.core.errors import PermanentError, TransientError
from shared.core.logs import LogEvent, get_logger, labelled, log_event
from shared.gates.kind import WorkflowGates
from shared.port import observed
from shared.steps.claim import (
    ClaimedStep,
    Heartbeat,
    LeaseConfig,
    claim_step,
    mark_side_effect_started,
    read_run_outputs,
    withdraw_side_effect_mark,
)
from shared.steps.finale import Finale
from shared.steps.gated import gate_settlement, run_gated, settle_gates
from shared.steps.loops import Loop, enclosing_loop, foreach_of, iteration, loop_scope
from shared.steps.outcomes import (
    OUTCOME_CONFIG_INVALID,
    OUTCOME_GRAPH_UNREADABLE,
    OUTCOME_UNKNOWN,
    OUTCOME_UNKNOWN_BLOCK,
    OUTCOME_UNKNOWN_NODE,
    Settlement,
    classify_outcome,
    failed,
    resumed_settlement,
    served_delay,
)
from shared.steps.saga import Saga
from shared.steps.settle import settle_step
from shared.steps.states import StepStatus
from shared.workflows.definition import Breaker, Step, WorkflowDefinition
from shared.workflows.scope import RunFacts, step_scope, steps_read
from shared.workflows.step_keys import compensated_key, is_final

SQL = queries.load("steps")
VERSION_DEFINITION = SQL["versions_definition"]
RECORD_POISONED = SQL["steps_record_poisoned"]

BlockLookup = Callable[[str], BlockSpec]
Dispatch = Callable[[Sequence[str]], None]

log = get_logger(__name__)


@dataclass(frozen=True)
class Advanced:
    """What one invocation did, for logs and tests."""

    step_id: str
    claimed: bool
    status: str | None = None
    outcome_code: str | None = None
    dispatched: tuple[str, ...] = ()
    run_status: str | None = None
    note: str = ""


# Versions are immutable (invariant 9), so a parsed graph never goes stale.
_graphs: dict[str, WorkflowDefinition] = {}
_graphs_lock = threading.Lock()


def load_graph(db: Database, version_id: str, *, tx: Tx | None = None) -> WorkflowDefinition:
    """The pinned graph of a run: its own version's definition, parsed once per instance.
    `tx`: read on the caller's open transaction (a thread holds one connection at a time:
    opening a second one inside a transaction raises NestedCheckout)."""
    with _graphs_lock:
        cached = _graphs.get(version_id)
    if cached is not None:
        return cached
    if tx is not None:
        definition = tx.scalar(VERSION_DEFINITION, version_id=version_id)
    else:
        with db.transaction() as own:
            definition = own.scalar(VERSION_DEFINITION, version_id=version_id)
    if definition is None:
        raise PermanentError(f"workflow version {version_id} does not exist")
    graph = WorkflowDefinition.model_validate(definition)
    with _graphs_lock:
        _graphs[version_id] = graph
    return graph


def registry_lookup(type_name: str) -> BlockSpec:
    """The catalog's block of that type (the registry imports the catalog on first use)."""
    from shared.blocks import registry

    return registry.get(type_name)


def default_dispatch(step_ids: Sequence[str]) -> None:
    from shared.core.pubsub import publish_step_ready

    publish_step_ready(step_ids)


def build_scope(
    step: ClaimedStep, steps: Mapping[str, Any], loop: Loop | None = None
) -> dict[str, Any]:
    """What a step's config and a branch condition read: the scope the trigger rule read, with
    the record kept with the run, plus `steps` (the outputs its expressions read by name:
    `read_run_outputs`) and `run`, and `iteration` for an iteration of a foreach body
    (shared/workflows/scope.py)."""
    run = RunFacts(
        id=step.run_id,
        workflow_id=step.workflow_id,
        version_id=step.version_id,
        tenant_id=step.tenant_id,
        lineage_root=step.lineage_root,
        namespace=step.namespace,
        final_status=step.final_status,
        error=step.run_error,
    )
    index = iteration(step.step_key) if loop is not None else None
    return step_scope(
        step.occurrence,
        step.trigger_record,
        run=run,
        steps=steps,
        loop=None if loop is None or index is None else loop_scope(loop, index),
    )


def render_config(node: Step, scope: Mapping[str, Any]) -> dict[str, Any]:
    if not node.config:
        return {}
    from shared.workflows.expressions import render

    rendered = render(node.config, scope)
    if not isinstance(rendered, dict):
        raise PermanentError("a step's config must render to an object")
    return rendered


def advance_step(
    db: Database,
    step_id: str,
    *,
    lookup: BlockLookup | None = None,
    dispatch: Dispatch | None = None,
    config: LeaseConfig | None = None,
    namespace: str = "live",
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Advanced:
    """Advance one step. Raises only `TransientError` (database down): the caller nacks."""
    lookup = lookup or registry_lookup
    dispatch = dispatch or default_dispatch
    config = config or LeaseConfig.from_env()
    # One pooled connection from the claim to the settle (issue 27): every transaction of
    # this step, its gates, its block and its port runs on it, handed down as `ctx.db`. The
    # lease keeper renews from its own thread, on a connection of its own.
    stored = tracing.stored_in(db, "step", step_id)
    with labelled(step_id=step_id), db.pinned(), tracing.span("step", stored=stored):
        step = claim_step(db, step_id, config, namespace=namespace)
        if step is None:
            log.info("step not claimable (running elsewhere, parked, finished or run ended)")
            return Advanced(step_id=step_id, claimed=False, note="not claimable")
        if tracing.enabled():
            tracing.annotate(f"block {step.block_type}", **_span_attributes(step))
        timed = tracing.timed("onceflow.step.duration", block=step.block_type)
        with labelled(run_id=step.run_id, tenant=step.tenant_id), timed:
            advanced = _run_claimed(
                db, step, lookup=lookup, dispatch=dispatch, config=config, now=now
            )
        # What the block's port observed (its last call, the records it named), written after
        # the settle committed, on this step's connection; nothing to write on most steps
        # (shared/port/observed.py: at most once a minute per connection, labels on change).
        observed.flush(db)
        return advanced


def _span_attributes(step: ClaimedStep) -> dict[str, Any]:
    """What a step's span and metrics say: the run, the step, the record, tenant, workflow."""
    return {
        "run_id": step.run_id,
        "step": step.step_key,
        "step_id": step.id,
        "block": step.block_type,
        "attempt": step.attempt,
        "record": step.record_key,
        "tenant": step.tenant_id,
        "workflow_id": step.workflow_id,
        "version_id": step.version_id,
    }


def advance_from_message(
    db: Database, cloud_event_data: Any, *, message_id: str | None = None, **options: Any
) -> Advanced | None:
    """`advance_step` for a Pub/Sub push delivery. A message that can never succeed (bad
    encoding, no step id) is recorded in `poisoned_messages` and acked: None."""
    from shared.core.pubsub import decode_push_message

    try:
        message = decode_push_message(cloud_event_data)
        step_id = str(uuid.UUID(str(message.get("step_id"))))
    except (PermanentError, ValueError) as exc:
        log_event(
            log,
            LogEvent.DEAD_LETTERED,
            f"poisoned step-ready message: {exc}",
            level=logging.WARNING,
            kind="poisoned_message",
            reason=str(exc)[:1000],
        )
        with db.transaction() as tx:
            tx.execute(
                RECORD_POISONED,
                message_id=message_id,
                data=json.dumps(cloud_event_data, default=str)[:10000],
                reason=str(exc)[:1000],
            )
        return None
    return advance_step(db, step_id, **options)


def _run_claimed(
    db: Database,
    step: ClaimedStep,
    *,
    lookup: BlockLookup,
    dispatch: Dispatch,
    config: LeaseConfig,
    now: Callable[[], datetime],
) -> Advanced:
    try:
        graph = load_graph(db, step.version_id)
    except TransientError:
        raise
    except Exception as exc:
        # Claimed already: leaving the step running would hold it until its lease expired and
        # then retry what can never load. Fail it now, with the reason.
        msg = f"the run's workflow version {step.version_id} cannot be loaded: {exc}"
        return _finish(
            db, step, failed(step.attempt, OUTCOME_GRAPH_UNREADABLE, msg, "permanent"), [], dispatch
        )
    try:
        node = _node(graph, step)
    except KeyError:
        msg = f"node {step.node_id!r} is not in version {step.version_id}"
        return _finish(
            db,
            step,
            failed(step.attempt, OUTCOME_UNKNOWN_NODE, msg, "permanent"),
            [],
            dispatch,
            saga=Saga.of(graph),
            final=Finale.of(graph),
        )
    try:
        spec = lookup(step.block_type)
    except Exception as exc:
        msg = f"unknown block type {step.block_type!r}: {exc}"
        return _finish(
            db,
            step,
            failed(step.attempt, OUTCOME_UNKNOWN_BLOCK, msg, "permanent"),
            [],
            dispatch,
            saga=Saga.of(graph),
            final=Finale.of(graph),
        )

    workflow = WorkflowGates.of(step.workflow_id, graph)
    foreach = foreach_of(graph, node)
    index = iteration(step.step_key)
    outputs = read_run_outputs(
        db,
        step,
        steps=steps_read(node),
        foreach=foreach.id if foreach is not None and index is not None else None,
        iteration=index,
    )
    loop = enclosing_loop(graph, node, outputs.loop)
    executed = _execute(
        db,
        step,
        node=node,
        spec=spec,
        workflow=workflow,
        config=config,
        now=now,
        loop=loop,
        steps=outputs.steps,
    )
    settlement = executed.settlement
    if executed.lost:
        log.warning("lease lost while the block ran; not settling (its successor owns it)")
        return Advanced(step_id=step.id, claimed=True, note="lease lost")
    try:
        # A finally step leads to finally steps only (shared/steps/finale.py).
        follows = graph.final_step if is_final(step.step_key) else graph.step
        next_nodes = [follows(n) for n in settlement.next_nodes]
        body = graph.step(settlement.fan_out.body) if settlement.fan_out else None
    except KeyError as exc:
        msg = f"step leads to unknown node {exc.args[0]!r}"
        settlement = failed(step.attempt, OUTCOME_UNKNOWN_NODE, msg, "permanent")
        next_nodes, body = [], None
    return _finish(
        db,
        step,
        settlement,
        next_nodes,
        dispatch,
        breaker=graph.breaker,
        loop=loop,
        body=body,
        gates=executed.gates,
        saga=Saga.of(graph),
        final=Finale.of(graph),
    )


def _node(graph: WorkflowDefinition, step: ClaimedStep) -> Step:
    """The node a claimed row runs: its own, or for a compensation row (`compensate:<key>`,
    shared/steps/saga.py) the undo its node declares, which has no edges; for a finally row
    (`finally:<id>`, shared/steps/finale.py) the step of the `finally:` list."""
    if is_final(step.step_key):
        return graph.final_step(step.node_id)
    node = graph.step(step.node_id)
    if compensated_key(step.step_key) is None:
        return node
    undo = node.compensation()
    if undo is None:
        raise KeyError(f"compensate of {step.node_id}")
    return undo


@dataclass(frozen=True)
class Executed:
    """What running (or not running) the block decided."""

    settlement: Settlement
    # The lease was lost while the block ran: the attempt settles nothing.
    lost: bool = False
    # What settling the gates writes, run in the step's settle transaction (one commit).
    gates: Callable[[Tx], None] | None = None


def _execute(
    db: Database,
    step: ClaimedStep,
    *,
    node: Step,
    spec: BlockSpec,
    workflow: WorkflowGates,
    config: LeaseConfig,
    now: Callable[[], datetime],
    loop: Loop | None = None,
    steps: Mapping[str, Any],
) -> Executed:
    """Run the block (or decide without running it)."""
    at_most_once = spec.side_effect == "at_most_once"
    retry = NO_RETRY if spec.kind == "flow" else spec.retry
    if (
        at_most_once
        and step.side_effect_started_at is not None
        and not spec.decides_ambiguous_retry
    ):
        # An earlier attempt marked the side effect and never settled: the call may have
        # happened. Calling again could duplicate it, so the engine refuses (invariant 10)
        # — unless the block decides that itself (BlockSpec.decides_ambiguous_retry).
        msg = (
            f"an earlier attempt started this {spec.type_name} call at "
            f"{step.side_effect_started_at.isoformat()} and never recorded its result; "
            "check the provider, then replay"
        )
        return Executed(failed(step.attempt, OUTCOME_UNKNOWN, msg, "permanent"))
    if served_delay(step.output):
        return Executed(
            Settlement(
                status=StepStatus.SUCCEEDED,
                attempt=step.attempt,
                outcome_code="OK",
                output=step.output,
                next_nodes=tuple(node.successors()),
            )
        )
    # A wait resumed by an event, a decision or its deadline settles from what resumed it
    # (journaled in its output), never by running its block again (shared/steps/parks.py).
    resumed = resumed_settlement(
        step.output, attempt=step.attempt, successors=[node.next] if node.next else []
    )
    if resumed is not None:
        return Executed(resumed)
    try:
        scope = build_scope(step, steps, loop)
        # A replay with an edited input runs the block on the person's edit (audited, and
        # shown on the step), not on the rendered config.
        rendered = (
            dict(step.input_override)
            if step.input_override is not None
            else render_config(node, scope)
        )
        block_config = spec.config_model.model_validate(rendered)
    except TransientError:
        raise
    except Exception as exc:
        msg = f"config of step {node.id} is invalid: {exc}"
        return Executed(failed(step.attempt, OUTCOME_CONFIG_INVALID, msg, "permanent"))

    with Heartbeat(db, step, config) as heartbeat:
        ctx = BlockContext(
            tenant_id=step.tenant_id,
            run_id=step.run_id,
            step_id=step.id,
            step_key=step.step_key,
            attempt=step.attempt,
            idempotency_key=step.idempotency_key,
            scope=scope,
            dry_run=step.namespace != "live",
            connection_id=step.connection_id,
            heartbeat=heartbeat.beat,
            # The marker exists only for at-most-once blocks: for any other block the call
            # is a no-op, so the sweep can read "marker set" as "at-most-once effect started".
            mark_side_effect_started=(
                (lambda: mark_side_effect_started(db, step)) if at_most_once else (lambda: True)
            ),
            withdraw_side_effect_mark=(
                (lambda: withdraw_side_effect_mark(db, step)) if at_most_once else (lambda: False)
            ),
            node=node,
            db=db,
        )
        outcome: BlockResult | BaseException
        outcome, passed = run_gated(spec, ctx, block_config, workflow, db=db)
        crash_point("after_side_effect")
        lost = heartbeat.lost.is_set()
    settlement = replace(
        classify_outcome(
            outcome,
            kind=spec.kind,
            retry=retry,
            attempt=step.attempt,
            successors=node.successors(),
            now=now(),
        ),
        input=rendered,
    )
    # A lost lease settles nothing here: the attempt that owns the step now decides refunds.
    if lost:
        # The attempt that owns the step now decides refunds; what this one took settles
        # here, on its own (the step's settle is not this attempt's to write).
        settle_gates(ctx, passed, outcome, StepStatus.RUNNING, db=db)
        return Executed(settlement, lost=True)
    return Executed(settlement, gates=gate_settlement(ctx, passed, outcome, settlement.status))


def _count_run_for_breaker(
    db: Database,
    step: ClaimedStep,
    run_failed: bool,
    settlement: Settlement,
    breaker: Breaker | None,
) -> None:
    """The run ended: count it for the workflow's circuit breaker (shared/gates/breaker.py). After
    the settle committed, so a failure here must not nack the message (the redelivery would
    find the step settled and count nothing): it is logged, and the streak misses one run."""
    from shared.gates import breaker as circuit

    try:
        circuit.record_run_outcome(
            db,
            step.workflow_id,
            failed=run_failed,
            settings=breaker,
            why=f"step {step.step_key} failed ({settlement.outcome_code})",
        )
    except Exception:
        log.warning("circuit breaker not updated for run %s", step.run_id, exc_info=True)


def _finish(
    db: Database,
    step: ClaimedStep,
    settlement: Settlement,
    next_nodes: list[Step],
    dispatch: Dispatch,
    *,
    breaker: Breaker | None = None,
    loop: Loop | None = None,
    body: Step | None = None,
    gates: Callable[[Tx], None] | None = None,
    saga: Saga | None = None,
    final: Finale | None = None,
) -> Advanced:
    settled = settle_step(
        db,
        step,
        settlement,
        next_nodes,
        loop=loop,
        body=body,
        gates=gates,
        saga=saga,
        final=final,
    )
    if settled.fenced_out:
        log.warning("settle fenced out: the lease was reclaimed; outcome not recorded")
        return Advanced(step_id=step.id, claimed=True, note="fenced out")
    tracing.annotate(
        outcome=settlement.outcome_code,
        status=settlement.status,
        error=settlement.error if settlement.status == "failed" else None,
    )
    log.info(
        "step settled %s (%s), run %s",
        settlement.status,
        settlement.outcome_code,
        settled.run_status,
    )
    if settled.run_failed:
        tracing.count("onceflow.runs.failed", tenant=step.tenant_id, workflow_id=step.workflow_id)
        log_event(
            log,
            LogEvent.RUN_FAILED,
            f"run failed: step {step.step_key} failed ({settlement.outcome_code})"
            if settlement.status == "failed"
            else f"run failed: its finally steps are done after step {step.step_key} "
            "(the failure was decided before them)",
            level=logging.WARNING,
            run_id=step.run_id,
            outcome_code=str(settlement.outcome_code),
        )
    if (
        step.namespace == "live"
        and (settled.run_failed or settled.run_status == "succeeded")
        and not settled.breaker_counted
    ):
        _count_run_for_breaker(db, step, settled.run_failed, settlement, breaker)
    crash_point("after_commit_before_publish")
    if settled.to_dispatch:
        try:
            dispatch(settled.to_dispatch)
        except Exception as exc:
            # Committed and stamped: the sweep re-dispatches after its threshold.
            log.warning("step-ready publish failed after commit; the sweep will retry: %s", exc)
    return Advanced(
        step_id=step.id,
        claimed=True,
        status=str(settlement.status),
        outcome_code=settlement.outcome_code,
        dispatched=settled.to_dispatch,
        run_status=settled.run_status,
    )
