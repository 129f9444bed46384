"""`sweep` entry point (placeholder until its issue lands)."""

from typing import Any

import functions_framework


@functions_framework.http
def sweep(request: Any) -> tuple[str, int]:
    return ("sweep is not built yet", 501)
