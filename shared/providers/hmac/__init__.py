"""A shared HMAC secret (GitHub's `X-Signature-256` format), declared as one `Provider`: it
signs requests to webhook triggers only, so it has no events of its own to normalize."""

from __future__ import annotations

from shared.providers.descriptor import Provider
from shared.providers.hmac import signature

PROVIDER = Provider(
    name="hmac",
    title="HMAC",
    verify=signature.verify,
    # Senders retry as they choose, commonly within a day or two: three days.
    redelivery_horizon_seconds=72 * 3600,
    hidden_headers=("x-signature-256",),
    generic=True,
)
