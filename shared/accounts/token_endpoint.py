"""An OAuth token endpoint (RFC 6749 §4.1.3 code exchange, §6 refresh): the one place a form is
posted to it, its answer read as a `Grant`, a refused code raised as `CodeRefused` and a gone
grant as `RefreshRevoked`.

What stays in a vendor folder (shared/providers/<vendor>/oauth.py): the endpoint's URL, how the
client authenticates (HTTP Basic, or `client_id`/`client_secret` in the form), how a non-2xx
answer is classified and where a 400 names its reason, and which reasons mean the grant is
gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from shared.accounts.oauth_tokens import Grant, RefreshRevoked
from shared.port.http import classify_transport_error
from shared.port.interface import PortError


class CodeRefused(Exception):
    """The provider refused to exchange an install's code (used twice, expired, …)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class TokenEndpoint:
    vendor: str  # for messages: "HubSpot's token answer lacks …"
    url: str
    client_id: str
    client_secret: str
    basic_auth: bool  # the client as HTTP Basic (RFC 6749 §2.3.1), else in the form
    classify: Callable[[httpx.Response], PortError]  # a non-2xx answer
    refusal: Callable[[httpx.Response], str | None]  # the reason a 400 names
    revoked: Callable[[str | None], bool]  # a refresh 400's reason: the grant is gone
    timeout: float = 10.0
    transport: httpx.BaseTransport | None = None

    def post(self, form: dict[str, str]) -> tuple[httpx.Response, str | None]:
        """The endpoint's answer to `form`, and its reason when it is a 400."""
        client_id, secret = self.client_id, self.client_secret
        if not self.basic_auth:
            form = {**form, "client_id": client_id, "client_secret": secret}
        try:
            with httpx.Client(
                timeout=self.timeout, trust_env=False, transport=self.transport
            ) as client:
                if self.basic_auth:
                    response = client.post(self.url, data=form, auth=(client_id, secret))
                else:
                    response = client.post(self.url, data=form)
        except httpx.HTTPError as exc:
            raise classify_transport_error(exc) from exc
        return response, self.refusal(response) if response.status_code == 400 else None

    def grant(self, response: httpx.Response, refresh_token: str | None = None) -> Grant:
        """A 2xx answer as a `Grant`; a refresh answer without a refresh token keeps the old
        one (whatever comes back is stored)."""
        if response.status_code >= 300:
            raise self.classify(response)
        try:
            body: Any = response.json()
            return Grant(
                access_token=str(body["access_token"]),
                refresh_token=str(body.get("refresh_token") or refresh_token or ""),
                expires_in=int(body["expires_in"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PortError(
                f"{self.vendor}'s token answer lacks access_token/expires_in",
                code="unknown",
                transient=False,
            ) from exc

    def exchange_code(self, code: str, redirect_uri: str) -> Grant:
        """The first grant of an install. Raises CodeRefused (a 400: the code is spent,
        expired or wrong), PortError (unreachable, or answering otherwise)."""
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
        response, reason = self.post(form)
        if response.status_code == 400:
            raise CodeRefused(reason or "BAD_REQUEST")
        grant = self.grant(response)
        if not grant.refresh_token:
            raise PortError(
                f"{self.vendor}'s token answer lacks refresh_token", code="unknown", transient=False
            )
        return grant

    def refresh(self, refresh_token: str) -> Grant:
        """A new access token for `refresh_token`. Raises RefreshRevoked when the vendor says
        the grant is gone (reauthorization needed), PortError otherwise."""
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        response, reason = self.post(form)
        if response.status_code == 400 and self.revoked(reason):
            raise RefreshRevoked(str(reason))
        return self.grant(response, refresh_token)
