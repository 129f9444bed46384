"""The fake's OAuth: HubSpot's token endpoint with expiring access tokens.

As HubSpot documents it (https://developers.hubspot.com/docs/api-reference/legacy/
authentication/oauth-tokens/v1/guide): the install redirect carries a one-time `code`; a
form-encoded `POST /oauth/2026-03/token` (`/oauth/v1/token` for a legacy app) exchanges it
(`grant_type=authorization_code`, with the app's `client_id`, `client_secret` and the same
`redirect_uri`) for an access token, a
refresh token and `expires_in` (1800 seconds: access tokens live 30 minutes, per HubSpot's
changelog "Expiration of OAuth access tokens is changing"); `grant_type=refresh_token` gives a
new access token. A code used twice, or a refresh token revoked (the portal uninstalled the
app) answers 400: `BAD_AUTH_CODE`, `BAD_REFRESH_TOKEN` ("missing or unknown refresh token").
An expired access token is a 401 on the CRM API. The 2026-03 answer also names the portal
(`hub_id`) and the granted `scopes`
(https://developers.hubspot.com/changelog/additional-details-returned-when-generating-oauth-access-tokens).

`POST /oauth/2026-03/token/introspect` (form: client_id, client_secret, token) says whether a
token is `active` and, when it is, which portal (`hub_id`) and app it acts for; a legacy app may
still ask `GET /oauth/v1/access-tokens/{token}`.

The user's side: `GET /oauth/authorize` is HubSpot's consent screen, answered at once with the
redirect HubSpot's browser flow ends in (`redirect_uri?code=...&state=...`, or
`?error=access_denied&state=...` with `deny=1`); the account picker is the `portal_id` query
parameter (default: the fake's own portal). Tests and the demo also use `/_admin/oauth/*`:
`authorize` (a code for a portal without the browser), `revoke` (uninstall) and `expire`
(every access token expires now, to see a refresh happen without waiting 30 minutes).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

ACCESS_TOKEN_SECONDS = 1800


class OAuthRefused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = {"status": code, "message": message}

    def body_in(self, style: str) -> dict[str, Any]:
        """The error body: v1's (`status` names the reason) or, with style "category", HubSpot's
        standard error body (`status: "error"`, `category`, the reason in `subCategory`). Which
        one `/oauth/2026-03/token` sends is not documented (docs/vendors/hubspot-2026.md 4.2):
        the client must understand both."""
        if style != "category":
            return self.body
        return {
            "status": "error",
            "message": str(self),
            "correlationId": "fake-" + secrets.token_hex(8),
            "category": "VALIDATION_ERROR" if self.status == 400 else "INVALID_AUTHENTICATION",
            "subCategory": self.code,
        }


@dataclass
class OAuthServer:
    client_id: str = "fake-client-id"
    client_secret: str = "fake-client-secret"  # noqa: S105 - a local fake's default
    access_seconds: float = ACCESS_TOKEN_SECONDS
    app_id: str = "424242"
    scopes: tuple[str, ...] = ("crm.objects.contacts.read", "crm.objects.contacts.write")
    lock: threading.Lock = field(default_factory=threading.Lock)
    # code -> (portal, redirect_uri); refresh token -> portal; access token -> (portal, expiry)
    codes: dict[str, tuple[int, str]] = field(default_factory=dict)
    refresh_tokens: dict[str, int] = field(default_factory=dict)
    access_tokens: dict[str, tuple[int, float]] = field(default_factory=dict)
    refreshes: int = 0

    # --- the user's side (admin) ------------------------------------------------------------
    def authorize(self, portal_id: int, redirect_uri: str) -> str:
        code = "code-" + secrets.token_urlsafe(12)
        with self.lock:
            self.codes[code] = (portal_id, redirect_uri)
        return code

    def consent(self, query: dict[str, list[str]], default_portal: int) -> str:
        """`GET /oauth/authorize`: the user approves (or, with `deny=1`, refuses) at once; the
        Location the browser is sent to. Raises OAuthRefused for a request HubSpot would not
        even redirect (unknown client, no redirect_uri)."""

        def one(name: str) -> str:
            values = query.get(name) or [""]
            return values[-1]

        if one("client_id") != self.client_id:
            raise OAuthRefused(400, "BAD_CLIENT_ID", "unknown client_id")
        redirect_uri = one("redirect_uri")
        if not redirect_uri.startswith(("http://", "https://")):
            raise OAuthRefused(400, "BAD_REDIRECT_URI", "redirect_uri is required")
        back: dict[str, str] = {"state": one("state")} if one("state") else {}
        if one("deny") == "1":
            back = {"error": "access_denied", "error_description": "the user refused", **back}
        else:
            portal = int(one("portal_id") or default_portal)
            back = {"code": self.authorize(portal, redirect_uri), **back}
        separator = "&" if "?" in redirect_uri else "?"
        return redirect_uri + separator + urlencode(back)

    def token_info(self, access_token: str) -> dict[str, Any] | None:
        """`GET /oauth/v1/access-tokens/{token}` for a live token, else None (HubSpot: 404)."""
        with self.lock:
            portal, expires = self.access_tokens.get(access_token, (0, 0.0))
        if time.monotonic() >= expires:
            return None
        return {
            "token": access_token,
            "hub_id": portal,
            "app_id": int(self.app_id),
            "scopes": list(self.scopes),
            "token_type": "access",
            "expires_in": max(int(expires - time.monotonic()), 0),
        }

    def introspect(self, form: dict[str, str]) -> dict[str, Any]:
        """`POST /oauth/2026-03/token/introspect`: the app's own client authenticates the
        question; an unknown, expired or revoked token is `active: false`, not an error
        (HubSpot/hubspot-sdk-python `types/auth/public_access_token_info_response.py`)."""
        if form.get("client_id") != self.client_id or form.get("client_secret") != (
            self.client_secret
        ):
            raise OAuthRefused(401, "BAD_CLIENT_ID", "missing or unknown client id or secret")
        info = self.token_info(form.get("token", ""))
        if info is None:
            return {"active": False}
        return {
            "active": True,
            "token": info["token"],
            "token_use": "access_token",
            "token_type": "bearer",
            "client_id": self.client_id,
            "hub_id": info["hub_id"],
            "app_id": info["app_id"],
            "scopes": info["scopes"],
            "expires_in": info["expires_in"],
        }

    def revoke(self, refresh_token: str) -> bool:
        with self.lock:
            portal = self.refresh_tokens.pop(refresh_token, None)
            if portal is None:
                return False
            for token, (p, _) in list(self.access_tokens.items()):
                if p == portal:
                    del self.access_tokens[token]
            return True

    def expire_all(self) -> int:
        with self.lock:
            for token, (portal, _) in self.access_tokens.items():
                self.access_tokens[token] = (portal, 0.0)
            return len(self.access_tokens)

    # --- the app's side ---------------------------------------------------------------------
    def token(self, form: dict[str, str]) -> dict[str, Any]:
        """`POST /oauth/2026-03/token`; raises OAuthRefused with HubSpot's error shape."""
        if form.get("client_id") != self.client_id or form.get("client_secret") != (
            self.client_secret
        ):
            raise OAuthRefused(400, "BAD_CLIENT_ID", "missing or unknown client id or secret")
        grant = form.get("grant_type")
        with self.lock:
            if grant == "authorization_code":
                found = self.codes.pop(form.get("code", ""), None)
                if found is None:
                    raise OAuthRefused(400, "BAD_AUTH_CODE", "missing or unknown auth code")
                portal, redirect_uri = found
                if form.get("redirect_uri") != redirect_uri:
                    raise OAuthRefused(400, "BAD_REDIRECT_URI", "redirect_uri does not match")
                refresh = "refresh-" + secrets.token_urlsafe(16)
                self.refresh_tokens[refresh] = portal
            elif grant == "refresh_token":
                refresh = form.get("refresh_token", "")
                portal_or_none = self.refresh_tokens.get(refresh)
                if portal_or_none is None:
                    raise OAuthRefused(400, "BAD_REFRESH_TOKEN", "missing or unknown refresh token")
                portal = portal_or_none
                self.refreshes += 1
            else:
                raise OAuthRefused(400, "BAD_GRANT_TYPE", f"unsupported grant_type {grant!r}")
            access = "access-" + secrets.token_urlsafe(16)
            self.access_tokens[access] = (portal, time.monotonic() + self.access_seconds)
        return {
            "token_type": "bearer",
            "access_token": access,
            "refresh_token": refresh,
            "expires_in": int(self.access_seconds),
            "hub_id": portal,
            "scopes": list(self.scopes),
        }

    def portal_of(self, access_token: str) -> tuple[str, int]:
        """("live", portal), ("expired", portal) or ("unknown", 0) for a bearer token."""
        with self.lock:
            found = self.access_tokens.get(access_token)
        if found is None:
            return "unknown", 0
        portal, expires = found
        return ("live" if time.monotonic() < expires else "expired"), portal
