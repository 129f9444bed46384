"""HubSpot's OAuth token endpoint, as a `Refresher` for shared/oauth_tokens.py.

`POST /oauth/v1/token` (form-encoded: grant_type=refresh_token, client_id, client_secret,
refresh_token) answers `access_token`, `refresh_token`, `expires_in`; a revoked or unknown
refresh token answers 400 with `"status": "BAD_REFRESH_TOKEN"`
(https://developers.hubspot.com/docs/api-reference/legacy/authentication/oauth-tokens/v1/guide).
Other failures are classified like every HubSpot answer (shared/port/hubspot.py).
"""

from __future__ import annotations

import httpx

from shared.oauth_tokens import Grant, Refresher, RefreshRevoked
from shared.port.hubspot import DEFAULT_BASE_URL, classify_response, classify_transport_error
from shared.port.interface import PortError

REVOKED_STATUSES = frozenset({"BAD_REFRESH_TOKEN", "invalid_grant"})


def hubspot_refresher(
    *,
    client_id: str,
    client_secret: str,
    base_url: str | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> Refresher:
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/oauth/v1/token"

    def refresh(refresh_token: str) -> Grant:
        form = {
            "grant_type": "refresh_token",
            "client_id": client_id,
            "client_secret": client_secret,
            "refresh_token": refresh_token,
        }
        try:
            with httpx.Client(timeout=timeout, trust_env=False, transport=transport) as client:
                response = client.post(url, data=form)
        except httpx.HTTPError as exc:
            raise classify_transport_error(exc) from exc
        if response.status_code == 400:
            try:
                status = response.json().get("status")
            except ValueError:
                status = None
            if status in REVOKED_STATUSES:
                raise RefreshRevoked(str(status))
        if response.status_code >= 300:
            raise classify_response(response)
        body = response.json()
        try:
            return Grant(
                access_token=str(body["access_token"]),
                refresh_token=str(body.get("refresh_token") or refresh_token),
                expires_in=int(body["expires_in"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PortError(
                "HubSpot's token answer lacks access_token/expires_in",
                code="unknown",
                transient=False,
            ) from exc

    return refresh
