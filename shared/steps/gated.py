"""A block run behind its gates: the executor's walk over the catalog (shared/gates/catalog.py,
which documents the order and what each gate takes and settles).

    open   → the target resolves; each gate's `prepare` runs (outside any transaction); then
             each gate the spec declares and that applies opens, in the catalog's order, all
             in ONE transaction on the step's connection, followed by the block's
             `before_call`; the first refusal stops the walk, what the gates before it took
             is released in that transaction, and it commits (see `_open`).
    run    → block.execute, with the resolved target on its context.
    settle → after the attempt is classified, every gate that applies settles by what the
             outcome proves, in one transaction (each write is idempotent, so a crash between
             it and the step's own settle, and a second run of it, change nothing more).

Transactions: every gate callable takes the `Tx` it runs in; which gates share one, and when
it commits, is decided here alone (issue 27: one connection per step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from pydantic import BaseModel

from shared.blocks.base import BlockContext, BlockFailure, BlockResult, BlockSpec, Gate
from shared.core.db import Database, Tx
from shared.gates.catalog import GATES
from shared.gates.kind import Attempt, GateKind, Verdict, WorkflowGates, fate_of
from shared.steps.states import StepStatus


@dataclass(frozen=True)
class Passed:
    """What the gates took for this attempt, for `settle_gates`."""

    # None: no gate stands in front of this attempt (a rehearsal, a block with no gates).
    attempt: Attempt | None = None
    # The gates this attempt passed, in order (none when one of them refused).
    opened: tuple[GateKind, ...] = ()

    def took(self, gate: Gate) -> bool:
        return any(kind.gate is gate for kind in self.opened)

    @property
    def reserved(self) -> bool:
        return self.took(Gate.BUDGET)


NOTHING = Passed()


def _attempt(
    spec: BlockSpec, ctx: BlockContext, config: BaseModel, workflow: WorkflowGates
) -> Attempt | None:
    if ctx.dry_run or not (spec.gates or spec.before_call):
        return None
    return Attempt(spec, ctx, config, workflow)


def _applying(attempt: Attempt) -> list[GateKind]:
    """The catalog's gates the spec declares and that apply to this attempt, in order."""
    return [k for k in GATES if k.gate in attempt.spec.gates and k.applies(attempt)]


def _open(db: Database, attempt: Attempt) -> Passed:
    """Resolve the target, open the gates; raise the refusal (or error) of the first that
    doesn't pass, after releasing what the ones before it took.

    Commits (issue 27). Every gate's promise needs its write durable before the request
    leaves — the throttle slot (else a crash after the call lets the window admit one more),
    the budget reservation (else the cap could be overrun by what was already sent), the
    charge (else a call could be made unpaid), and the block's `before_call` (the echo
    marker: else the webhook the write causes could be admitted as a trigger). None of them
    needs to be seen by anyone *before the next gate runs*, so they share ONE transaction
    and one commit, right before the call: a refusal by a later gate releases what the
    earlier ones took in that same transaction (a throttle claim still counts, as it always
    did), and an error rolls all of them back together — nothing is half-taken. What can't
    share it: the claim before (the gates need the claimed row, the rendered config and the
    resolved target, and the lease must hold even when a gate refuses) and the at-most-once
    mark after (the block sets it once its request is ready, and reads its answer: a mark
    found set means an earlier attempt may have called)."""
    if attempt.spec.target is not None:
        attempt = replace(attempt, target=attempt.spec.target(attempt.ctx, attempt.config))
    kinds = _applying(attempt)
    # Outside the transaction: what a gate must learn first (the budget's landed query may
    # build a port, which reads the connection).
    for kind in kinds:
        if kind.prepare is not None:
            attempt = kind.prepare(attempt)
    ready = attempt

    def walk(tx: Tx) -> tuple[BlockFailure | None, tuple[GateKind, ...]]:
        opened: list[GateKind] = []
        for kind in kinds:
            refusal = kind.open(tx, ready)
            if refusal is not None:
                for taken in reversed(opened):  # nothing will be sent: give back what was taken
                    if taken.release is not None:
                        taken.release(tx, ready)
                return refusal, ()
            opened.append(kind)
        if ready.spec.before_call is not None:
            ready.spec.before_call(tx, ready.ctx, ready.config, ready.target)
        return None, tuple(opened)

    # Repeated whole on a transient error: the failed try was rolled back entirely.
    refusal, opened = db.run(walk)
    if refusal is not None:
        raise refusal
    return Passed(ready, opened)


def open_gates(
    spec: BlockSpec,
    ctx: BlockContext,
    config: BaseModel,
    workflow: WorkflowGates,
    *,
    db: Database,
) -> Passed:
    """Run the spec's declared gates in the catalog's order; raise the `BlockFailure` of the
    first that refuses (nothing has left the process then)."""
    attempt = _attempt(spec, ctx, config, workflow)
    return NOTHING if attempt is None else _open(db, attempt)


def run_gated(
    spec: BlockSpec,
    ctx: BlockContext,
    config: BaseModel,
    workflow: WorkflowGates,
    *,
    db: Database,
) -> tuple[BlockResult | BaseException, Passed]:
    """Open the gates, then execute the block: (what the attempt produced, what the gates
    took). Never raises for a block's or a gate's failure: it is the outcome."""
    attempt = _attempt(spec, ctx, config, workflow)
    # A refused attempt took nothing, yet its gates still settle (a refund of an earlier
    # attempt's charge).
    passed = NOTHING if attempt is None else Passed(attempt)
    try:
        if attempt is not None:
            passed = _open(db, attempt)
            assert passed.attempt is not None
            ctx = replace(ctx, target=passed.attempt.target)
        return spec.execute(ctx, config), passed
    except Exception as exc:
        return exc, passed


def gate_settlement(
    ctx: BlockContext,
    passed: Passed,
    outcome: BlockResult | BaseException,
    status: StepStatus,
) -> Callable[[Tx], None] | None:
    """What settling the gates writes, by what the attempt proves (shared/gates/catalog.py),
    for the caller to run in the transaction of its choice — the executor runs it in the
    step's own settle, so the gates' settle shares that commit (issue 27); None: nothing to
    settle. Every write is idempotent, so a crash between it and the step's settle, and a
    second run of it, change nothing more."""
    attempt = passed.attempt
    if ctx.dry_run or attempt is None:
        return None
    settling = [k for k in _applying(attempt) if k.settle is not None]
    if not settling:
        return None
    fate = fate_of(outcome)
    code = str(getattr(outcome, "outcome_code", type(outcome).__name__))
    failed = status is StepStatus.FAILED
    # A token price comes down to what the call used (none: what the gates took stands).
    used = (
        attempt.spec.price_used(attempt.config, outcome.output)
        if isinstance(outcome, BlockResult)
        else None
    )

    def settle(tx: Tx) -> None:
        for kind in settling:
            assert kind.settle is not None
            opened = kind in passed.opened
            kind.settle(tx, attempt, Verdict(fate, opened, failed, code, used_price=used))

    return settle


def settle_gates(
    ctx: BlockContext,
    passed: Passed,
    outcome: BlockResult | BaseException,
    status: StepStatus,
    *,
    db: Database,
) -> None:
    """`gate_settlement` in a transaction of its own (an attempt that lost its lease, whose
    step this attempt no longer settles)."""
    settle = gate_settlement(ctx, passed, outcome, status)
    if settle is not None:
        db.run(settle)
