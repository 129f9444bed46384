"""The contract between the step engine and a block.

The engine (shared/steps) claims a step, builds a `BlockContext`, calls the block's `execute`,
and settles the step from the `BlockResult` it returns or the `BlockFailure` it raises. Blocks
never touch step rows themselves: the context hands them the few journal operations they may
need (heartbeat, the at-most-once marker), already fenced on the step's lease.

The rehearsal answer every side-effecting block gives (`dry_run_result`) lives here too, so it
can't drift apart between blocks. Gates (rate limits, budget, charge) are not the block's
business: a spec *declares* which apply (`gates`) and how to find what they key on (`target`),
and the step executor runs them in one order around the block (shared/gates/catalog.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from ipaddress import IPv4Address, IPv6Address
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from shared.core.errors import ErrorClass
from shared.port.interface import CrmPort
from shared.workflows.definition import Step

if TYPE_CHECKING:  # the driver stays out of the pure modules that import this (outcomes)
    from shared.core.db import Database, Tx

BlockKind = Literal["flow", "action"]
SideEffect = Literal["none", "idempotent", "at_most_once"]


@dataclass(frozen=True)
class RetryPolicy:
    """Action steps retry; flow control never does. Backoff is deterministic (no jitter), so
    the wake time of attempt n is reproducible from the journal."""

    max_attempts: int = 3
    first_backoff_seconds: float = 60.0
    max_backoff_seconds: float = 900.0


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class Target:
    """What a block's gates key on, resolved from its context and config before any gate runs.
    Resolving it may refuse the step (no connection, a forbidden address): such a refusal
    happens before anything is claimed or charged."""

    connection_id: str | None = None
    host: str | None = None
    # The destination's addresses as the address policy checked them: the block connects to
    # exactly these (no second DNS answer that could differ).
    addresses: tuple[IPv4Address | IPv6Address, ...] = ()
    # The connection's port, built while resolving (a CRM block's): the block calls through
    # it instead of reading the connection's row a second time.
    port: CrmPort | None = None


@dataclass(frozen=True)
class BlockContext:
    tenant_id: str
    run_id: str
    step_id: str
    step_key: str
    attempt: int
    # Generated before the step ran and journaled on the step row (invariant 6); stable across
    # retries and replays of the same step in a lineage.
    idempotency_key: str
    # Rendered inputs: trigger payload, record, earlier steps' outputs.
    scope: Mapping[str, Any]
    # Rehearsal runs execute flow control but stop every side effect before it leaves.
    dry_run: bool = False
    connection_id: str | None = None
    # Renew the lease; False means the lease is gone and the block must stop without settling.
    heartbeat: Callable[[], bool] = field(default=lambda: True)
    # Set side_effect_started_at WHERE NULL (committed). False means an earlier attempt got
    # that far: the outcome is unknown and an at-most-once block must not call again.
    mark_side_effect_started: Callable[[], bool] = field(default=lambda: True)
    # Clear that mark again (fenced on the lease) when the port proves the request never
    # applied (refused connection, 429): the retry may then call. False = not withdrawn, and
    # the retry will fail OUTCOME_UNKNOWN, which is safe.
    withdraw_side_effect_mark: Callable[[], bool] = field(default=lambda: False)
    # The definition node being executed (from the run's pinned version): `branch` reads its
    # `branches`/`otherwise` edges here. None for callers that only run action blocks.
    node: Step | None = None
    # What the gates resolved before the block ran (BlockSpec.target); None without gates.
    target: Target | None = None
    # The step's database, its connection pinned to this thread from the claim to the
    # settle (`Database.pinned`): everything the block, its target and its port read or write
    # goes through it (issue 27: one connection per step; nothing below the executor calls
    # `get_database()`, tests/test_step_round_trips.py). None: a caller that runs no block
    # needing the database (a flow block, a unit test of a pure block).
    db: Database | None = None

    def database(self) -> Database:
        """The step's database; a block that needs one and was handed none is a wiring bug."""
        if self.db is None:
            raise RuntimeError("this block needs the step's database and its context has none")
        return self.db


@dataclass(frozen=True)
class BlockResult:
    output: Mapping[str, Any] | None = None
    # For `branch`: the edge it took, journaled for replay.
    branch_choice: str | None = None
    # For `delay`: park the step in waiting_for_delay until then.
    wake_at: datetime | None = None
    # Which successors to create; None means "the node's declared next edges".
    next_nodes: tuple[str, ...] | None = None
    outcome_code: str = "OK"
    # For `wait_for` and `approval`: park the step on a park row until an event, a decision
    # or the deadline resumes it (shared/steps/parks.py).
    park: ParkRequest | None = None
    # For `foreach`: run the body step once per item, `concurrency` at a time
    # (shared/steps/loops.py).
    fan_out: FanOut | None = None


