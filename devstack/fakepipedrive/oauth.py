"""The fake Pipedrive's OAuth: codes, expiring access tokens and refresh tokens.

As docs/vendors/pipedrive.md §2.1 gathers it from Pipedrive's "OAuth authorization" page
(https://pipedrive.readme.io/docs/marketplace-oauth-authorization):

- The authorization code lives **5 minutes** and is single-use.
- `POST /oauth/token` is form-encoded with the client authenticated by **HTTP Basic**
  `base64(client_id:client_secret)` (credentials in the body "work but are not recommended":
  taken too). `grant_type=authorization_code` (`code`, `redirect_uri`) or
  `grant_type=refresh_token` (`refresh_token`).
- The answer: `access_token`, `token_type` "bearer", `refresh_token`, `scope`, `expires_in`
  (3599) and `api_domain`, the company's base URL, on every exchange and refresh (it can change:
  changelog "new-parameter-in-oauth-oauthtoken-responses"; `/_admin/oauth/api_domain` moves it).
- Access tokens expire after 60 minutes (`access_seconds`), then the API answers 401.
- Refresh: OA step 7 says "The same refresh token will be issued"; the status-codes page says a
  refresh token can be "already exchanged". Not confirmed either way, so both are here:
  `rotate_refresh_tokens` off (default) returns the same one, on issues a new one and
  invalidates the old. A refresh token unused for 60 days (`refresh_seconds`) expires.
- Failures are 400s whose message starts "Invalid grant: …" or "Invalid client: …" (the
  status-codes page, https://pipedrive.readme.io/docs/marketplace-oauth-and-api-proxy-status-codes);
  the JSON keys are not confirmed, so the body carries both `error` and `message`.

Each token is bound to the installing user and the company (the marketplace OAuth API page):
what the API does with it is done as that user (`change_source: api`, `user_id`).
"""

from __future__ import annotations

import base64
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

ACCESS_TOKEN_SECONDS = 3600.0
CODE_SECONDS = 300.0
REFRESH_TOKEN_SECONDS = 60 * 24 * 3600.0


class OAuthRefused(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"success": False, "error": error, "message": message}


@dataclass
class Installed:
    user_id: int
    company_id: int


@dataclass
class OAuthServer:
    client_id: str = "fake-pd-client-id"
    client_secret: str = "fake-pd-client-secret"  # noqa: S105 - a local fake's default
    access_seconds: float = ACCESS_TOKEN_SECONDS
    code_seconds: float = CODE_SECONDS
    refresh_seconds: float = REFRESH_TOKEN_SECONDS
    rotate_refresh_tokens: bool = False
    api_domain: str = ""
    scope: str = "base,deals:full,contacts:full,activities:full,webhooks:full"
    lock: threading.Lock = field(default_factory=threading.Lock)
    # code -> (who, redirect_uri, expiry); refresh token -> (who, expiry);
    # access token -> (who, expiry)
    codes: dict[str, tuple[Installed, str, float]] = field(default_factory=dict)
    refresh_tokens: dict[str, tuple[Installed, float]] = field(default_factory=dict)
    access_tokens: dict[str, tuple[Installed, float]] = field(default_factory=dict)
    refreshes: int = 0

    def authorize(self, who: Installed, redirect_uri: str) -> str:
        code = "pdcode-" + secrets.token_urlsafe(12)
        with self.lock:
            self.codes[code] = (who, redirect_uri, time.monotonic() + self.code_seconds)
        return code

    def consent(self, query: dict[str, list[str]], who: Installed) -> str:
        """`GET /oauth/authorize`: approved at once (or refused with `deny=1`, which Pipedrive
        reports as `error=user_denied`); the Location the browser is sent to. There is no
        `scope` parameter: an app's scopes are fixed in Developer Hub."""

        def one(name: str) -> str:
            return (query.get(name) or [""])[-1]

        if one("client_id") != self.client_id:
            raise OAuthRefused(400, "invalid_client", "Invalid client: client is invalid")
        redirect_uri = one("redirect_uri")
        if not redirect_uri.startswith(("http://", "https://")):
            raise OAuthRefused(400, "invalid_request", "redirect_uri is required")
        back = {"state": one("state")} if one("state") else {}
        if one("deny") == "1":
            back = {"error": "user_denied", **back}
        else:
            back = {"code": self.authorize(who, redirect_uri), **back}
        return f"{redirect_uri}?{urlencode(back)}"

    def _client(self, form: dict[str, str], authorization: str | None) -> None:
        presented = (form.get("client_id"), form.get("client_secret"))
        if authorization and authorization.lower().startswith("basic "):
            try:
                decoded = base64.b64decode(authorization[6:].strip()).decode()
            except ValueError:
                decoded = ""
            user, _, password = decoded.partition(":")
            presented = (user, password)
        if presented != (self.client_id, self.client_secret):
            raise OAuthRefused(401, "invalid_client", "Invalid client: client is invalid")

    def _issue(self, who: Installed, refresh_token: str | None) -> dict[str, Any]:
        """Caller holds the lock."""
        access = "pdat-" + secrets.token_urlsafe(24)
        now = time.monotonic()
        self.access_tokens[access] = (who, now + self.access_seconds)
        if refresh_token is None or self.rotate_refresh_tokens:
            if refresh_token is not None:
                self.refresh_tokens.pop(refresh_token, None)
            refresh_token = "pdrt-" + secrets.token_urlsafe(24)
        self.refresh_tokens[refresh_token] = (who, now + self.refresh_seconds)
        return {
            "access_token": access,
            "token_type": "bearer",
            "refresh_token": refresh_token,
            "scope": self.scope,
            "expires_in": int(self.access_seconds) - 1 if self.access_seconds >= 2 else 1,
            "api_domain": self.api_domain,
        }

    def token(self, form: dict[str, str], authorization: str | None) -> dict[str, Any]:
        self._client(form, authorization)
        grant_type = form.get("grant_type")
        now = time.monotonic()
        with self.lock:
            if grant_type == "authorization_code":
                found = self.codes.pop(form.get("code", ""), None)  # single-use
                if found is None:
                    raise OAuthRefused(
                        400, "invalid_grant", "Invalid grant: authorization code is invalid"
                    )
                who, redirect_uri, expires = found
                if now > expires:
                    raise OAuthRefused(
                        400, "invalid_grant", "Invalid grant: authorization_code has expired"
                    )
                if form.get("redirect_uri") != redirect_uri:
                    raise OAuthRefused(400, "invalid_grant", "Invalid grant: redirect_uri")
                return self._issue(who, None)
            if grant_type == "refresh_token":
                token = form.get("refresh_token", "")
                held = self.refresh_tokens.get(token)
                if held is None or now > held[1]:
                    self.refresh_tokens.pop(token, None)
                    raise OAuthRefused(
                        400, "invalid_grant", "Invalid grant: refresh_token is invalid"
                    )
                self.refreshes += 1
                return self._issue(held[0], token)
        raise OAuthRefused(400, "unsupported_grant_type", f"unsupported grant {grant_type!r}")

    def who(self, access_token: str) -> Installed | None:
        """The user a live access token acts as; None when unknown or expired (a 401)."""
        with self.lock:
            held = self.access_tokens.get(access_token)
        if held is None or time.monotonic() > held[1]:
            return None
        return held[0]

    def expire_access_tokens(self) -> None:
        with self.lock:
            self.access_tokens = {t: (w, 0.0) for t, (w, _) in self.access_tokens.items()}

    def revoke(self) -> None:
        """The app is uninstalled: every token it holds stops working."""
        with self.lock:
            self.refresh_tokens.clear()
            self.access_tokens.clear()
