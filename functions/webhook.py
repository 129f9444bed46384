"""`webhook` entry point (placeholder until its issue lands)."""

from typing import Any

import functions_framework


@functions_framework.http
def webhook(request: Any) -> tuple[str, int]:
    return ("webhook is not built yet", 501)
