"""A block run behind its gates: the executor's walk over the catalog (shared/gates/catalog.py,
which documents the order and what each gate takes and settles).

    open   → the target resolves; then each gate the spec declares and that applies, in the
             catalog's order: `prepare` (outside any transaction), `open` in a transaction of
             its own, committed before the next gate opens; the first refusal stops the walk,
             and what the gates before it took is released.
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
from typing import TypeVar

from pydantic import BaseModel

from shared.blocks.base import BlockContext, BlockResult, BlockSpec, Gate
from shared.core.db import Database, Tx, get_database
from shared.gates.catalog import GATES
from shared.gates.kind import Attempt, GateKind, Verdict, WorkflowGates, fate_of
from shared.steps.states import StepStatus

T = TypeVar("T")


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
    if ctx.dry_run or not spec.gates:
        return None
    return Attempt(spec, ctx, config, workflow)


def _applying(attempt: Attempt) -> list[GateKind]:
    """The catalog's gates the spec declares and that apply to this attempt, in order."""
    return [k for k in GATES if k.gate in attempt.spec.gates and k.applies(attempt)]


def _in_tx(db: Database, call: Callable[[Tx, Attempt], T], attempt: Attempt) -> T:
    return db.run(lambda tx: call(tx, attempt))


def _open(db: Database, attempt: Attempt) -> Passed:
    """Resolve the target, open the gates; raise the refusal (or error) of the first that
    doesn't pass, after releasing what the ones before it took."""
    if attempt.spec.target is not None:
        attempt = replace(attempt, target=attempt.spec.target(attempt.ctx, attempt.config))
    opened: list[GateKind] = []
    try:
        for kind in _applying(attempt):
            if kind.prepare is not None:
                attempt = kind.prepare(attempt)
            refusal = _in_tx(db, kind.open, attempt)
            if refusal is not None:
                raise refusal
            opened.append(kind)
    except Exception:
        for kind in reversed(opened):  # nothing will be sent: give back what was taken
            if kind.release is not None:
                _in_tx(db, kind.release, attempt)
        raise
    return Passed(attempt, tuple(opened))


def open_gates(
    spec: BlockSpec,
    ctx: BlockContext,
    config: BaseModel,
    workflow: WorkflowGates,
    *,
    db: Database | None = None,
) -> Passed:
    """Run the spec's declared gates in the catalog's order; raise the `BlockFailure` of the
    first that refuses (nothing has left the process then)."""
    attempt = _attempt(spec, ctx, config, workflow)
    return NOTHING if attempt is None else _open(db or get_database(), attempt)


def run_gated(
    spec: BlockSpec,
    ctx: BlockContext,
    config: BaseModel,
    workflow: WorkflowGates,
    *,
    db: Database | None = None,
) -> tuple[BlockResult | BaseException, Passed]:
    """Open the gates, then execute the block: (what the attempt produced, what the gates
    took). Never raises for a block's or a gate's failure: it is the outcome."""
    attempt = _attempt(spec, ctx, config, workflow)
    # A refused attempt took nothing, yet its gates still settle (a refund of an earlier
    # attempt's charge).
    passed = NOTHING if attempt is None else Passed(attempt)
    try:
        if attempt is not None:
            passed = _open(db or get_database(), attempt)
            assert passed.attempt is not None
            ctx = replace(ctx, target=passed.attempt.target)
        return spec.execute(ctx, config), passed
    except Exception as exc:
        return exc, passed


def settle_gates(
    ctx: BlockContext,
    passed: Passed,
    outcome: BlockResult | BaseException,
    status: StepStatus,
    *,
    db: Database | None = None,
) -> None:
    """Settle what the gates took by what the attempt proves (shared/gates/catalog.py).
    Runs after the block, before the step's own settle."""
    attempt = passed.attempt
    if ctx.dry_run or attempt is None:
        return
    settling = [k for k in _applying(attempt) if k.settle is not None]
    if not settling:
        return
    fate = fate_of(outcome)
    code = str(getattr(outcome, "outcome_code", type(outcome).__name__))
    failed = status is StepStatus.FAILED

    def settle(tx: Tx) -> None:
        for kind in settling:
            assert kind.settle is not None
            kind.settle(tx, attempt, Verdict(fate, kind in passed.opened, failed, code))

    (db or get_database()).run(settle)
