"""HubSpot's webhook signatures.

v3: base64(HMAC-SHA256(secret, method + uri + body + timestamp)) in `X-HubSpot-Signature-v3`;
`X-HubSpot-Request-Timestamp` is in milliseconds and must be within 5 minutes of now (older is a
replay; more than 5 minutes ahead is refused too). v2 (hex SHA-256 of secret + method + uri +
body) and v1 (hex SHA-256 of secret + body) carry no timestamp, so they are accepted only where
the connection opts in. Every comparison of a secret-derived value is constant time, and a
verdict names the check that decided — never the secret, never the expected signature.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from shared.providers.descriptor import TOLERANCE_SECONDS, SignedRequest, Verdict, header, same


def verify_hubspot(  # noqa: PLR0911 - each refusal names its own check
    *,
    secret: str,
    method: str,
    uri: str,
    body: bytes,
    headers: Mapping[str, str],
    now: float,
    versions: tuple[str, ...] = ("v3",),
) -> Verdict:
    v3 = header(headers, "X-HubSpot-Signature-v3")
    if v3 is not None and "v3" in versions:
        stamp = header(headers, "X-HubSpot-Request-Timestamp")
        if stamp is None:
            return Verdict.refuse("timestamp_missing")
        try:
            millis = int(stamp.strip())
        except ValueError:
            return Verdict.refuse("timestamp_malformed")
        if abs(now - millis / 1000.0) > TOLERANCE_SECONDS:
            return Verdict.refuse("timestamp_stale")
        signed = method.encode() + uri.encode() + body + stamp.strip().encode()
        expected = base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest())
        if same(expected, v3.strip()):
            return Verdict.accept("hubspot_v3")
        return Verdict.refuse("hubspot_v3_mismatch")
    legacy = header(headers, "X-HubSpot-Signature")
    version = (header(headers, "X-HubSpot-Signature-Version") or "v1").strip().lower()
    if legacy is not None and version in ("v1", "v2"):
        if version not in versions:
            return Verdict.refuse(f"hubspot_{version}_not_enabled")
        if version == "v1":
            signed = secret.encode() + body
        else:
            signed = secret.encode() + method.encode() + uri.encode() + body
        if same(hashlib.sha256(signed).hexdigest(), legacy.strip().lower()):
            return Verdict.accept(f"hubspot_{version}")
        return Verdict.refuse(f"hubspot_{version}_mismatch")
    return Verdict.refuse("signature_missing")


def verify(secret: str, request: SignedRequest) -> Verdict:
    return verify_hubspot(
        secret=secret,
        method=request.method,
        uri=request.uri,
        body=request.body,
        headers=request.headers,
        now=request.now,
        versions=request.signature_versions,
    )
