"""The ops API from a terminal or a CI job: one HTTP client that carries both credentials a
deployed `ops` function needs, and turns the API's error model into exceptions.

A deployed `ops` function sits behind Cloud Run's IAM check (roles/run.invoker) *and* checks
its own onceflow token. Both are bearer tokens, and they can't share the `Authorization`
header: Cloud Run reads the Google identity token from `X-Serverless-Authorization` when that
header is present (it then leaves `Authorization` to the application), so

    X-Serverless-Authorization: Bearer <Google identity token>   (IAM, checked by Cloud Run)
    Authorization: Bearer <onceflow ops token>                   (checked by onceflow)

Where they come from: `ONCEFLOW_OPS_URL` (the function's URL), `ONCEFLOW_OPS_TOKEN` (minted with
`onceflow tokens create`; a deployment's first admin token with `onceflow bootstrap`), and
`ONCEFLOW_ID_TOKEN` (for a person: `gcloud auth print-identity-token`; for CI: the workload
identity's ID token with the function URL as audience). Locally there is no IAM in front, so
the identity token is left out. Tokens are never logged or printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from shared.core.settings import settings

URL_ENV = "ONCEFLOW_OPS_URL"
TOKEN_ENV = "ONCEFLOW_OPS_TOKEN"  # noqa: S105 - the name of a variable, not a secret
ID_TOKEN_ENV = "ONCEFLOW_ID_TOKEN"  # noqa: S105 - the name of a variable, not a secret
IAM_HEADER = "X-Serverless-Authorization"


@dataclass
class ApiError(Exception):
    """A non-2xx answer (status 0: the function could not be reached at all)."""

    status: int
    code: str
    message: str
    problems: list[dict[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"{self.message} ({self.code}, HTTP {self.status})" if self.status else self.message
        ]
        lines += [f"  {p.get('location')}: {p.get('problem')}" for p in self.problems]
        return "\n".join(lines)


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str | None
    id_token: str | None = None

    @classmethod
    def from_env(
        cls, url: str | None = None, token: str | None = None, id_token: str | None = None
    ) -> Credentials:
        s = settings()
        base = url or s.ops_url
        if not base:
            raise ApiError(0, "no_url", f"name the ops function: --url or {URL_ENV}")
        return cls(
            url=base.rstrip("/"),
            token=token or s.ops_token,
            id_token=id_token or s.id_token,
        )

    def headers(self) -> dict[str, str]:
        out = {"Accept": "application/json", "User-Agent": "onceflow-cli"}
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        if self.id_token:
            out[IAM_HEADER] = f"Bearer {self.id_token}"
        return out


class OpsClient:
    def __init__(self, credentials: Credentials, *, timeout: float = 60.0) -> None:
        self.credentials = credentials
        self._http = httpx.Client(
            base_url=credentials.url, headers=credentials.headers(), timeout=timeout
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        try:
            response = self._http.request(
                method, path, params=params, json=body if method != "GET" else None
            )
        except httpx.HTTPError as exc:
            raise ApiError(
                0, "unreachable", f"could not reach {self.credentials.url}: {exc}"
            ) from None
        if response.is_success:
            return response.json()
        try:
            err = response.json()
        except ValueError:
            err = {}
        if not isinstance(err, dict) or "code" not in err:
            # Not onceflow's answer: Cloud Run's IAM refusal or a proxy's page.
            hint = ""
            if response.status_code in (401, 403) and not self.credentials.id_token:
                hint = f"; behind IAM, set {ID_TOKEN_ENV} (gcloud auth print-identity-token)"
            err = {"code": "http_error", "message": f"HTTP {response.status_code}{hint}"}
        raise ApiError(
            response.status_code,
            str(err["code"]),
            str(err.get("message", "")),
            err.get("problems") or [],
        )
