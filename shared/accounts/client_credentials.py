"""Client-credentials tokens: an app authenticating as itself (no portal, no refresh token),
cached per process and fetched again before they expire.

HubSpot's webhooks journal takes such a token (`grant_type=client_credentials` at
`POST /oauth/2026-03/token`, docs/vendors/hubspot-2026.md section 2.2). The grant has no refresh
token: "refreshing" is asking again. The lifetime is whatever `expires_in` says (not documented
for this grant; OAuth access tokens live 30 minutes), and a token is used only while more than
`oauth_tokens.REFRESH_MARGIN_SECONDS` of it is left — the same margin as the connections' OAuth
tokens, so a call never leaves with a token about to expire. A token the provider rejected (401)
is dropped at once (`forget`), so the next call fetches a new one.

Kept in memory only, never in the database: a token is cheap to fetch again, an instance asks
once per lifetime, and nothing sealed has to be stored for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from shared.accounts.oauth_tokens import REFRESH_MARGIN_SECONDS


@dataclass(frozen=True)
class ClientToken:
    access_token: str
    expires_in: float  # seconds, as the provider said


Fetch = Callable[[], ClientToken]


class ClientTokenCache:
    """Tokens by key (the app, its token URL and scopes); one fetch at a time per cache."""

    def __init__(
        self,
        *,
        margin_seconds: float = REFRESH_MARGIN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._margin = margin_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[Hashable, tuple[str, float]] = {}
        self.fetches = 0

    def token(self, key: Hashable, fetch: Fetch) -> str:
        """A token with more than the margin left, fetched now if the cached one has less."""
        with self._lock:
            cached = self._tokens.get(key)
            now = self._clock()
            if cached is not None and cached[1] - self._margin > now:
                return cached[0]
            fresh = fetch()
            self.fetches += 1
            self._tokens[key] = (fresh.access_token, now + float(fresh.expires_in))
            return fresh.access_token

    def forget(self, key: Hashable, rejected: str) -> None:
        """The provider refused `rejected`: drop it unless another caller already replaced it."""
        with self._lock:
            cached = self._tokens.get(key)
            if cached is not None and cached[0] == rejected:
                del self._tokens[key]
