"""HubSpot's OAuth endpoints: the authorize URL an install starts at, the code exchange, the
token's portal, and the refresh `Refresher` for shared/accounts/oauth_tokens.py. Paths are the
date-based ones versions.py pins (`OAUTH_VERSION`).

- Authorize: the user's browser is sent to `https://app.hubspot.com/oauth/authorize` with
  `client_id`, `redirect_uri`, `scope` (space-separated) and `state`; HubSpot redirects back
  to `redirect_uri` with `code` and the same `state`, or with `error`
  (https://developers.hubspot.com/docs/api/oauth-quickstart-guide,
  https://developers.hubspot.com/docs/api/working-with-oauth).
- `POST /oauth/2026-03/token`, every parameter in the form-encoded body and none in the query
  (grant_type=authorization_code with client_id, client_secret, the same redirect_uri and the
  code; or grant_type=refresh_token with the refresh_token) answers `access_token`,
  `refresh_token`, `expires_in` (and `hub_id`, `scopes`)
  (https://developers.hubspot.com/docs/api-reference/2026-03/authentication/manage-oauth-tokens,
  https://developers.hubspot.com/changelog/additional-details-returned-when-generating-oauth-access-tokens).
  A used or unknown code, or a revoked or unknown refresh token, is a 400: the v1 endpoint
  named it in `status` (`BAD_AUTH_CODE`, `BAD_REFRESH_TOKEN`); which field the 2026-03 one uses
  is not documented, so `_refusal` reads `status`, `subCategory` and OAuth's own `error`.
- `POST /oauth/2026-03/token/introspect` (form: client_id, client_secret, token) says whether a
  token is `active` and which portal (`hub_id`) and app (`app_id`) it acts for
  (HubSpot/hubspot-sdk-python `types/auth/public_access_token_info_response.py`; it replaces
  `GET /oauth/v1/access-tokens/{token}`).
Other failures are classified like every HubSpot answer (shared/providers/hubspot/port.py).
Tokens and codes are never put in an error message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

import httpx

from shared.accounts.oauth_tokens import Grant, Refresher
from shared.accounts.token_endpoint import TokenEndpoint
from shared.port.http import classify_transport_error
from shared.port.interface import PortError
from shared.providers.descriptor import TokenAccount
from shared.providers.hubspot import versions
from shared.providers.hubspot.port import (
    DEFAULT_BASE_URL,
    classify_response,
)

AUTHORIZE_URL = "https://app.hubspot.com/oauth/authorize"
REVOKED_STATUSES = frozenset({"BAD_REFRESH_TOKEN", "invalid_grant"})
# What a 400 of the token endpoint may name its reason in (see the module's docstring): v1's
# `status`, the standard error body's `subCategory` (its `status` is then just "error"), or
# OAuth's own `error` (RFC 6749 5.2).
_REFUSAL_FIELDS = ("subCategory", "status", "error")


@dataclass(frozen=True)
class TokenInfo:
    hub_id: str
    app_id: str | None


def authorize_url(
    *,
    client_id: str,
    redirect_uri: str,
    scopes: Sequence[str],
    state: str,
    base: str | None = None,
) -> str:
    query = urlencode(
        {
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(scopes),
            "state": state,
        },
        quote_via=quote,
    )
    return f"{base or AUTHORIZE_URL}?{query}"


def token_endpoint(
    client_id: str,
    client_secret: str,
    base_url: str | None,
    timeout: float,
    transport: httpx.BaseTransport | None,
) -> TokenEndpoint:
    """HubSpot's `POST /oauth/{v}/token`: the client in the form, a 400's reason in one of
    `_REFUSAL_FIELDS`."""
    return TokenEndpoint(
        vendor="HubSpot",
        url=(base_url or DEFAULT_BASE_URL).rstrip("/") + versions.oauth_token(),
        client_id=client_id,
        client_secret=client_secret,
        basic_auth=False,
        classify=classify_response,
        refusal=_refusal,
        revoked=lambda reason: reason in REVOKED_STATUSES,
        timeout=timeout,
        transport=transport,
    )


def _refusal(response: httpx.Response) -> str | None:
    """The reason a 400 names: a known revocation word wherever it is, else `status`."""
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    named = [
        str(body[f]) for f in _REFUSAL_FIELDS if isinstance(body.get(f), str) and body[f] != "error"
    ]
    return next((n for n in named if n in REVOKED_STATUSES), named[0] if named else None)


def exchange_code(
    *,
    client_id: str,
    client_secret: str,
    redirect_uri: str,
    code: str,
    base_url: str | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> Grant:
    """The first grant of an install. Raises CodeRefused (a 400: the code is spent or wrong),
    PortError (HubSpot unreachable or answering something else)."""
    endpoint = token_endpoint(client_id, client_secret, base_url, timeout, transport)
    return endpoint.exchange_code(code, redirect_uri)


def token_info(
    access_token: str,
    *,
    client_id: str,
    client_secret: str,
    base_url: str | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> TokenInfo:
    """The portal (and app) a live access token acts for, by introspection."""
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + versions.oauth_introspect()
    form = {
        "client_id": client_id,
        "client_secret": client_secret,
        "token": access_token,
        "token_type_hint": "access_token",
    }
    try:
        with httpx.Client(timeout=timeout, trust_env=False, transport=transport) as client:
            response = client.post(url, data=form)
    except httpx.HTTPError as exc:
        raise classify_transport_error(exc) from exc
    if response.status_code >= 300:
        raise classify_response(response)
    try:
        body = response.json()
        active = body.get("active") is True
        hub_id = str(int(body["hub_id"])) if active else ""
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise PortError(
            "HubSpot's introspection answer lacks hub_id", code="unknown", transient=False
        ) from exc
    if not active:
        raise PortError(
            "HubSpot says the access token is not active", code="unauthorized", transient=False
        )
    app_id = body.get("app_id")
    return TokenInfo(hub_id=hub_id, app_id=None if app_id is None else str(app_id))


def hubspot_refresher(
    *,
    client_id: str,
    client_secret: str,
    base_url: str | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> Refresher:
    return token_endpoint(client_id, client_secret, base_url, timeout, transport).refresh


def token_account(
    access_token: str, *, client_id: str, client_secret: str, base_url: str | None = None
) -> TokenAccount:
    """`token_info` in the install flow's terms: the portal is the account."""
    info = token_info(
        access_token, client_id=client_id, client_secret=client_secret, base_url=base_url
    )
    return TokenAccount(account_id=info.hub_id, app_id=info.app_id)
