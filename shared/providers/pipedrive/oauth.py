"""Pipedrive's OAuth (Marketplace apps): the authorize URL, the code exchange, the token's
company and user, and the refresh `Refresher` for shared/accounts/oauth_tokens.py.

From Pipedrive's "OAuth authorization" page
(https://pipedrive.readme.io/docs/marketplace-oauth-authorization; docs/vendors/pipedrive.md
§2.1):
- Authorize: `https://oauth.pipedrive.com/oauth/authorize?client_id&redirect_uri&state`, with
  **no `scope`** (an app's scopes are fixed in Developer Hub,
  https://pipedrive.readme.io/docs/marketplace-scopes-and-permissions-explanations).
- `POST https://oauth.pipedrive.com/oauth/token`, form-encoded, the client authenticated with
  **HTTP Basic** `client_id:client_secret` (HubSpot's adapter puts them in the body):
  `grant_type=authorization_code` with `code` and `redirect_uri`, or
  `grant_type=refresh_token` with `refresh_token`. The answer: `access_token`,
  `refresh_token`, `expires_in` (3599), `api_domain`.
- Refresh tokens: OA says the same one comes back; the status-codes page says one can be
  "already exchanged". Whatever comes back is stored (a missing one keeps the old).
- A 400 "Invalid grant: …" on refresh means the grant is gone (expired after 60 unused days,
  or the app was uninstalled): `RefreshRevoked`
  (https://pipedrive.readme.io/docs/marketplace-oauth-and-api-proxy-status-codes; the JSON
  keys are not confirmed, so the whole body's text is searched).
- The token's company and user: `GET {api_domain}/v1/users/me` (`company_id`, `id`), which
  the `base` scope always allows.

Not done here: `api_domain` can change between refreshes (changelog
"new-parameter-in-oauth-oauthtoken-responses"), and the connection's base URL should follow
it; `Grant` (shared/accounts/oauth_tokens.py) has no place for it yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httpx

from shared.accounts.oauth_tokens import Grant, Refresher
from shared.accounts.token_endpoint import TokenEndpoint
from shared.port.http import classify_transport_error
from shared.port.interface import PortError
from shared.providers.descriptor import TokenAccount
from shared.providers.pipedrive.port import (
    DEFAULT_BASE_URL,
    classify_response,
)

OAUTH_BASE = "https://oauth.pipedrive.com"
AUTHORIZE_URL = f"{OAUTH_BASE}/oauth/authorize"


def token_base(base_url: str | None) -> str:
    """Where the token endpoint is: Pipedrive's OAuth host for a Pipedrive API base (a company
    domain or the generic host), the base itself for anything else (a local fake)."""
    host = urlsplit(base_url or DEFAULT_BASE_URL).hostname or ""
    if host == "pipedrive.com" or host.endswith(".pipedrive.com"):
        return OAUTH_BASE
    return (base_url or OAUTH_BASE).rstrip("/")


def authorize_url(
    *,
    client_id: str,
    redirect_uri: str,
    scopes: Sequence[str],
    state: str,
    base: str | None = None,
) -> str:
    del scopes  # no scope parameter: the app's scopes are fixed in Developer Hub
    query = urlencode(
        {"client_id": client_id, "redirect_uri": redirect_uri, "state": state}, quote_via=quote
    )
    return f"{base or AUTHORIZE_URL}?{query}"


def _invalid_grant(response: httpx.Response) -> bool:
    return response.status_code == 400 and "invalid grant" in response.text.lower().replace(
        "_", " "
    )


def token_endpoint(
    client_id: str,
    client_secret: str,
    base_url: str | None,
    timeout: float,
    transport: httpx.BaseTransport | None,
) -> TokenEndpoint:
    """Pipedrive's token endpoint: the client as HTTP Basic, a 400 "Invalid grant" the only
    reason read (the JSON keys are not confirmed, so the whole body's text is searched)."""
    return TokenEndpoint(
        vendor="Pipedrive",
        url=token_base(base_url) + "/oauth/token",
        client_id=client_id,
        client_secret=client_secret,
        basic_auth=True,
        classify=classify_response,
        refusal=lambda response: "invalid_grant" if _invalid_grant(response) else None,
        revoked=lambda reason: reason == "invalid_grant",
        timeout=timeout,
        transport=transport,
    )


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
    """The first grant of an install. Raises CodeRefused (a 400: the code is spent, expired
    after 5 minutes, or wrong), PortError (Pipedrive unreachable or answering otherwise)."""
    endpoint = token_endpoint(client_id, client_secret, base_url, timeout, transport)
    return endpoint.exchange_code(code, redirect_uri)


def user_me(
    access_token: str,
    *,
    base_url: str | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """`GET /v1/users/me`: the token's user (`id`: the `meta.user_id` of its own changes, §5)
    and `company_id`."""
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/users/me"
    try:
        with httpx.Client(timeout=timeout, trust_env=False, transport=transport) as http:
            response = http.get(url, headers={"Authorization": f"Bearer {access_token}"})
    except httpx.HTTPError as exc:
        raise classify_transport_error(exc) from exc
    if response.status_code >= 300:
        raise classify_response(response)
    data = response.json().get("data")
    if not isinstance(data, dict) or data.get("company_id") is None or data.get("id") is None:
        raise PortError(
            "Pipedrive's users/me answer lacks id/company_id", code="unknown", transient=False
        )
    return data


def token_account(access_token: str, *, base_url: str | None = None) -> TokenAccount:
    """The install flow's account: the Pipedrive company the token acts in."""
    me = user_me(access_token, base_url=base_url)
    return TokenAccount(account_id=str(me["company_id"]), app_id=None)


def pipedrive_refresher(
    *,
    client_id: str,
    client_secret: str,
    base_url: str | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> Refresher:
    return token_endpoint(client_id, client_secret, base_url, timeout, transport).refresh
