"""The page for people (being built)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Request, Response

if TYPE_CHECKING:
    from shared.ops.api import OpsApi


def handle(api: OpsApi, request: Request) -> Response:
    return Response("not built yet", status=404, mimetype="text/plain")
