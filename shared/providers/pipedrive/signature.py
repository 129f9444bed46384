"""Pipedrive's webhooks carry no signature: HTTP Basic credentials equal to the configured
`user:password` are the only credential on the request."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from shared.providers.descriptor import SignedRequest, Verdict, header, same


def verify_pipedrive(*, secret: str, headers: Mapping[str, str]) -> Verdict:
    auth = header(headers, "Authorization")
    if auth is None:
        return Verdict.refuse("credentials_missing")
    scheme, _, encoded = auth.strip().partition(" ")
    if scheme.lower() != "basic":
        return Verdict.refuse("credentials_not_basic")
    try:
        presented = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return Verdict.refuse("credentials_malformed")
    if same(presented, secret.encode()):
        return Verdict.accept("pipedrive_basic")
    return Verdict.refuse("credentials_mismatch")


def verify(secret: str, request: SignedRequest) -> Verdict:
    return verify_pipedrive(secret=secret, headers=request.headers)
