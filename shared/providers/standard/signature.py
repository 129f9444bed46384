"""Standard Webhooks signatures: `webhook-signature` holds space-separated `v1,<base64>` values
of HMAC-SHA256 over `id.timestamp.body`, keyed by the base64 after `whsec_`;
`webhook-timestamp` (seconds) within 5 minutes either way."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

from shared.providers.descriptor import TOLERANCE_SECONDS, SignedRequest, Verdict, header, same


def verify_standard(*, secret: str, body: bytes, headers: Mapping[str, str], now: float) -> Verdict:
    msg_id = header(headers, "webhook-id")
    stamp = header(headers, "webhook-timestamp")
    signatures = header(headers, "webhook-signature")
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
        if scheme == "v1" and same(expected, value):
            matched = True
    return Verdict.accept("standard_v1") if matched else Verdict.refuse("standard_v1_mismatch")


def verify(secret: str, request: SignedRequest) -> Verdict:
    return verify_standard(
        secret=secret, body=request.body, headers=request.headers, now=request.now
    )