@dataclass(frozen=True)
class FanOut:
    """A foreach's iterations: its body node runs as `<body>[i]` for i < count, at most
    `concurrency` in flight at once; when all succeeded, the foreach's `next` follows."""

    body: str
    count: int
    concurrency: int


@dataclass(frozen=True)
class AwaitedEvent:
    """One event a wait of several (`events`, or a `correlate`d wait) waits for: its name in
    the step's output, its type, its condition, and what correlates it with the run — the
    expression over the incoming event (`on`; "" means the event's own record key) and the
    value it must equal, computed on the run's side when the wait parked (`value`, as text:
    shared/blocks/waits.py correlation_text)."""

    name: str
    event_type: str
    condition: str
    on: str
    value: str


@dataclass(frozen=True)
class ParkRequest:
    """What a block asks to wait for. The engine writes it as a park row and commits it before
    the step parks; whoever resumes the step writes what resumed it into the step's output,
    and the step then settles without running its block again."""

    kind: Literal["event", "approval"]
    deadline: datetime
    # event: fail | continue | goto; approval: reject | proceed.
    on_timeout: str
    timeout_goto: str | None = None
    # An event wait: its type, the record it correlates on, a CEL condition over the incoming
    # event and the waiting run's scope (`scope`, kept with the park as the wait saw it).
    event_type: str | None = None
    record_key: str | None = None
    condition: str | None = None
    scope: Mapping[str, Any] | None = None
    lookback_seconds: float = 0.0
    # A wait of the new form (several events and/or a correlation, shared/steps/awaits.py):
    # `any` resumes on the first awaited event, `all` once each has matched; the single-event
    # fields above are then unused.
    mode: Literal["any", "all"] | None = None
    awaits: tuple[AwaitedEvent, ...] = ()
    # An approval: who may decide and what they are shown.
    approver_role: str | None = None
    approver_users: tuple[str, ...] = ()
    summary: str | None = None
    # Its quorum: approving votes that approve it, rejecting votes that reject it.
    required: int = 1
    reject_quorum: int = 1
    # Where it is delivered (a Slack channel; a signed link mailed to the named users), when
    # the undecided are reminded, and when (and to whom) it escalates.
    slack_channel: str | None = None
    email: bool = False
    remind_at: datetime | None = None
    escalate_at: datetime | None = None
    escalate_role: str | None = None
    escalate_users: tuple[str, ...] = ()


class BlockFailure(Exception):
    """A block's failure, already classified at the port (never a vendor exception)."""

    def __init__(
        self,
        message: str,
        *,
        error_class: ErrorClass,
        outcome_code: str,
        retry_after: float | None = None,
        consumes_attempt: bool = True,
        not_applied: bool = False,
    ) -> None:
        super().__init__(message)
        self.error_class: ErrorClass = error_class
        self.outcome_code = outcome_code
        self.retry_after = retry_after
        # Throttling parks a step without using up an attempt.
        self.consumes_attempt = consumes_attempt
        # The request provably never took effect (refused before it left, refused connection,
        # 429, a 4xx the port classifies as not applied): its charge is refunded and its
        # budget reservation released. False means applied or unknown.
        self.not_applied = not_applied


Execute = Callable[[BlockContext, BaseModel], BlockResult]


class Gate(StrEnum):
    """The gates a block may declare (`BlockSpec.gates`): what the executor checks before its
    side effect leaves. Each name is one module of shared/gates/catalog.py, which runs them in
    its own order (a rehearsal runs none)."""

    # A slot in the connection's window (limit on the connection row).
    CONNECTION_LIMIT = "connection_limit"
    # A slot in the workflow's window (`rate_limit` in the definition).
    WORKFLOW_LIMIT = "workflow_limit"
    # A slot in the destination host's window (`host_rate_limit` in the definition).
    HOST_LIMIT = "host_limit"
    # A reservation of the block's price against the workflow's `budget` (shared/gates/budgets.py).
    BUDGET = "budget"
    # The block's price, charged once per lineage key.
    CHARGE = "charge"


# Every gate a side-effecting provider call goes through.
PROVIDER_GATES = frozenset({Gate.CONNECTION_LIMIT, Gate.WORKFLOW_LIMIT, Gate.BUDGET, Gate.CHARGE})


ResolveTarget = Callable[[BlockContext, BaseModel], Target]


@dataclass(frozen=True)
class LandedQuery:
    """How to ask the provider, later, whether an attempt's write landed: is there a record of
    `object_type` whose unique-value `property` holds `value` (through `connection_id`'s
    port)? Answerable only where the provider refuses a second record with the same value, so
    one search says landed or never landed."""

    connection_id: str
    object_type: str
    property: str
    value: str


ResolveLanded = Callable[[BlockContext, BaseModel, Target], LandedQuery | None]


