"""Test-only block types (never in the catalog): the step engine's tests pass `lookup` so
these exist in the test process only, next to the catalog's real flow blocks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from shared.blocks.base import BlockContext, BlockFailure, BlockResult, BlockSpec, RetryPolicy
from shared.steps.advance import registry_lookup


class AnyConfig(BaseModel):
    model_config = ConfigDict(extra="allow")


class Recorder:
    """Counts executions per step key, so a test can assert what ran (and how often)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def add(self, ctx: BlockContext) -> None:
        with self._lock:
            self.calls.append((ctx.step_key, ctx.attempt))

    def count(self, step_key: str) -> int:
        return sum(1 for k, _ in self.calls if k == step_key)


def spec(
    name: str,
    execute: Callable[[BlockContext, BaseModel], BlockResult],
    *,
    side_effect: str = "idempotent",
    kind: str = "action",
    retry: RetryPolicy | None = None,
) -> BlockSpec:
    return BlockSpec(
        type_name=name,
        config_model=AnyConfig,
        kind=kind,  # type: ignore[arg-type]
        side_effect=side_effect,  # type: ignore[arg-type]
        price=0,
        retry=retry or RetryPolicy(),
        execute=execute,
    )


def block_lookup(recorder: Recorder, **extra: BlockSpec) -> Callable[[str], BlockSpec]:
    """A lookup with test.noop/test.fail_transient/test.fail_permanent/test.throttled/
    test.amo_lost (at-most-once, raises after marking), plus `extra`, over the catalog."""

    def noop(ctx: BlockContext, config: BaseModel) -> BlockResult:
        recorder.add(ctx)
        return BlockResult(output={"step": ctx.step_key, "attempt": ctx.attempt})

    def fail_transient(ctx: BlockContext, config: BaseModel) -> BlockResult:
        recorder.add(ctx)
        retry_after: Any = getattr(config, "retry_after", None)
        raise BlockFailure(
            "upstream said 503",
            error_class="transient",
            outcome_code="HTTP_503",
            retry_after=retry_after,
        )

    def fail_permanent(ctx: BlockContext, config: BaseModel) -> BlockResult:
        recorder.add(ctx)
        raise BlockFailure("bad request", error_class="permanent", outcome_code="HTTP_400")

    def throttled(ctx: BlockContext, config: BaseModel) -> BlockResult:
        recorder.add(ctx)
        raise BlockFailure(
            "over the connection's window",
            error_class="transient",
            outcome_code="THROTTLED",
            retry_after=30.0,
            consumes_attempt=False,
        )

    def amo_lost(ctx: BlockContext, config: BaseModel) -> BlockResult:
        recorder.add(ctx)
        assert ctx.mark_side_effect_started()
        raise ConnectionResetError("connection reset after the request left")

    specs = {
        s.type_name: s
        for s in (
            spec("test.noop", noop),
            spec("test.fail_transient", fail_transient),
            spec("test.fail_permanent", fail_permanent),
            spec("test.throttled", throttled),
            spec("test.amo_lost", amo_lost, side_effect="at_most_once"),
            spec("test.flow_transient", fail_transient, kind="flow", side_effect="none"),
        )
    }
    specs.update(extra)

    def lookup(type_name: str) -> BlockSpec:
        if type_name in specs:
            return specs[type_name]
        return registry_lookup(type_name)

    return lookup
