"""Claiming a step under a lease, renewing the lease, and the at-most-once marker.

Lease length fits the serverless deadline: `advance_step` runs with a 300 s function timeout
(`infra/functions.tf`; `tests/test_infra.py` holds the two together), so a lease is 600 s —
longer than any invocation can live, so a healthy attempt never loses its step to the sweep —
and an attempt renews it every 60 s, well inside it. A process killed
mid-step (instance reclaimed, OOM, crash) leaves a lease that expires at most 600 s after its
last renewal; the sweep then reclaims it. Both are configurable for tests:
`ONCEFLOW_STEP_LEASE_SECONDS`, `ONCEFLOW_STEP_HEARTBEAT_SECONDS`.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from shared.core import queries
from shared.core.crashpoints import crash_point
from shared.core.db import Database
from shared.core.errors import TransientError
from shared.core.logs import get_logger
from shared.core.settings import DEFAULTS, settings_from
from shared.steps.journal import idempotency_key
from shared.workflows.scope import Occurrence
from shared.workflows.step_keys import final_id, final_key, is_final

SQL = queries.load("steps")
CLAIM = SQL["steps_claim"]
SCOPE_OUTPUTS = SQL["steps_scope_outputs"]
HEARTBEAT = SQL["steps_heartbeat"]
MARK_SIDE_EFFECT = SQL["steps_mark_side_effect_started"]
WITHDRAW_SIDE_EFFECT = SQL["steps_withdraw_side_effect_mark"]

DEFAULT_LEASE_SECONDS = DEFAULTS.step_lease_seconds
DEFAULT_HEARTBEAT_SECONDS = DEFAULTS.step_heartbeat_seconds

log = get_logger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeaseConfig:
        # Settings refuses a heartbeat not below the lease, naming both variables.
        s = settings_from(env)
        return cls(lease_seconds=s.step_lease_seconds, heartbeat_seconds=s.step_heartbeat_seconds)


class StepOfRun(Protocol):
    """What a run's phases (shared/steps/saga.py, finale.py) read of a step that ended: a
    claimed step at its settle, or a step the sweep's reclaim failed (shared/steps/repairs.py),
    which has no lease of its own any more."""

    @property
    def run_id(self) -> str: ...

    @property
    def step_key(self) -> str: ...

    @property
    def lineage_root(self) -> str: ...


@dataclass(frozen=True)
class ClaimedStep:
    """A step this invocation owns until `lease_id` is settled, lost or expires."""

    id: str
    run_id: str
    step_key: str
    node_id: str
    block_type: str
    attempt: int
    lease_id: str
    idempotency_key: str
    side_effect_started_at: datetime | None
    output: Mapping[str, Any] | None
    tenant_id: str
    workflow_id: str
    version_id: str
    lineage_root: str
    namespace: str
    record_key: str | None
    event_id: int | None
    connection_id: str | None
    # The trigger occurrence and the record its rule saw: the step's expression scope
    # (shared/workflows/scope.py). `trigger_record` is None for runs admitted before it was kept.
    # The outputs of other steps are not here: `read_run_outputs` loads those the step reads.
    occurrence: Occurrence
    trigger_record: Mapping[str, Any] | None
    # A person's edit of this step's input, made when replaying from it (shared/ops/replay.py):
    # the block runs on it instead of its rendered config. None for every other step.
    input_override: Mapping[str, Any] | None = None
    # The end the run's main phase decided and the run's error so far, read by its finally
    # steps (`run.final_status`, `run.error`, shared/steps/finale.py); None before that phase.
    final_status: str | None = None
    run_error: str | None = None


@dataclass(frozen=True)
class RunOutputs:
    """What a claimed step reads of its run's other steps (`read_run_outputs`)."""

    # `steps` root: {step key: {"output", "branch_choice"}} of the succeeded steps it reads.
    steps: Mapping[str, Any]
    # An iteration's loop: the foreach's `count`, `concurrency` and this iteration's `item`;
    # None outside a loop (or when the foreach has not succeeded).
    loop: Mapping[str, Any] | None = None