@dataclass(frozen=True)
class TokenPrice:
    """The part of a block's price that depends on the tokens its call uses: `per_1k_tokens`
    credits per thousand tokens (rounded up), on top of the spec's `price`. Before the call the
    gates take it at the most the call may use (`cap`, from the rendered config); the settle of
    an attempt that applied lowers the charge and the budget reservation to what it used
    (`used`, from the block's output; None: unknown, the cap stands). Never above the cap."""

    per_1k_tokens: int
    cap: Callable[[BaseModel], int]
    used: Callable[[Mapping[str, Any]], int | None]

    def credits(self, tokens: int) -> int:
        return math.ceil(max(tokens, 0) * self.per_1k_tokens / 1000)


BeforeCall = Callable[["Tx", BlockContext, BaseModel, Target], None]


@dataclass(frozen=True)
class BlockSpec:
    type_name: str
    config_model: type[BaseModel]
    kind: BlockKind
    side_effect: SideEffect
    price: int
    retry: RetryPolicy
    execute: Execute
    # True for blocks that create records at a provider: they must be at_most_once.
    creates: bool = False
    # An at_most_once block that reads its own mark (`mark_side_effect_started` answering
    # False) and either makes the retry safe (crm.create with a unique-value key property:
    # the provider refuses a second record and names the first) or refuses it as
    # OUTCOME_UNKNOWN itself. The engine then lets a marked step's retry reach the block
    # instead of refusing it outright.
    decides_ambiguous_retry: bool = False
    description: str = ""
    # What `validate` should warn about in a config that parses but will fail every time it
    # runs: (path inside the config, message) pairs. Templated values are the block's to skip.
    config_warnings: Callable[[Mapping[str, Any]], list[tuple[tuple[str, ...], str]]] | None = None
    # The gates the executor runs before `execute` (never called by the block itself).
    gates: frozenset[Gate] = frozenset()
    # Resolves what the gates key on; required when a limit gate is declared.
    target: ResolveTarget | None = None
    # How the budget's reconcile duty may ask the provider whether an attempt whose fate stayed
    # unknown landed (shared/gates/budgets.py); None: it can't be asked, and such a reservation is
    # counted spent.
    landed_query: ResolveLanded | None = None
    # What the block must have committed before its request leaves that is not a gate (the
    # echo marker of an update, shared/ingest/echo.py): written by the executor in the gates'
    # transaction, after every gate passed, so it shares their commit instead of paying one
    # of its own (issue 27). Not run for a rehearsal or a refused attempt.
    before_call: BeforeCall | None = None
    # A price that grows with the tokens the call uses (an AI step's); None: `price` is all.
    token_price: TokenPrice | None = None

    @property
    def priced(self) -> bool:
        """Whether a call of this block costs credits (the charge and budget gates apply)."""
        return self.price > 0 or self.token_price is not None

    def price_before(self, config: BaseModel) -> int:
        """What the gates take before the call: the price, at the token cap when it has a
        token part (shared/gates/charge.py, reservation.py)."""
        if self.token_price is None:
            return self.price
        return self.price + self.token_price.credits(self.token_price.cap(config))

    def price_used(self, config: BaseModel, output: Mapping[str, Any] | None) -> int | None:
        """What an attempt that applied costs, from what its output says it used; None when
        the price taken before the call stands (no token part, or usage unknown). Never more
        than `price_before`: the call can't be charged more than was reserved."""
        if self.token_price is None or output is None:
            return None
        used = self.token_price.used(output)
        if used is None:
            return None
        actual = self.price + self.token_price.credits(used)
        return min(actual, self.price_before(config))

    @property
    def max_attempts(self) -> int:
        """How many times a step of this block may be claimed, whatever ended each attempt: a
        retryable failure, or a lease that expired because its process died (the sweep counts
        the same number). An action block's is its retry policy's. A flow block never retries
        a failure (it is deterministic: the same input fails the same way), but it is pure, so
        an attempt lost with its process may run again, up to the default policy's number."""
        if self.kind == "flow":
            return RetryPolicy().max_attempts
        return self.retry.max_attempts


def flow_block(
    type_name: str, config_model: type[BaseModel], execute: Execute, description: str
) -> BlockSpec:
    """A flow-control block: no side effect, free, never retried (the registry checks all
    three). Every flow block is declared through here, so none can get one of them wrong."""
    return BlockSpec(
        type_name=type_name,
        config_model=config_model,
        kind="flow",
        side_effect="none",
        price=0,
        retry=NO_RETRY,
        execute=execute,
        description=description,
    )


def dry_run_result(block_type: str, stand_in: Mapping[str, Any], **would_send: Any) -> BlockResult:
    """What a side-effecting block answers in a rehearsal: the request it would have sent, plus
    `stand_in` — an output shaped like the live one (e.g. a `dry-run:<key>` id for a create) so
    later steps that reference it (`${{ steps.create.output.id }}`) still render."""
    return BlockResult(
        output={**stand_in, "dry_run": True, "block": block_type, "would_send": would_send},
        outcome_code="DRY_RUN",
    )
