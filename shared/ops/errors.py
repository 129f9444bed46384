"""The ops API's refusals: an HTTP status, a stable machine-readable code, words for people."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.core.errors import OnceflowError


class OpsError(OnceflowError):
    # An OnceflowError so `Database.transaction` passes it through untranslated.

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        problems: Sequence[Any] = (),
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.problems = list(problems)
        self.headers = headers or {}


def not_found(what: str) -> OpsError:
    # The same answer whether the id does not exist or belongs to another tenant.
    return OpsError(404, "not_found", f"no {what} with that id")
