"""`ops` entry point (placeholder until its issue lands)."""

from typing import Any

import functions_framework


@functions_framework.http
def ops(request: Any) -> tuple[str, int]:
    return ("ops is not built yet", 501)
