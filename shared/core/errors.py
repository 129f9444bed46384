"""onceflow's own error classes, and the one place driver errors are translated into them.

Callers never catch a pg8000 exception: `shared.core.db` turns every driver error into one of these
by SQLSTATE, so retry decisions are made on onceflow's vocabulary, not a driver's.
"""

from __future__ import annotations

from typing import Literal

# How a failure is retried: transient ones wait and try again (a step's retry policy, the
# queue's redelivery); permanent ones fail at once.
ErrorClass = Literal["transient", "permanent"]


class OnceflowError(Exception):
    """Base class. `code` is a stable, machine-readable name; the message is for people."""

    code = "error"


class TransientError(OnceflowError):
    """Worth retrying as-is: the same call may well succeed later (lock, deadlock, network)."""

    code = "transient"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConflictError(OnceflowError):
    """A constraint said no (unique or exclusion violation): the row already exists."""

    code = "conflict"

    def __init__(self, message: str, *, constraint: str | None = None) -> None:
        super().__init__(message)
        self.constraint = constraint


class PermanentError(OnceflowError):
    """Retrying the same input cannot help (bad data, missing object, programming error)."""

    code = "permanent"


# SQLSTATEs that mean "try again": serialization failure, deadlock, lock not available,
# statement/lock timeout, admin shutdown/crash/cannot-connect-now, too many connections.
_TRANSIENT_SQLSTATES = frozenset(
    {"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300", "53400", "25P03"}
)
_TRANSIENT_CLASSES = frozenset({"08"})  # connection exceptions
_CONFLICT_SQLSTATES = frozenset({"23505", "23P01"})


def classify_sqlstate(sqlstate: str | None) -> type[OnceflowError]:
    """Map a SQLSTATE to the onceflow error class a caller should see."""
    if sqlstate is None:
        return TransientError  # no server answer at all: the connection broke
    if sqlstate in _TRANSIENT_SQLSTATES or sqlstate[:2] in _TRANSIENT_CLASSES:
        return TransientError
    if sqlstate in _CONFLICT_SQLSTATES:
        return ConflictError
    return PermanentError


# HTTP statuses below 500 that are still worth retrying: timeout, too early, rate limited.
_TRANSIENT_HTTP = frozenset({408, 425, 429})


def classify_status(status_code: int) -> ErrorClass:
    """An HTTP status as a failure class, the one rule (DESIGN §4): 5xx, 408, 425 and 429 are
    worth retrying, every other failure is permanent. The HTTP block calls it; a provider's
    port may add its own busy statuses (tests/test_outcomes.py holds the port to the rule)."""
    if status_code >= 500 or status_code in _TRANSIENT_HTTP:
        return "transient"
    return "permanent"
