"""http.request: a generic outbound call to a URL a tenant typed in. At-least-once, so it
gives the receiver what it needs to dedupe and verify:

- `Idempotency-Key`: the step's idempotency key, generated and journaled before the request
  leaves (invariant 6), stable across retries and replays of the step.
- `X-Onceflow-Timestamp` + `X-Onceflow-Signature: v1=<hex HMAC-SHA256(secret,
  "<timestamp>.<body>")>` with the tenant's signing secret (the env var named by
  `tenants.signing_secret_env`). A tenant without one configured sends unsigned requests; a
  tenant whose named variable is missing fails the step rather than send unsigned.

The destination goes through `shared.core.netguard`: DNS resolved once, private/loopback/metadata
and their mapped forms refused, the connection pinned to the checked address, no redirects, no
proxies from the environment; the response is capped in size and time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpcore
import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.blocks.base import (
    BlockContext,
    BlockFailure,
    BlockResult,
    BlockSpec,
    Gate,
    RetryPolicy,
    Target,
    dry_run_result,
)
from shared.core import queries
from shared.core.db import Database
from shared.core.errors import classify_status
from shared.core.netguard import (
    ALLOW_LOOPBACK_ENV,
    AddressRefused,
    Destination,
    InvalidDestination,
    IPAddress,
    NetPolicy,
    guarded_client,
    parse_destination,
    static_refusal,
)
from shared.core.settings import named_secret
from shared.workflows.expressions import TEMPLATE

SQL = queries.load("signing")
SIGNING_SECRET_ENV = SQL["tenant_signing_secret_env"]

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024
MAX_RESPONSE_BYTES = 1024 * 1024
SIGNATURE_HEADER = "X-Onceflow-Signature"
TIMESTAMP_HEADER = "X-Onceflow-Timestamp"
# Headers a workflow may not set: they carry onceflow's guarantees or belong to the transport.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "idempotency-key",
        SIGNATURE_HEADER.lower(),
        TIMESTAMP_HEADER.lower(),
    }
)

OUTCOME_SSRF_BLOCKED = "SSRF_BLOCKED"
OUTCOME_INVALID_URL = "INVALID_URL"
OUTCOME_REDIRECT_REFUSED = "REDIRECT_REFUSED"
OUTCOME_RESPONSE_TOO_LARGE = "RESPONSE_TOO_LARGE"
OUTCOME_SIGNING_SECRET_MISSING = "SIGNING_SECRET_MISSING"  # noqa: S105 - an outcome code

# The destination policy. Explicit seam: tests replace it to add a resolver that maps a name
# to a private address; production reads only ONCEFLOW_HTTP_ALLOW_LOOPBACK (off by default).
net_policy: Callable[[], NetPolicy] = NetPolicy.from_env


class HttpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str = Field(min_length=1, max_length=2048)
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = None
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0, le=MAX_TIMEOUT_SECONDS)
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, gt=0, le=MAX_RESPONSE_BYTES)

    @field_validator("headers")
    @classmethod
    def _no_reserved_headers(cls, value: dict[str, str]) -> dict[str, str]:
        taken = sorted(k for k in value if k.lower() in RESERVED_HEADERS)
        if taken:
            raise ValueError(f"headers set by onceflow can't be overridden: {', '.join(taken)}")
        return value


def sign(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"v1={digest.hexdigest()}"


def _invalid(
    message: str, code: str = OUTCOME_INVALID_URL, *, not_applied: bool = True
) -> BlockFailure:
    """A permanent refusal; by default one made before the request left (a redirect or an
    oversized response was answered, so those say `not_applied=False`)."""
    return BlockFailure(
        message, error_class="permanent", outcome_code=code, not_applied=not_applied
    )


def _signing_secret(db: Database, tenant_id: str) -> str | None:
    # One statement, committed with it: one round trip on the step's connection.
    with db.transaction() as tx:
        rows = tx.commit_with(SIGNING_SECRET_ENV, tenant_id=tenant_id)
    env_name = next(iter(rows[0].values())) if rows else None
    if not env_name:
        return None
    secret = named_secret(str(env_name))
    if not secret:
        raise _invalid(
            f"tenant {tenant_id}'s signing secret variable {env_name} is not set",
            OUTCOME_SIGNING_SECRET_MISSING,
        )
    return secret


def _encode_body(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def _decode(content: bytes, content_type: str) -> Any:
    text = content.decode("utf-8", "replace")
    if "json" in content_type:
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _destination(url: str) -> Destination:
    try:
        return parse_destination(url)
    except InvalidDestination as exc:
        raise _invalid(str(exc)) from None


def _checked_addresses(policy: NetPolicy, destination: Destination) -> tuple[IPAddress, ...]:
    """Resolve once and check every address; a refusal here is made before anything left."""
    try:
        return tuple(policy.checked_addresses(destination.host, destination.port))
    except AddressRefused as exc:
        raise _invalid(str(exc), OUTCOME_SSRF_BLOCKED) from exc
    except (httpcore.ConnectError, ValueError) as exc:
        raise BlockFailure(
            f"cannot resolve the destination: {exc}",
            error_class="transient",
            outcome_code="HTTP_CONNECTION_ERROR",
            not_applied=True,
        ) from exc


def destination_target(ctx: BlockContext, config: BaseModel) -> Target:
    """What the gates key on: the destination host, resolved and checked here, before any slot
    or credit is taken, so a destination the address policy refuses costs nothing. The checked
    addresses travel with the target: the block connects to exactly those."""
    assert isinstance(config, HttpConfig)
    destination = _destination(config.url)
    addresses = _checked_addresses(net_policy(), destination)
    return Target(host=destination.host, addresses=addresses)


def execute_request(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, HttpConfig)
    destination = _destination(config.url)
    body = _encode_body(config.body)
    headers = {
        "User-Agent": "onceflow/1",
        **config.headers,
        "Idempotency-Key": ctx.idempotency_key,
    }
    if body and not any(k.lower() == "content-type" for k in config.headers):
        headers["Content-Type"] = (
            "text/plain; charset=utf-8" if isinstance(config.body, str) else "application/json"
        )
    if ctx.dry_run:
        stand_in = {"status": None, "content_type": None, "body": None}
        return dry_run_result(
            "http.request",
            stand_in,
            method=config.method,
            url=config.url,
            headers=sorted([*headers, SIGNATURE_HEADER, TIMESTAMP_HEADER]),
            idempotency_key=ctx.idempotency_key,
            body=body.decode("utf-8", "replace"),
        )
    # Connect to exactly the addresses the gates' target checked before anything was claimed
    # or charged (the guarded backend checks them again, without a second DNS answer that
    # could differ); checked here only when the block runs without its gates.
    policy = net_policy()
    target = ctx.target
    if target is not None and target.host == destination.host and target.addresses:
        addresses = target.addresses
    else:
        addresses = _checked_addresses(policy, destination)
    secret = _signing_secret(ctx.database(), ctx.tenant_id)
    if secret is not None:
        # The timestamp is the send time: a retry is signed afresh, the key stays the same.
        timestamp = str(int(time.time()))
        headers[TIMESTAMP_HEADER] = timestamp
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
    return _send(policy.pinned(destination.host, addresses), config, headers, body)


def _send(
    policy: NetPolicy, config: HttpConfig, headers: dict[str, str], body: bytes
) -> BlockResult:
    deadline = time.monotonic() + config.timeout_seconds
    try:
        with (
            guarded_client(policy, timeout=config.timeout_seconds) as client,
            client.stream(config.method, config.url, headers=headers, content=body) as response,
        ):
            status = response.status_code
            if 300 <= status < 400:
                raise _invalid(
                    f"redirects are refused ({status} to {response.headers.get('location')!r})",
                    OUTCOME_REDIRECT_REFUSED,
                    not_applied=False,
                )
            content = bytearray()
            for chunk in response.iter_bytes():
                content.extend(chunk)
                if len(content) > config.max_response_bytes:
                    raise _invalid(
                        f"response larger than {config.max_response_bytes} bytes",
                        OUTCOME_RESPONSE_TOO_LARGE,
                        not_applied=False,
                    )
                if time.monotonic() > deadline:
                    raise BlockFailure(
                        f"response took longer than {config.timeout_seconds}s",
                        error_class="transient",
                        outcome_code="HTTP_TIMEOUT",
                    )
            content_type = response.headers.get("content-type", "")
            retry_after = response.headers.get("retry-after")
    except AddressRefused as exc:
        raise _invalid(str(exc), OUTCOME_SSRF_BLOCKED) from exc
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise _invalid(f"invalid URL: {exc}") from exc
    except httpx.TimeoutException as exc:
        raise BlockFailure(
            f"timed out: {exc!r}",
            error_class="transient",
            outcome_code="HTTP_TIMEOUT",
            # Only a connect timeout proves nothing was sent.
            not_applied=isinstance(exc, httpx.ConnectTimeout),
        ) from exc
    except httpx.TransportError as exc:
        raise BlockFailure(
            f"connection failed: {exc!r}",
            error_class="transient",
            outcome_code="HTTP_CONNECTION_ERROR",
            # A refused or failed connect never carried the request.
            not_applied=isinstance(exc, httpx.ConnectError),
        ) from exc
    result = {
        "status": status,
        "content_type": content_type,
        "body": _decode(bytes(content), content_type),
    }
    if status >= 400:
        seconds = float(retry_after) if retry_after and retry_after.isdigit() else None
        raise BlockFailure(
            f"{config.method} {config.url} answered {status}",
            error_class=classify_status(status),
            outcome_code=f"HTTP_{status}",
            retry_after=seconds,
            # A 429 is the receiver saying it did not process the request.
            not_applied=status == 429,
        )
    return BlockResult(output=result)


def url_warnings(config: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """A literal URL the address policy refuses whatever DNS answers fails every run with
    SSRF_BLOCKED or INVALID_URL; say so at publish time. A templated URL is only known when
    it runs."""
    url = config.get("url")
    if not isinstance(url, str) or TEMPLATE.search(url):
        return []
    reason = static_refusal(url)
    if reason is None:
        return []
    hint = (
        f" (only with {ALLOW_LOOPBACK_ENV}=1, for local development)"
        if reason.startswith("loopback")
        else ""
    )
    return [(("url",), f"every call to this URL will be refused: {reason}{hint}")]


REQUEST = BlockSpec(
    type_name="http.request",
    config_model=HttpConfig,
    kind="action",
    side_effect="idempotent",
    price=1,
    retry=RetryPolicy(),
    execute=execute_request,
    # No connection to count against: the workflow's and the destination host's windows.
    gates=frozenset({Gate.WORKFLOW_LIMIT, Gate.HOST_LIMIT, Gate.BUDGET, Gate.CHARGE}),
    target=destination_target,
    description="Call an HTTP endpoint (SSRF-guarded, signed, with a stable Idempotency-Key).",
    config_warnings=url_warnings,
)
SPECS = (REQUEST,)
