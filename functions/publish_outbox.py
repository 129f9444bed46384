"""`publish_outbox` entry point (placeholder until its issue lands)."""

from typing import Any

import functions_framework


@functions_framework.http
def publish_outbox(request: Any) -> tuple[str, int]:
    return ("publish_outbox is not built yet", 501)
