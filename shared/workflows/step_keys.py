"""The journal keys of a run's compensations: pure, so replay planning (shared/ops/replay_plan.py)
reads them without importing the database layer."""

from __future__ import annotations

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
