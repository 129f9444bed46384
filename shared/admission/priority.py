"""A workflow's `priority` (issue 29, item 4): a CEL expression over the rule scope (`event`,
`trigger`, `record`: it is judged at admission, before the run exists), evaluated once when
its event is admitted, clamped to the range the columns hold (`limit_queue.clamp_priority`,
-10..10) and stored on the run; every step row of the run carries it, and a limit's line
grants the highest first (shared/gates/limit_queue.py). A pairing admission holds back (a
debounce burst or batch, a throttled or keyed-concurrency start) stores the value it was
admitted with, and the run its start creates later carries that; a replay carries its
original's.

A priority is a hint for ordering, never a reason to refuse: no expression, one that fails
(a field the event lacks), or one that gives no number is 0, the default, as a run of a
workflow without `priority` is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from shared.gates.limit_queue import PRIORITY_MAX, PRIORITY_MIN, clamp_priority
from shared.workflows.expressions import (
    CompiledExpression,
    ExpressionError,
    PreparedScope,
    evaluate,
)

DEFAULT = 0


def priority_of(
    expression: CompiledExpression | None, scope: PreparedScope | Mapping[str, Any]
) -> int:
    if expression is None:
        return DEFAULT
    try:
        value = evaluate(expression, scope)
    except ExpressionError:
        return DEFAULT
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return DEFAULT
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return DEFAULT  # a bool, a list, None, NaN: no number
    if math.isinf(value):
        return clamp_priority(PRIORITY_MAX if value > 0 else PRIORITY_MIN)
    return clamp_priority(round(value))
