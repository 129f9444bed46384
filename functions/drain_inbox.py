"""`drain_inbox` entry point (placeholder until its issue lands)."""

from typing import Any

import functions_framework


@functions_framework.http
def drain_inbox(request: Any) -> tuple[str, int]:
    return ("drain_inbox is not built yet", 501)
