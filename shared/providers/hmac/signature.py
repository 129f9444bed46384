"""Webhook triggers from any sender with a shared secret: `X-Signature-256:
sha256=<hex HMAC-SHA256(secret, body)>`, GitHub's format. It carries no timestamp, so a captured
request can be replayed; a webhook trigger's idempotency key absorbs that."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from shared.providers.descriptor import SignedRequest, Verdict, header, same


def verify_hmac(*, secret: str, body: bytes, headers: Mapping[str, str]) -> Verdict:
    presented = header(headers, "X-Signature-256")
    if presented is None:
        return Verdict.refuse("signature_missing")
    scheme, _, value = presented.strip().partition("=")
    if scheme != "sha256" or not value:
        return Verdict.refuse("signature_malformed")
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if same(expected, value.lower()):
        return Verdict.accept("hmac_sha256")
    return Verdict.refuse("hmac_sha256_mismatch")


def verify(secret: str, request: SignedRequest) -> Verdict:
    return verify_hmac(secret=secret, body=request.body, headers=request.headers)
