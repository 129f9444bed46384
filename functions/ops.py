"""`ops` entry point: the HTTP request goes to shared.ops.api, which answers it whole."""

from typing import Any

import functions_framework

from shared.ops.api import handle_request


@functions_framework.http
def ops(request: Any) -> Any:
    return handle_request(request)