def claim_step(
    db: Database, step_id: str, config: LeaseConfig, *, namespace: str = "live"
) -> ClaimedStep | None:
    """Claim a pending step (invariant 7). None when it isn't claimable: it is running under
    someone's lease, parked, finished, unknown, or its run is no longer running or lives in
    another namespace. All of those mean "ack the message and do nothing"."""
    lease_id = str(uuid.uuid4())
    # One statement is the whole claim (the step, its lease history row): BEGIN, it and
    # COMMIT travel in one round trip.
    with db.transaction() as tx:
        rows = tx.commit_with(
            CLAIM,
            step_id=step_id,
            lease_id=lease_id,
            lease_seconds=config.lease_seconds,
            namespace=namespace,
        )
    if not rows:
        return None
    row = rows[0]
    crash_point("after_claim")
    return ClaimedStep(
        id=row["id"],
        run_id=row["run_id"],
        step_key=row["step_key"],
        node_id=row["node_id"],
        block_type=row["block_type"],
        attempt=int(row["attempt"]),
        lease_id=lease_id,
        # Rows are always inserted with their key; the fallback only guards hand-made rows.
        idempotency_key=row["idempotency_key"]
        or idempotency_key(str(row["lineage_root"]), row["step_key"]),
        side_effect_started_at=row["side_effect_started_at"],
        output=row["output"],
        tenant_id=row["tenant_id"],
        workflow_id=row["workflow_id"],
        version_id=row["version_id"],
        lineage_root=row["lineage_root"],
        namespace=row["namespace"],
        record_key=row["record_key"],
        event_id=row["event_id"],
        connection_id=row["connection_id"],
        occurrence=_occurrence(row),
        trigger_record=row["trigger_record"],
        input_override=row["input_override"],
        final_status=row["final_status"],
        run_error=row["run_error"],
    )


def read_run_outputs(
    db: Database,
    step: ClaimedStep,
    *,
    steps: frozenset[str] | None,
    foreach: str | None = None,
    iteration: int | None = None,
) -> RunOutputs:
    """The outputs `step`'s scope reads, by name (`steps`, from
    shared.workflows.scope.steps_read; None: every succeeded step), and for an iteration
    (`foreach` and its `iteration` index) the loop's facts with only this item — not every
    earlier output, which made a 1,000-item foreach move O(n²) JSON (issue 23, item 16). A
    step that reads nothing costs no round trip.

    A `finally:` step also reads the finally steps before it by their ids (their rows are
    keyed `finally:<id>`; a finally id is never a main step's, validation says so)."""
    if steps is not None and not steps and foreach is None:
        return RunOutputs(steps={})
    final = is_final(step.step_key)
    keys = None if steps is None else sorted(steps)
    if final and keys is not None:
        keys += [final_key(k) for k in keys]
    with db.transaction() as tx:
        row = tx.one(
            SCOPE_OUTPUTS, run_id=step.run_id, step_keys=keys, foreach=foreach, iteration=iteration
        )
    assert row is not None  # one row, always
    outputs: dict[str, Any] = row["steps"] or {}
    if final:
        outputs = {final_id(k) or k: v for k, v in outputs.items()}
    return RunOutputs(steps=outputs, loop=row["loop"])


def _occurrence(row: Mapping[str, Any]) -> Occurrence:
    """The run's trigger occurrence: the event row's facts with the run's copy of its payload.
    A rehearsal of a supplied event has no event row; its payload names the event type."""
    payload = row["trigger_payload"] or {}
    return Occurrence.from_row(
        {
            **row,
            "id": row["event_id"],
            "event_type": row["event_type"] or payload.get("event_type"),
            "payload": payload,
        }
    )


def renew_lease(db: Database, step: ClaimedStep, config: LeaseConfig) -> bool:
    """Extend the lease; False when it is gone (the holder must stop and not settle)."""
    with db.transaction() as tx:  # one statement, committed with it: one round trip
        rows = tx.commit_with(
            HEARTBEAT, step_id=step.id, lease_id=step.lease_id, lease_seconds=config.lease_seconds
        )
    return len(rows) == 1


