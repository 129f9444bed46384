"""The Jinja environment of every HTML page ops serves, and how a page is rendered.

Templates live in shared/ops/templates and are autoescaped: every value a tenant or a provider
chose is escaped by the template engine, not by hand. The ops page (shared/ops/page.py), the
run picture (shared/ops/graph_svg.py) and the public pages the webhook function serves (signed
approval links, the install callback: shared/ops/install_callback.py) render through this one
environment, so none of them imports another for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from shared.ops import auth

# A step's input or output is shown up to this many bytes of pretty JSON; the API has the rest.
MAX_JSON_SHOWN = 4096
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True)
class ShownJson:
    text: str
    size: int
    omitted: int


def shown_json(value: Any, cap: int = MAX_JSON_SHOWN) -> ShownJson:
    """Pretty JSON cut at `cap` bytes (a step's output can be a whole CRM record list)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    raw = text.encode()
    if len(raw) <= cap:
        return ShownJson(text, len(raw), 0)
    return ShownJson(raw[:cap].decode(errors="ignore") + "\n…", len(raw), len(raw) - cap)


TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.filters["shown_json"] = shown_json


def csrf_value(token: str) -> str:
    return hmac.new(token.encode(), b"onceflow-ops-csrf", hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Notice:
    text: str
    error: bool = False


@dataclass(frozen=True)
class Viewer:
    """Who is looking, for the header and the forms."""

    principal: auth.Principal
    token: str

    @property
    def csrf(self) -> str:
        return csrf_value(self.token)


def render(
    template: str,
    title: str,
    *,
    viewer: Viewer | None = None,
    notices: list[Notice] | None = None,
    status: int = 200,
    **context: Any,
) -> Response:
    html = TEMPLATES.get_template(template).render(
        title=title,
        principal=viewer.principal if viewer else None,
        csrf=viewer.csrf if viewer else "",
        notices=notices or [],
        **context,
    )
    return Response(html, status=status, mimetype="text/html", headers=HEADERS)
