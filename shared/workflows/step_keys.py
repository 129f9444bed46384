"""The journal keys of a run's compensations and `finally:` steps: pure, so replay planning
(shared/ops/replay_plan.py) reads them without importing the database layer."""

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


# The journal key of a `finally:` step (shared/steps/finale.py): `finally:<step id>`, its
# idempotency key then `onceflow:<lineage root>:finally:<step id>`, its own.
FINAL_PREFIX = "finally:"


def final_key(step_id: str) -> str:
    return FINAL_PREFIX + step_id


def is_final(key: str) -> bool:
    """Whether a row is one of the run's `finally:` steps."""
    return key.startswith(FINAL_PREFIX)


def final_id(key: str) -> str | None:
    """The id of the `finally:` step a row is; None for any other row."""
    return key[len(FINAL_PREFIX) :] if is_final(key) else None