def mark_side_effect_started(db: Database, step: ClaimedStep) -> bool:
    """Set `side_effect_started_at` where still null, committed before returning (invariant
    10). False: an earlier attempt already got this far (outcome unknown), or the lease is gone;
    either way the at-most-once call must not be made."""
    with db.transaction() as tx:  # one statement, committed with it: one round trip
        n = len(tx.commit_with(MARK_SIDE_EFFECT, step_id=step.id, lease_id=step.lease_id))
    if n == 1:
        crash_point("after_side_effect_mark")
    return n == 1


def withdraw_side_effect_mark(db: Database, step: ClaimedStep) -> bool:
    """Clear the marker again, fenced on the lease, when the port proved the request never
    applied. False: not withdrawn (a retry will then fail OUTCOME_UNKNOWN, which is safe)."""
    with db.transaction() as tx:  # one statement, committed with it: one round trip
        n = len(tx.commit_with(WITHDRAW_SIDE_EFFECT, step_id=step.id, lease_id=step.lease_id))
    return n == 1


class Heartbeat:
    """Renews a claimed step's lease in the background while its block runs, so a block
    that never calls `ctx.heartbeat()` still keeps its lease; `lost` is set once a renewal
    finds the lease gone, and the attempt then must not settle.

    The renewals come from one keeper thread per process (`_LeaseKeeper`), not a thread per
    step: entering and leaving is a dict update under a lock, so a block that ends before its
    first beat is due (nearly every one) costs no thread start, no join and no round trip —
    starting and joining a thread per step was a fifth of a short step's time on a busy
    machine (issue 19)."""

    def __init__(self, db: Database, step: ClaimedStep, config: LeaseConfig) -> None:
        self._db = db
        self._step = step
        self.interval = config.heartbeat_seconds
        self._config = config
        self.lost = threading.Event()

    def beat(self) -> bool:
        """Renew now. A database hiccup is not a lost lease: report it as still held and let
        the next beat (or the fenced settle) find out."""
        if self.lost.is_set():
            return False
        try:
            held = renew_lease(self._db, self._step, self._config)
        except TransientError as exc:
            log.warning("heartbeat failed, will retry: %s", exc)
            return True
        if not held:
            self.lost.set()
        return held

    def __enter__(self) -> Heartbeat:
        _keeper.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _keeper.remove(self)


class _LeaseKeeper:
    """The process's one renewal thread: beats every registered `Heartbeat` each time its
    interval has passed, until it is removed or its lease is found lost. Started on first
    use (never at import: a process that runs no step has no such thread). A renewal that
    is under way when its step is removed may still complete: harmless, as every renewal is
    fenced on the lease (after the settle it matches nothing)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[Heartbeat, float] = {}
        # When the keeper wakes next (inf: it waits for a registration), so a registration
        # wakes it only when it is due earlier than that.
        self._wakes_at = math.inf
        self._thread: threading.Thread | None = None

    def add(self, heartbeat: Heartbeat) -> None:
        due = time.monotonic() + heartbeat.interval
        with self._cond:
            self._due[heartbeat] = due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)
                self._thread.start()
            elif due < self._wakes_at:
                self._cond.notify()

    def remove(self, heartbeat: Heartbeat) -> None:
        with self._cond:
            self._due.pop(heartbeat, None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                ready = [hb for hb, due in self._due.items() if due <= now]
                for hb in ready:
                    self._due[hb] = now + hb.interval
                if not ready:
                    self._wakes_at = min(self._due.values(), default=math.inf)
                    self._cond.wait(None if self._wakes_at == math.inf else self._wakes_at - now)
                    self._wakes_at = 0.0  # awake: a registration need not notify
                    continue
            for hb in ready:
                try:
                    held = hb.beat()
                except Exception:  # the keeper must outlive any one renewal's surprise
                    log.exception("lease renewal failed")
                    held = True
                if not held:
                    self.remove(hb)


_keeper = _LeaseKeeper()
