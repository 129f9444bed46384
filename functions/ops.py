"""`ops` entry point: the HTTP request goes to shared.ops.api.app, which answers it whole."""

from typing import Any

import functions_framework

from shared.core.request_body import detached
from shared.ops.api.app import handle_request


@functions_framework.http
def ops(request: Any) -> Any:
    # Detached: a refused request's unread body is never read after the answer.
    return detached(handle_request(request), request)
