"""Signature checks per provider. Pure functions: bytes and headers in, a verdict out.

Every comparison of a secret-derived value goes through `hmac.compare_digest` (constant time),
and a verdict names the check that failed so the log can say *which* one — never the secret,
never the expected signature.

- `hubspot` v3: base64(HMAC-SHA256(secret, method + uri + body + timestamp)) in
  `X-HubSpot-Signature-v3`; `X-HubSpot-Request-Timestamp` is in milliseconds and must be
  within 5 minutes of now (older is a replay; more than 5 minutes ahead is refused too).
  v2 (hex SHA-256 of secret + method + uri + body) and v1 (hex SHA-256 of secret + body) carry
  no timestamp, so they are accepted only where the connection opts in.
- `standard` (Standard Webhooks): `webhook-signature` holds space-separated `v1,<base64>`
  values of HMAC-SHA256 over `id.timestamp.body`, keyed by the base64 after `whsec_`;
  `webhook-timestamp` (seconds) within 5 minutes either way.
- `pipedrive`: HTTP Basic credentials equal to the configured `user:password`.
- `hmac` (webhook triggers from any sender with a shared secret): `X-Signature-256:
  sha256=<hex HMAC-SHA256(secret, body)>`, GitHub's format. It carries no timestamp, so a
  captured request can be replayed; a webhook trigger's idempotency key absorbs that.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

TOLERANCE_SECONDS = 300


@dataclass(frozen=True)
class Verdict:
    ok: bool
    check: str  # which check decided: "hubspot_v3", "timestamp_stale", "signature_missing", …

    @staticmethod
    def accept(check: str) -> Verdict:
        return Verdict(True, check)

    @staticmethod
    def refuse(check: str) -> Verdict:
        return Verdict(False, check)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def _same(a: str | bytes, b: str | bytes) -> bool:
    a_bytes = a.encode() if isinstance(a, str) else a
    b_bytes = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(a_bytes, b_bytes)


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
    v3 = _header(headers, "X-HubSpot-Signature-v3")
    if v3 is not None and "v3" in versions:
        stamp = _header(headers, "X-HubSpot-Request-Timestamp")
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
        if _same(expected, v3.strip()):
            return Verdict.accept("hubspot_v3")
        return Verdict.refuse("hubspot_v3_mismatch")
    legacy = _header(headers, "X-HubSpot-Signature")
    version = (_header(headers, "X-HubSpot-Signature-Version") or "v1").strip().lower()
    if legacy is not None and version in ("v1", "v2"):
        if version not in versions:
            return Verdict.refuse(f"hubspot_{version}_not_enabled")
        if version == "v1":
            signed = secret.encode() + body
        else:
            signed = secret.encode() + method.encode() + uri.encode() + body
        if _same(hashlib.sha256(signed).hexdigest(), legacy.strip().lower()):
            return Verdict.accept(f"hubspot_{version}")
        return Verdict.refuse(f"hubspot_{version}_mismatch")
    return Verdict.refuse("signature_missing")


def verify_standard(*, secret: str, body: bytes, headers: Mapping[str, str], now: float) -> Verdict:
    msg_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not msg_id or not signatures:
        return Verdict.refuse("signature_missing")
    if stamp is None:
        return Verdict.refuse("timestamp_missing")
    try:
        seconds = int(stamp.strip())
    except ValueError:
        return Verdict.refuse("timestamp_malformed")
    if abs(now - seconds) > TOLERANCE_SECONDS:
        return Verdict.refuse("timestamp_stale")
    key_text = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(key_text, validate=True)
    except (binascii.Error, ValueError):
        return Verdict.refuse("secret_malformed")
    signed = msg_id.encode() + b"." + stamp.strip().encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    matched = False
    for candidate in signatures.split():
        scheme, _, value = candidate.partition(",")
        # Check every candidate (no early exit) so timing doesn't say which one matched.
        if scheme == "v1" and _same(expected, value):
            matched = True
    return Verdict.accept("standard_v1") if matched else Verdict.refuse("standard_v1_mismatch")


def verify_pipedrive(*, secret: str, headers: Mapping[str, str]) -> Verdict:
    auth = _header(headers, "Authorization")
    if auth is None:
        return Verdict.refuse("credentials_missing")
    scheme, _, encoded = auth.strip().partition(" ")
    if scheme.lower() != "basic":
        return Verdict.refuse("credentials_not_basic")
    try:
        presented = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return Verdict.refuse("credentials_malformed")
    if _same(presented, secret.encode()):
        return Verdict.accept("pipedrive_basic")
    return Verdict.refuse("credentials_mismatch")


def verify_hmac(*, secret: str, body: bytes, headers: Mapping[str, str]) -> Verdict:
    presented = _header(headers, "X-Signature-256")
    if presented is None:
        return Verdict.refuse("signature_missing")
    scheme, _, value = presented.strip().partition("=")
    if scheme != "sha256" or not value:
        return Verdict.refuse("signature_malformed")
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if _same(expected, value.lower()):
        return Verdict.accept("hmac_sha256")
    return Verdict.refuse("hmac_sha256_mismatch")
