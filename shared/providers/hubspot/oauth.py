"""HubSpot's OAuth endpoints: the authorize URL an install starts at, the code exchange, the
token's portal, and the refresh `Refresher` for shared/accounts/oauth_tokens.py.

- Authorize: the user's browser is sent to `https://app.hubspot.com/oauth/authorize` with
  `client_id`, `redirect_uri`, `scope` (space-separated) and `state`; HubSpot redirects back
  to `redirect_uri` with `code` and the same `state`, or with `error`
  (https://developers.hubspot.com/docs/api/oauth-quickstart-guide,
  https://developers.hubspot.com/docs/api/working-with-oauth).
- `POST /oauth/v1/token` (form-encoded: grant_type=authorization_code with client_id,
  client_secret, the same redirect_uri and the code; or grant_type=refresh_token with the
  refresh_token) answers `access_token`, `refresh_token`, `expires_in`; a used or unknown code
  answers 400 `BAD_AUTH_CODE`, a revoked or unknown refresh token 400 `BAD_REFRESH_TOKEN`.
- `GET /oauth/v1/access-tokens/{token}` says which portal (`hub_id`) and app (`app_id`) a token
  acts for (https://developers.hubspot.com/docs/api-reference/legacy/authentication/
  oauth-tokens/v1/guide).
Other failures are classified like every HubSpot answer (shared/providers/hubspot/port.py).
Tokens and codes are never put in an error message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from shared.accounts.oauth_tokens import Grant, Refresher, RefreshRevoked
from shared.port.interface import PortError
from shared.providers.descriptor import CodeRefused, TokenAccount
from shared.providers.hubspot.port import (
    DEFAULT_BASE_URL,
    classify_response,
    classify_transport_error,
)

AUTHORIZE_URL = "https://app.hubspot.com/oauth/authorize"
REVOKED_STATUSES = frozenset({"BAD_REFRESH_TOKEN", "invalid_grant"})


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


def _token_call(
    base_url: str | None,
    form: dict[str, str],
    timeout: float,
    transport: httpx.BaseTransport | None,
) -> tuple[httpx.Response, str | None]:
    """The answer of `POST /oauth/v1/token`, and HubSpot's error `status` when it is a 400."""
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/oauth/v1/token"
    try:
        with httpx.Client(timeout=timeout, trust_env=False, transport=transport) as client:
            response = client.post(url, data=form)
    except httpx.HTTPError as exc:
        raise classify_transport_error(exc) from exc
    status = None
    if response.status_code == 400:
        try:
            body = response.json()
            status = str(body.get("status")) if isinstance(body, dict) else None
        except ValueError:
            status = None
    return response, status


def _grant(response: httpx.Response, refresh_token: str | None = None) -> Grant:
    if response.status_code >= 300:
        raise classify_response(response)
    try:
        body: Any = response.json()
        return Grant(
            access_token=str(body["access_token"]),
            refresh_token=str(body.get("refresh_token") or refresh_token or ""),
            expires_in=int(body["expires_in"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PortError(
            "HubSpot's token answer lacks access_token/expires_in",
            code="unknown",
            transient=False,
        ) from exc


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
    form = {
        "grant_type": "authorization_code",
        "client_id": client_id,
        "client_secret": client_secret,
        "redirect_uri": redirect_uri,
        "code": code,
    }
    response, status = _token_call(base_url, form, timeout, transport)
    if response.status_code == 400:
        raise CodeRefused(status or "BAD_REQUEST")
    grant = _grant(response)
    if not grant.refresh_token:
        raise PortError(
            "HubSpot's token answer lacks refresh_token", code="unknown", transient=False
        )
    return grant


def token_info(
    access_token: str,
    *,
    base_url: str | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> TokenInfo:
    """The portal (and app) an access token acts for."""
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/oauth/v1/access-tokens/"
    try:
        with httpx.Client(timeout=timeout, trust_env=False, transport=transport) as client:
            response = client.get(url + quote(access_token, safe=""))
    except httpx.HTTPError as exc:
        raise classify_transport_error(exc) from exc
    if response.status_code >= 300:
        raise classify_response(response)
    try:
        body = response.json()
        hub_id = str(int(body["hub_id"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise PortError(
            "HubSpot's access-token answer lacks hub_id", code="unknown", transient=False
        ) from exc
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
    def refresh(refresh_token: str) -> Grant:
        form = {
            "grant_type": "refresh_token",
            "client_id": client_id,
            "client_secret": client_secret,
            "refresh_token": refresh_token,
        }
        response, status = _token_call(base_url, form, timeout, transport)
        if status in REVOKED_STATUSES:
            raise RefreshRevoked(str(status))
        return _grant(response, refresh_token)

    return refresh


def token_account(access_token: str, *, base_url: str | None = None) -> TokenAccount:
    """`token_info` in the install flow's terms: the portal is the account."""
    info = token_info(access_token, base_url=base_url)
    return TokenAccount(account_id=info.hub_id, app_id=info.app_id)
