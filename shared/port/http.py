"""The request plumbing every vendor port shares: one httpx client per connection, the local
rate-window check (a window the vendor's headers said is spent is refused here, instead of
spending a request on a certain 429), and the 401 refresh-once loop.

What stays in a vendor folder: how its answers are classified, how its auth header and body
look, and how its rate-limit headers read (`LimitReader`) — the plumbing only calls them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from shared.port.interface import PortError, RateLimitState

# Rejected token (or None) in, live token out; raises PortError (shared/providers/connect.py).
TokenSource = Callable[[str | None], str]
# A vendor's reading of one answer's rate-limit headers: what they say, and for how many
# seconds the window they speak of is spent (None: not spent).
LimitReader = Callable[[httpx.Headers], tuple[RateLimitState, float | None]]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def classify_transport_error(exc: httpx.HTTPError) -> PortError:
    """An httpx failure (no answer) as a classified `PortError`: connect errors never left, so
    `connect_failed`; a dropped connection may have been applied, so `connection_reset`."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return PortError(f"could not connect: {exc}", code="connect_failed", transient=True)
    if isinstance(exc, httpx.TimeoutException):
        return PortError(f"timed out: {exc}", code="timeout", transient=True)
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return PortError(f"connection lost: {exc}", code="connection_reset", transient=True)
    return PortError(f"HTTP failure: {exc!r}", code="unknown", transient=False)


class PortHttp:
    """One connection's HTTP path to a vendor. Thread-safe; keeps the last rate-limit state."""

    def __init__(
        self,
        *,
        vendor: str,
        base_url: str,
        headers: Mapping[str, str],
        timeout: float,
        transport: httpx.BaseTransport | None,
        read_limits: LimitReader,
        token_source: TokenSource | None = None,
        live_token: bool = True,
        static_token: str | None = None,
        auth_header: Callable[[str], dict[str, str]] = bearer,
        initial: RateLimitState | None = None,
    ) -> None:
        """`token_source` with `live_token`: every call asks it for the live token (an OAuth
        connection); without `live_token` the client's own headers carry `static_token` and
        the source is asked only after a 401 (it names the refused token)."""
        self.vendor = vendor
        self.rate_limit = initial or RateLimitState()
        self._read_limits = read_limits
        self._token_source = token_source
        self._live = token_source is not None and live_token
        self._static_token = static_token
        self._auth_header = auth_header
        self._spent_until: dict[str, float] = {}
        self._lock = threading.Lock()
        self.client = httpx.Client(
            base_url=base_url,
            headers=dict(headers),
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )

    def close(self) -> None:
        self.client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        windows: Sequence[str] = ("all",),
    ) -> httpx.Response:
        """Send once (twice after a 401 with a token source) and read the limit headers.
        `windows`: the local windows this call counts against; the answer's headers speak of
        the last one (e.g. a search's are the tighter of the token's and search's own)."""
        with self._lock:
            until = max((self._spent_until.get(w, 0.0) for w in windows), default=0.0)
            wait = until - time.monotonic()
        if wait > 0:
            raise PortError(
                f"{self.vendor}'s rate-limit window is spent (from its headers)",
                code="rate_limited",
                transient=True,
                retry_after=wait,
            )
        response, sent = self._send(method, path, json, params)
        if response.status_code == 401 and self._token_source is not None:
            # The token was refused (expired early, or revoked and reissued): refresh once and
            # try once more. A 401 was not applied, so resending a create is safe; a second
            # 401 is final (the vendor classifies it), never a loop.
            token = self._token_source(sent)
            response, _ = self._send(method, path, json, params, token)
        state, spent_seconds = self._read_limits(response.headers)
        with self._lock:
            self.rate_limit = state
            if spent_seconds is not None:
                self._spent_until[windows[-1]] = time.monotonic() + spent_seconds
        return response

    def _send(
        self,
        method: str,
        path: str,
        json: Any,
        params: Mapping[str, str] | None,
        token: str | None = None,
    ) -> tuple[httpx.Response, str | None]:
        headers = None
        if self._live and self._token_source is not None:
            token = token or self._token_source(None)
        if token is not None:
            headers = self._auth_header(token)
        try:
            response = self.client.request(method, path, json=json, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise classify_transport_error(exc) from exc
        return response, token if token is not None else self._static_token
